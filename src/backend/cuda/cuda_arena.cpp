#include "backend/cuda/cuda_arena.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"

namespace sala::cuda_host {

namespace {
void forget(std::vector<void*>& v, void* p) {
  v.erase(std::remove(v.begin(), v.end(), p), v.end());
}
}  // namespace

DeviceArena::~DeviceArena() {
  for (void* p : device_) cudaFree(p);
  for (void* p : pinned_) cudaFreeHost(p);
}

void* DeviceArena::device(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  device_.push_back(p);
  return p;
}

void* DeviceArena::try_device(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the out-of-memory error
    return nullptr;
  }
  device_.push_back(p);
  return p;
}

void DeviceArena::release(void* p) {
  if (!p || retain_) return;
  CUDA_CHECK(cudaFree(p));
  forget(device_, p);
}

void* DeviceArena::pinned(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, bytes));
  pinned_.push_back(p);
  return p;
}

void DeviceArena::release_pinned(void* p) {
  if (!p || retain_) return;
  CUDA_CHECK(cudaFreeHost(p));
  forget(pinned_, p);
}

}  // namespace sala::cuda_host
