// Device code of the per-token FP8 (e4m3) activation quantization, shared by the quantize
// kernels (cuda_fp8_quant.cu) and the kernels that write FP8 codes of the activation they make
// (the RMSNorm kernels, cuda_norm.cu: issue 17, item 5), so that both give the same codes and
// scales bit for bit. The numbers are core/fp8.h's (the CPU oracle, backend/cpu/cpu_fp8.cpp):
//   s[r]       = amax(|x[r, :]|) / 448 (IEEE division; 1 for an all-zero row),
//   code[r, c] = f32_to_fp8_e4m3(x[r, c] / s[r]) (IEEE division; nearest even, saturating).
// amax is a maximum (fmaxf, NaN ignored as std::max(amax, NaN) does), exact in any order, so a
// kernel may reduce it over any thread layout and still get the scale of the quantize kernels.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace sala::cuda::fp8q {

constexpr float kE4m3Max = 448.f;  // core/fp8.h kFp8E4m3Max

// core/fp8.h's f32_to_fp8_e4m3 (fp8_round_magnitude<3, 7>), the same integer steps: exact on
// every architecture.
__device__ __forceinline__ uint32_t e4m3_portable(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;   // NaN
  if (a == 0x7f800000u) return sign | 0x7eu;  // ±inf saturates
  const int fe = int(a >> 23);
  if (fe == 0) return sign;  // zero or an fp32 subnormal: far below the smallest code
  constexpr int kMan = 3, kBias = 7, kEmin = 1 - kBias;
  const int e = fe - 127;
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  const bool normal = e >= kEmin;
  const int shift = (23 - kMan) + (normal ? 0 : kEmin - e);
  if (shift > 24) return sign;  // below half the smallest subnormal
  uint32_t q = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  const uint32_t m = normal ? (uint32_t(e + kBias - 1) << kMan) + q : q;
  return sign | (m > 0x7eu ? 0x7eu : m);  // saturate to ±448
}

// The hardware conversion where it exists. Non-finite inputs take the portable path, so NaN
// keeps its sign (cvt may return one canonical NaN) and ±inf gives ±448 by definition.
template <bool kPortable>
__device__ __forceinline__ uint32_t e4m3(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (!kPortable && isfinite(f)) {
    unsigned short r;
    // d = {cvt(a), cvt(b)}: a in the upper byte, b (ours) in the lower one.
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.f), "f"(f));
    return r & 0xffu;
  }
#endif
  return e4m3_portable(f);
}

// x / s with IEEE division; a NaN quotient takes x's sign, as on the CPU (x86 division passes
// a NaN operand through with its sign; the GPU returns the canonical positive NaN), so a NaN
// input gives core/fp8.h's code S.1111.111 with x's sign.
__device__ __forceinline__ float div_keep_nan_sign(float x, float s) {
  const float q = __fdiv_rn(x, s);
  return isnan(q) ? copysignf(q, x) : q;
}

// The maximum of v over the block (blockDim.x a multiple of 32, at most 1024), for every
// thread; red: 32 floats of shared memory no other reduction of the kernel uses meanwhile.
__device__ __forceinline__ float block_max(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x / 32) ? red[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

// Eight codes of the eight bf16 of v, divided by s.
template <bool kPortable>
__device__ __forceinline__ uint2 codes8(const uint4& v, float s) {
  const bf16* e = reinterpret_cast<const bf16*>(&v);
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    lo |= e4m3<kPortable>(div_keep_nan_sign(__bfloat162float(e[j]), s)) << (8 * j);
    hi |= e4m3<kPortable>(div_keep_nan_sign(__bfloat162float(e[j + 4]), s)) << (8 * j);
  }
  return make_uint2(lo, hi);
}

__device__ __forceinline__ float amax8(float amax, const uint4& v) {
  const bf16* e = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(__bfloat162float(e[j])));
  return amax;
}

// The scale of a row whose largest magnitude is amax.
__device__ __forceinline__ float row_scale(float amax) {
  return amax > 0.f ? __fdiv_rn(amax, kE4m3Max) : 1.f;
}

// The code of one bf16 value v at scale s.
template <bool kPortable = false>
__device__ __forceinline__ uint8_t code1(float v, float s) {
  return uint8_t(e4m3<kPortable>(div_keep_nan_sign(v, s)));
}

}  // namespace sala::cuda::fp8q
