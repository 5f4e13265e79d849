// Tensor parallelism's CUDA communicators: which one a group gets, and the host helpers both
// share (cuda_comm_host.h).
#include <algorithm>
#include <set>

#include "backend/cuda/cuda_comm.h"
#include "backend/cuda/cuda_comm_host.h"
#include "core/check.h"
#include "core/error.h"

namespace sala {
namespace cuda_host {

CommScratch::~CommScratch() {
  if (!p_) return;
  int caller = 0;
  cudaGetDevice(&caller);
  cudaSetDevice(device_);
  cudaDeviceSynchronize();  // no collective still reads or writes it
  cudaFree(p_);
  cudaSetDevice(caller);
}

void CommScratch::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  SALA_CHECK(p_ == nullptr, "a communicator's scratch reserved twice ({} then {} bytes)", bytes_,
             bytes);
  int caller = 0;
  CUDA_CHECK(cudaGetDevice(&caller));
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaMalloc(&p_, bytes));
  CUDA_CHECK(cudaSetDevice(caller));  // the calling thread stays on its device
  bytes_ = bytes;
}

char* CommScratch::get(size_t bytes) const {
  SALA_CHECK(bytes <= bytes_, "a collective needs {} bytes of scratch; {} reserved", bytes,
             bytes_);
  return p_;
}

void gather_bounds(int64_t W, int n, int64_t* col0) {
  for (int k = 0; k <= n; ++k) col0[k] = gather_col(W, n, k);
}

void copy_parts_into_cols(const void* const* parts, const int64_t* col0, int n,
                          const Tensor& full, cudaStream_t stream) {
  SALA_CHECK(n >= 1 && n <= cuda::kMaxCommRanks && col0[n] == full.cols,
             "{} parts into {} columns", n, full.cols);
  const size_t es = dtype_size(full.dtype);
  for (int k = 0; k < n; ++k) {
    const int64_t w = col0[k + 1] - col0[k];
    if (!parts[k] || w == 0 || full.rows == 0) continue;
    CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(full.data) + size_t(col0[k]) * es,
                                 size_t(full.cols) * es, parts[k], size_t(w) * es, size_t(w) * es,
                                 size_t(full.rows), cudaMemcpyDefault, stream));
  }
}

void ArgmaxHost::reserve(int n, int64_t max_rows) {
  ids.resize(size_t(n) * size_t(max_rows));
  vals.resize(size_t(n) * size_t(max_rows));
}

void ArgmaxHost::fetch(const void* dev_ids, const void* dev_vals, int n, int64_t R,
                       cudaStream_t stream) {
  const size_t count = size_t(n) * size_t(R);
  SALA_CHECK(count <= ids.size(), "argmax of {} rows on {} ranks; {} reserved", R, n,
             ids.size());
  CUDA_CHECK(cudaMemcpyAsync(ids.data(), dev_ids, count * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemcpyAsync(vals.data(), dev_vals, count * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

void combine_argmax(const int32_t* ids, const float* vals, int n, int64_t R, int32_t* out) {
  for (int64_t r = 0; r < R; ++r) {
    int best = 0;
    for (int k = 1; k < n; ++k)
      if (vals[best * R + r] < vals[k * R + r]) best = k;
    out[r] = ids[best * R + r];
  }
}

}  // namespace cuda_host

std::vector<std::unique_ptr<Communicator>> make_cuda_communicators(
    const std::vector<Backend*>& ranks, bool prefer_peer) {
  std::vector<CudaBackend*> cuda;
  std::set<int> devices;
  for (Backend* b : ranks) {
    auto* c = dynamic_cast<CudaBackend*>(b);
    SALA_CHECK(c != nullptr, "a {} backend in a CUDA communicator group", b->name());
    cuda.push_back(c);
    devices.insert(c->cuda_device());
  }
  if (devices.size() == 1 || (prefer_peer && devices.size() == ranks.size()))
    return cuda_host::make_peer_comms(cuda);
  if (devices.size() == ranks.size()) return cuda_host::make_nccl_comms(cuda);
  fail("tensor parallelism over {} ranks on {} GPUs: every rank needs its own GPU (or all one, "
       "as the tests on one GPU run)", ranks.size(), devices.size());
}

}  // namespace sala
