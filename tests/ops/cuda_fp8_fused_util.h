// Helpers of the FP8 activation-codes tests (test_cuda_fp8_fused.cpp: the kernels;
// test_cuda_fp8_hint.cpp: CudaBackend's `next` hint): device buffers, byte comparison, the
// norm producers.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace sala::test {

#define CUDA_OK(call)                                                                             \
  do {                                                                                            \
    const cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

struct Dev {  // device bytes, optionally filled from the host
  void* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t bytes, const void* src = nullptr) : n(bytes) {
    CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    if (src) CUDA_OK(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <typename T>
  T* as(size_t byte_off = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(p) + byte_off);
  }
  std::vector<uint8_t> get(size_t bytes, size_t byte_off = 0) const {
    std::vector<uint8_t> h(bytes);
    CUDA_OK(cudaMemcpy(h.data(), static_cast<char*>(p) + byte_off, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
};

// The index of the first byte where a and b differ (-1: equal; the sizes must match).
inline int64_t first_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  const auto m = std::mismatch(a.begin(), a.end(), b.begin());
  return m.first == a.end() ? -1 : int64_t(m.first - a.begin());
}

inline float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

enum class Producer { kRmsnorm, kResidual, kGate };
inline const char* producer_name(Producer p) {
  return p == Producer::kRmsnorm ? "rmsnorm" : p == Producer::kResidual ? "add_scaled_rmsnorm"
                                                                          : "rmsnorm_mul_sigmoid";
}

}  // namespace sala::test
