// Collectives between the ranks of a tensor-parallel group (issue 24). One Communicator per
// rank; every rank calls the same collectives in the same order (the model's forward is the
// same program on every rank). Tensors are in the rank's backend memory.
//
// Implementations: CpuCommGroup (one thread per rank in one process, host memory, a barrier
// and shared pointers: the CPU backend's TP in CI). An NCCL communicator (one thread per GPU)
// would implement the same interface over device buffers.
#pragma once
#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace sala {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // full[T, Σ C_r] on every rank: rank r's local[T, C_r] at columns [C_0 + .. + C_{r-1}, ..)
  // (ranks' widths may differ). Exact (copies), so a column-sharded tensor gathered is
  // bit-identical to the unsharded one.
  virtual void all_gather_cols(const Tensor& local, Tensor& full) = 0;
  // The same into rank `root`'s full only (other ranks pass any tensor; it is not written).
  virtual void gather_cols(const Tensor& local, Tensor& full, int root) = 0;
  // x = x_0 + x_1 + ... + x_{size-1}, summed in rank order on every rank (fixed bits, the same
  // on every rank and from run to run). fp32 (rounded to bf16 where the group emulates bf16).
  virtual void all_reduce_sum(Tensor& x) = 0;
  // Greedy token of vocab-parallel logits: local[R, Vr] is rank r's vocab slice starting at
  // id vocab_offset; out[R] (on `root` only) = the global argmax, ties to the lowest id (the
  // first maximum, as torch.argmax on the whole row).
  virtual void argmax_rows(const Tensor& local, int64_t vocab_offset, int32_t* out, int root) = 0;
  virtual void barrier() = 0;
};

// An in-process group of `size` ranks over host memory (fp32 tensors of the CPU backend):
// rank r's communicator is comm(r), each used by one thread. The collectives synchronise
// with a barrier; none allocates per call beyond a per-rank scratch vector. round_bf16: the
// CPU backend's bf16 emulation: all_reduce_sum's result rounded to bf16, as an NCCL all-reduce
// of bf16 tensors returns bf16.
class CpuCommGroup {
 public:
  explicit CpuCommGroup(int size, bool round_bf16 = false);
  ~CpuCommGroup();
  std::unique_ptr<Communicator> comm(int rank);
  int size() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace sala
