// DeviceArena: every device (cudaMalloc) and pinned host (cudaMallocHost) allocation of the
// CUDA backend. Weights, caches and workspaces are allocated at start; a workspace that grows
// (a step larger than every earlier one, with a warning) releases its old buffer explicitly.
// Whatever is still held is freed in the destructor, after every other member of the
// backend that refers to it (CudaBackend declares the arena before them).
#pragma once
#include <cstddef>
#include <vector>

namespace sala::cuda_host {

class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Device memory of at least max(bytes, 256) bytes (aborts when out of memory).
  void* device(size_t bytes);
  // Exactly `bytes` of device memory, or nullptr when the device has no room (the caller
  // has a path that needs none).
  void* try_device(size_t bytes);
  void release(void* p);  // frees p (from device / try_device) now, unless retain_released
  void* pinned(size_t bytes);  // page-locked host memory (fast copies to and from the device)
  void release_pinned(void* p);
  // From now on release / release_pinned free nothing before the destructor: cudaFree and
  // cudaFreeHost synchronise the whole device (CudaBackend::share_device_with_ranks).
  void retain_released() { retain_ = true; }

 private:
  std::vector<void*> device_, pinned_;
  bool retain_ = false;
};

}  // namespace sala::cuda_host
