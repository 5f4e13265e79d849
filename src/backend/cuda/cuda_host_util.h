// Small host-side helpers shared by the CUDA backend's .cpp files.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace sala::cuda_host {

inline bool is_bf16(const Tensor& t) { return t.dtype == DType::BF16; }

// Largest power of two (<= 256) dividing the address: cuBLASLt algorithm choice.
inline int ptr_alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (u % uintptr_t(a)) != 0) a /= 2;
  return a;
}

template <typename T>
T* ptr(const Tensor& t) { return static_cast<T*>(t.data); }

}  // namespace sala::cuda_host
