// Host side shared by the CUDA communicators of tensor parallelism (backend/comm.h's
// interface; cuda_comm_group.cpp makes them): the peer group (cuda_comm_peer.cpp) and NCCL
// (cuda_comm_nccl.cpp). Every call of a rank's communicator runs on its rank's thread,
// bound to its backend's GPU, and queues its work on that backend's stream.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/comm.h"
#include "backend/cuda/cuda_backend.h"

namespace sala::cuda_host {

// A device staging buffer of a communicator on its backend's GPU: reserved once
// (Communicator::reserve_scratch), freed with the communicator.
class CommScratch {
 public:
  explicit CommScratch(int device) : device_(device) {}
  ~CommScratch();
  CommScratch(const CommScratch&) = delete;
  CommScratch& operator=(const CommScratch&) = delete;
  void reserve(size_t bytes);
  // The buffer, at least `bytes` long (an invariant: reserve() said how much).
  char* get(size_t bytes) const;

 private:
  int device_;
  char* p_ = nullptr;
  size_t bytes_ = 0;
};

// full[T, W]'s columns from the n ranks' contiguous parts: part k ([T, w_k] at parts[k], null:
// skipped) into columns [c_k, c_k + w_k) with c_k = col0[k], w_k = col0[k + 1] - col0[k]; one
// 2-D copy each on `stream`. Fixed-size arrays (n <= cuda::kMaxCommRanks): no allocation in a
// step.
void copy_parts_into_cols(const void* const* parts, const int64_t* col0, int n,
                          const Tensor& full, cudaStream_t stream);
// The column boundaries of a gather into W columns over n ranks: col0[0 .. n] (gather_col).
void gather_bounds(int64_t W, int n, int64_t* col0);
// The root's half of the vocab-parallel argmax: ids / vals [n, R] (rank-major, host) → out[R];
// ranks hold ascending vocabulary slices, so a later rank wins only with a strictly larger
// value (ties to the lowest id).
void combine_argmax(const int32_t* ids, const float* vals, int n, int64_t R, int32_t* out);
// The root's host copies of every rank's argmax ids and values, sized once at start
// (reserve_scratch) for max_rows rows, so a step allocates nothing; fetch() copies n · R of
// each from the device (ids then values, each rank-major) and waits for them.
struct ArgmaxHost {
  std::vector<int32_t> ids;
  std::vector<float> vals;
  void reserve(int n, int64_t max_rows);
  void fetch(const void* dev_ids, const void* dev_vals, int n, int64_t R, cudaStream_t stream);
};

// Ranks on one GPU, or on GPUs with peer access (sala::Error where two cannot reach each other).
std::vector<std::unique_ptr<Communicator>> make_peer_comms(const std::vector<CudaBackend*>& ranks);
// sala::Error where NCCL cannot be loaded (libnccl.so.2) or the build had no nccl.h.
std::vector<std::unique_ptr<Communicator>> make_nccl_comms(const std::vector<CudaBackend*>& ranks);
// The version of the NCCL library the loader finds (e.g. 22809 for 2.28.9), loading it as
// make_nccl_comms does; the same sala::Error where it cannot. No GPU needed.
int nccl_version();

}  // namespace sala::cuda_host
