// The CUDA backend's one stream (non-blocking: it never waits on the legacy default stream).
// Every kernel, copy, cuBLASLt call and recording of the backend goes to it, so stream order
// is data order. Owned by CudaBackend, declared first so that it is destroyed last.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace sala::cuda_host {

// The GPU of a CudaBackend (BackendOptions::cuda_device) around its construction and
// destruction. Declared first in CudaBackend, so it is made before and destroyed after every
// member that allocates or creates something on the device; the thread's current device is
// left as the caller had it (restore() at the end of the constructor, enter() at the start
// of the destructor). Host code only (no .cu file includes it).
class DeviceSelect {
 public:
  explicit DeviceSelect(int device) : device_(device) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    if (device < 0 || device >= count)
      fail("CUDA device {} does not exist ({} visible)", device, count);
    CUDA_CHECK(cudaGetDevice(&caller_));
    CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceSelect() { cudaSetDevice(caller_); }
  DeviceSelect(const DeviceSelect&) = delete;
  DeviceSelect& operator=(const DeviceSelect&) = delete;
  void restore() const { CUDA_CHECK(cudaSetDevice(caller_)); }
  void enter() {
    cudaGetDevice(&caller_);
    cudaSetDevice(device_);
  }
  void bind() const { CUDA_CHECK(cudaSetDevice(device_)); }
  int device() const { return device_; }

 private:
  int device_;
  int caller_ = 0;
};

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
