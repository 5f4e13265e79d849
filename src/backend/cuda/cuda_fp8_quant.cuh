// Device code of the per-token FP8 (e4m3) activation quantization, shared by the quantize
// kernels (cuda_fp8_quant.cu) and the kernels that write FP8 codes of the activation they make
// (the RMSNorm kernels, cuda_norm.cu: issue 17, item 5), so that both give the same codes and
// scales bit for bit. The numbers are core/fp8.h's (the CPU oracle, backend/cpu/cpu_fp8.cpp):
//   s[r]       = amax(|x[r, :]|) / 448 (IEEE division; 1 for an all-zero row),
//   code[r, c] = f32_to_fp8_e4m3(x[r, c] / s[r]) (IEEE division; nearest even, saturating),
// the quotient taken without a division per element where that gives the same codes
// (core/fp8_quotient.h: every row of bf16 values whose amax is 0 or in [2^-104, FLT_MAX]).
// amax is a maximum (fmaxf, NaN ignored as std::max(amax, NaN) does), exact in any order, so a
// kernel may reduce it over any thread layout and still get the scale of the quantize kernels.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "core/fp8_quotient.h"

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

// The code of a non-finite f by core/fp8.h's definition: NaN keeps its sign (S.1111.111),
// ±inf saturates to ±448 (S.1111.110).
__device__ __forceinline__ uint32_t e4m3_special(float f) {
  return ((__float_as_uint(f) >> 24) & 0x80u) | (isnan(f) ? 0x7fu : 0x7eu);
}

// The hardware conversion where it exists (sm_89+): `cvt.rn.satfinite` of finite values, the
// definition's code of non-finite ones by a select (cvt may return one canonical NaN), no
// branch. launch_fp8_e4m3_selfcheck proves e4m3<false> == e4m3<true> on all 2^32 inputs.
template <bool kPortable>
__device__ __forceinline__ uint32_t e4m3(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (!kPortable) {
    unsigned short r;
    // d = {cvt(a), cvt(b)}: a in the upper byte, b (ours) in the lower one.
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.f), "f"(f));
    return isfinite(f) ? r & 0xffu : e4m3_special(f);
  }
#endif
  return e4m3_portable(f);
}

// The codes of a (low byte) and b (high byte) in one conversion where the hardware has it.
template <bool kPortable>
__device__ __forceinline__ uint32_t e4m3x2(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (!kPortable) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
    const uint32_t lo = isfinite(a) ? r & 0xffu : e4m3_special(a);
    const uint32_t hi = isfinite(b) ? uint32_t(r) >> 8 : e4m3_special(b);
    return lo | hi << 8;
  }
#endif
  return e4m3_portable(a) | e4m3_portable(b) << 8;
}

// A row's scale and what its codes are divided by.
struct RowScale {
  float s;    // amax / 448 (1 for an all-zero row): the scale the row's codes are stored with
  float r;    // RN(1 / s): fp8_quotient's reciprocal
  bool fast;  // fp8_quotient_exact_for(amax): the quotient without a division, the same codes
};

// The scale of a row whose largest magnitude is amax.
__device__ __forceinline__ RowScale row_scale(float amax) {
  const float s = amax > 0.f ? __fdiv_rn(amax, kE4m3Max) : 1.f;
  return RowScale{s, __frcp_rn(s), fp8_quotient_exact_for(amax)};
}

// x / s of a bf16 value x of the row, to the code the IEEE division gives; a NaN quotient takes
// x's sign, as on the CPU (x86 division passes a NaN operand through with its sign; the GPU
// returns the canonical positive NaN), so a NaN input gives core/fp8.h's code S.1111.111 with
// x's sign.
__device__ __forceinline__ float code_quotient(float x, const RowScale& rs) {
  const float q = rs.fast ? fp8_quotient(x, rs.s, rs.r) : __fdiv_rn(x, rs.s);
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

// Eight codes of the eight bf16 of v at the row's scale s.
template <bool kPortable>
__device__ __forceinline__ uint2 codes8(const uint4& v, const RowScale& s) {
  const bf16* e = reinterpret_cast<const bf16*>(&v);
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    w[j] = e4m3x2<kPortable>(code_quotient(__bfloat162float(e[2 * j]), s),
                             code_quotient(__bfloat162float(e[2 * j + 1]), s));
  return make_uint2(w[0] | w[1] << 16, w[2] | w[3] << 16);
}

__device__ __forceinline__ float amax8(float amax, const uint4& v) {
  const bf16* e = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(__bfloat162float(e[j])));
  return amax;
}

// The code of one bf16 value v (as a float) at the row's scale s.
template <bool kPortable = false>
__device__ __forceinline__ uint8_t code1(float v, const RowScale& s) {
  return uint8_t(e4m3<kPortable>(code_quotient(v, s)));
}

}  // namespace sala::cuda::fp8q
