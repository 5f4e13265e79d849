// Collectives between the ranks of a tensor-parallel group (issue 24). One Communicator per
// rank; every rank calls the same collectives in the same order (the model's forward is the
// same program on every rank). Tensors are in the rank's backend memory.
//
// Implementations (make_communicators picks one): CpuCommGroup (one thread per rank in one
// process, host memory, a barrier and shared pointers: the CPU backend's TP in CI); for CUDA
// backends (backend/cuda/cuda_comm_host.h) NCCL where the ranks are on distinct GPUs, and the
// peer group (single kernels meeting on device flags) where they share one GPU, as the tests
// on one GPU do, or on distinct GPUs when asked for.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace sala {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // full[T, n·C] on every rank: rank r's local[T, C] (contiguous) at columns [r·C, (r+1)·C).
  // Exact (copies), so a column-sharded tensor gathered is bit-identical to the unsharded one.
  virtual void all_gather_cols(const Tensor& local, Tensor& full) = 0;
  // Into rank `root`'s full[T, W] only (other ranks pass any tensor; it is not written), with
  // vocab-parallel widths: rank r's local holds columns [gather_col(W, n, r), gather_col(W, n,
  // r + 1)), slices of ceil(W / n) and the last rank the rest.
  virtual void gather_cols(const Tensor& local, Tensor& full, int root) = 0;
  // x = x_0 + x_1 + ... + x_{size-1}, summed in rank order on every rank (fixed bits, the same
  // on every rank and from run to run). fp32 (rounded to bf16 where the group emulates bf16).
  virtual void all_reduce_sum(Tensor& x) = 0;
  // The same sum of an fp32 tensor, never rounded to bf16 (a sum of squares; the CPU's bf16
  // emulation rounds only activations). A device group's fp32 sums are never rounded.
  virtual void all_reduce_sum_f32(Tensor& x) { all_reduce_sum(x); }
  // Greedy token of vocab-parallel logits: local[R, Vr] is rank r's vocab slice starting at
  // id vocab_offset; out[R] (on `root` only) = the global argmax, ties to the lowest id (the
  // first maximum, as torch.argmax on the whole row).
  virtual void argmax_rows(const Tensor& local, int64_t vocab_offset, int32_t* out, int root) = 0;
  virtual void barrier() = 0;
  // The largest tensor (bytes) any later collective writes or sums (with max_rows, the most rows
  // an argmax_rows call has): a device communicator allocates its staging buffer once here,
  // none in the step loop. Host groups need none.
  virtual void reserve_scratch(size_t /*full_bytes*/, int64_t /*max_rows*/) {}
  // Whether the collectives (all but argmax_rows and barrier, which end on the host) can be
  // recorded in a CUDA graph of the rank's stream (NCCL's and the peer group's can).
  virtual bool capturable() const { return false; }
};

// The first column of rank r's slice of W columns over n ranks (r == n: W): slices of
// ceil(W / n), the last rank the rest (gather_cols; the lm_head's vocabulary split).
inline int64_t gather_col(int64_t W, int n, int r) {
  const int64_t c = r * ((W + n - 1) / n);
  return c < W ? c : W;
}

// One communicator per rank of a group whose rank r runs on ranks[r] (backends of one kind):
// the CPU group for CPU backends (rounding where they emulate bf16, "cpu-bf16"), the CUDA ones
// for CUDA backends (prefer_peer: the peer group over distinct GPUs too, not NCCL).
// sala::Error where the kind has none (or NCCL cannot be loaded, or GPUs lack peer access).
std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks,
                                                              bool prefer_peer = false);
#ifdef SALA_HAVE_CUDA
// The CUDA backends' (backend/cuda/cuda_comm_group.cpp): NCCL over distinct GPUs (the peer
// group where prefer_peer), the peer group over one.
std::vector<std::unique_ptr<Communicator>> make_cuda_communicators(
    const std::vector<Backend*>& ranks, bool prefer_peer);
#endif

// An in-process group of `size` ranks over host memory (fp32 tensors of the CPU backend):
// rank r's communicator is comm(r), each used by one thread. The collectives synchronise
// with a barrier; none allocates per call beyond a per-rank scratch vector. round_bf16: the
// CPU backend's bf16 emulation: all_reduce_sum's result rounded to bf16, as an NCCL all-reduce
// of bf16 tensors returns bf16.
class CpuCommGroup {
 public:
  explicit CpuCommGroup(int size, bool round_bf16 = false);
  ~CpuCommGroup();
  // Rank r's communicator (it shares the group's state: it may outlive the group object).
  std::unique_ptr<Communicator> comm(int rank);
  int size() const;

  struct State;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace sala
