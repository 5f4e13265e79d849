// Device helpers of the CUDA backend: bf16 <-> fp32 with the CPU backend's rounding
// (round-to-nearest-even), programmatic dependent launch and warp reductions.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"

namespace sala::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float b2f(bf16 x) { return __bfloat162float(x); }
// Round-to-nearest-even, as PyTorch's .to(bfloat16) and sala::round_bf16.
__device__ __forceinline__ bf16 f2b(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float rb(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Storage-type helpers of the kernels templated on T = bf16 (the bf16 contract) or float (the
// fp32 contract, golden README §4): ld() upcasts exactly, cvt() converts for a store (bf16:
// round-to-nearest-even; float: unchanged) and rnd<T>() is an intermediate rounding point
// (bf16: rb; float: none), so the bf16 instantiation is the original kernel code.
__device__ __forceinline__ float ld(bf16 x) { return b2f(x); }
__device__ __forceinline__ float ld(float x) { return x; }
template <typename T>
__device__ __forceinline__ T cvt(float x);
template <>
__device__ __forceinline__ bf16 cvt<bf16>(float x) { return f2b(x); }
template <>
__device__ __forceinline__ float cvt<float>(float x) { return x; }
template <typename T>
__device__ __forceinline__ float rnd(float x) { return ld(cvt<T>(x)); }

// Programmatic dependent launch (sm_90+; no-ops before). pdl_trigger(): the next kernel of the
// stream, if launched with programmatic stream serialization, may start once every CTA of
// this grid has called it or exited. It only starts early: its pdl_wait() still waits for
// this whole grid, so calling it first thing is always safe. pdl_wait(): blocks until the
// preceding grid has completed and its writes are visible. A kernel launched with that
// attribute must call it in every CTA before reading anything a preceding kernel may write,
// and before writing anything.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// First statement of every kernel launched by launch_pdl. Trigger first (default): the next
// kernel may launch while this one still waits for its predecessor, so a chain of small
// kernels launches back to back and the skinny GEMM after it (cuda_gemv.cu) streams weights
// during the whole chain, not only during the last kernel. Safe because every such kernel
// waits before it touches memory, and its predecessor's completion implies that of every
// earlier kernel (each waited on its own predecessor).
__device__ __forceinline__ void pdl_begin() {
  pdl_trigger();
  pdl_wait();
}

// The 16-byte alignment of vectorised loads and stores.
__host__ __device__ inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace sala::cuda
