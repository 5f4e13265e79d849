// The CUDA backend's one stream (non-blocking: it never waits on the legacy default stream).
// Every kernel, copy, cuBLASLt call and recording of the backend goes to it, so stream order
// is data order. Owned by CudaBackend, declared first so that it is destroyed last.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace sala::cuda_host {

class CudaStream {
 public:
  CudaStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~CudaStream() {
    if (s_) cudaStreamDestroy(s_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace sala::cuda_host
