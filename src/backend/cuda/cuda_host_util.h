// Small host-side helpers shared by the CUDA backend's .cpp files.
#pragma once
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

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

// f(tag) with tag a null T* for the activation storage type: __nv_bfloat16 in bf16 mode,
// float in fp32 mode (the two instantiations of the templated launchers).
template <typename F>
void with_act_type(bool bf16_mode, F&& f) {
  if (bf16_mode)
    f(static_cast<__nv_bfloat16*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}
template <typename Tag>
using tag_t = std::remove_pointer_t<Tag>;

}  // namespace sala::cuda_host
