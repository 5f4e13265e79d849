// Kernel attributes are per device: cudaFuncSetAttribute(MaxDynamicSharedMemorySize) applies to
// the device current when it is called, so a process whose backends run on several GPUs (tensor
// parallelism, one rank per GPU) must set it on each. A process-wide "done" flag set while GPU 0
// was current left GPU 1's launches of > 48 KB shared memory failing (found by reading the code
// before the first two-GPU run, session 32). Host-only (g++ and nvcc); thread-safe, since the
// ranks of one process launch from their own threads.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace sala::cuda {

constexpr int kMaxCudaDevices = 64;

inline int current_cuda_device() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxCudaDevices) {
    std::fprintf(stderr, "%s:%d: CUDA device %d (at most %d devices)\n", __FILE__, __LINE__, dev,
                 kMaxCudaDevices);
    std::abort();
  }
  return dev;
}

// One kernel's dynamic shared-memory opt-in, per device: raise(kernel, bytes) makes sure the
// current device lets `kernel` launch with `bytes` (one cudaGetDevice and an atomic load once
// set). One object per kernel (a function-local static at the launch site).
class SmemOptIn {
 public:
  template <class Kernel>
  void raise(Kernel* kernel, size_t bytes) {
    // No early return at 48 KB: a kernel's static shared memory counts against the same
    // limit, so some launches of <= 48 KB dynamic memory need the opt-in too.
    std::atomic<size_t>& set = set_[size_t(current_cuda_device())];
    if (set.load(std::memory_order_acquire) >= bytes) return;
    const std::lock_guard<std::mutex> lock(mu_);  // no smaller size may overwrite a larger one
    if (set.load(std::memory_order_relaxed) >= bytes) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(bytes)));
    set.store(bytes, std::memory_order_release);
  }

 private:
  std::array<std::atomic<size_t>, kMaxCudaDevices> set_{};
  std::mutex mu_;
};

// f() once per device (the current one when called): attribute set-up of a group of kernels.
class OncePerDevice {
 public:
  template <class F>
  void operator()(F&& f) {
    std::call_once(flags_[size_t(current_cuda_device())], std::forward<F>(f));
  }

 private:
  std::array<std::once_flag, kMaxCudaDevices> flags_;
};

}  // namespace sala::cuda
