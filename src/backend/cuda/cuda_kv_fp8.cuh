// Device side of the FP8 KV cache (backend/kv_cache_dtype.h, the CPU oracle's
// cpu_kv_store.h): the cache element type of each KvFmt, the saturating fp32 -> code
// conversions of core/fp8.h (the same integer steps, so a code written here is the CPU's
// code bit for bit), and the exact code -> fp32 / bf16 conversions the attention kernels use
// in registers.
//
// Codes carry no scale: a stored code is fp8(x / scale) and stands for fp8_to_f32(code) ·
// scale. The attention kernels feed the code values themselves (exact in bf16: e4m3 and e5m2
// are subsets of bf16, subnormals included) to the bf16 tensor cores and apply the layer's
// K scale to the scores and its V scale to the output (one multiply each), which is the CPU's
// arithmetic up to fp32 rounding order.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace sala::cuda {

// core/fp8.h's fp8_round_magnitude: the magnitude code of the finite, non-NaN fp32 bits `a`
// rounded to nearest even with an unbounded exponent (the caller saturates).
template <int kMan, int kBias>
__device__ __forceinline__ uint32_t fp8_round_magnitude_dev(uint32_t a) {
  const int fe = int(a >> 23);
  if (fe == 0) return 0;
  const int e = fe - 127;
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  constexpr int kEmin = 1 - kBias;
  const bool normal = e >= kEmin;
  const int shift = (23 - kMan) + (normal ? 0 : kEmin - e);
  if (shift > 24) return 0;
  uint32_t q = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return normal ? (uint32_t(e + kBias - 1) << kMan) + q : q;
}

// kv_fp8_encode(x, fmt, scale) of backend/kv_cache_dtype.h: y = x / scale (IEEE division,
// a NaN keeps x's sign as on the CPU), then e4m3 saturating to ±448, or e5m2 clamped to
// ±57344 first (so never inf).
template <int KF>
__device__ __forceinline__ uint8_t kv_encode(float x, float scale) {
  static_assert(KF == kKvE4m3 || KF == kKvE5m2);
  float y = __fdiv_rn(x, scale);
  if (isnan(y)) y = copysignf(y, x);
  const uint32_t u = __float_as_uint(y);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7fu);  // NaN
  if constexpr (KF == kKvE4m3) {
    if (a == 0x7f800000u) return uint8_t(sign | 0x7eu);
    const uint32_t m = fp8_round_magnitude_dev<3, 7>(a);
    return uint8_t(sign | (m > 0x7eu ? 0x7eu : m));
  } else {
    // clamp to ±57344 (0x47600000 is 57344.f), then round: never overflows
    const uint32_t m = fp8_round_magnitude_dev<2, 15>(a > 0x47600000u ? 0x47600000u : a);
    return uint8_t(sign | m);
  }
}

// The unscaled value of a code, exact: e5m2 is the top byte of an fp16; e4m3's magnitude
// bits shifted into an fp16 give its value · 2^-8 (fp16 subnormals hold e4m3's), and
// S.1111.111 is NaN.
template <int KF>
__device__ __forceinline__ float kv_code_f32(uint32_t c) {
  if constexpr (KF == kKvE5m2) {
    return __half2float(__ushort_as_half((unsigned short)(c << 8)));
  } else {
    const uint32_t a = c & 0x7fu;
    const float v = a == 0x7fu ? __uint_as_float(0x7fc00000u)
                               : __half2float(__ushort_as_half((unsigned short)(a << 7))) * 256.f;
    return (c & 0x80u) ? -v : v;
  }
}

// Four e4m3 codes (byte i of q: code i) as bf16 pairs (codes 0, 1 | codes 2, 3), exact for
// every code but NaN (magnitude 0x7f): a code's sign and 7 magnitude bits placed as bf16 bits
// 15 and 10..4 are a bf16 of its value · 2^-120 (the 4 exponent bits become the low bits of
// bf16's exponent; e4m3 subnormals M · 2^-9 become bf16 subnormals (M << 4) · 2^-133), and
// the bf16 product by 2^120 is exact. A byte permute, 3 integer operations and a bf16x2
// multiply per pair, where kv_code_f32 takes about 8 operations per code (the FP8-cache
// producers of stage 2 convert 16K codes per 64-key tile).
__device__ __forceinline__ uint2 e4m3x4_bf16_finite(uint32_t q) {
  constexpr uint32_t kTwo120 = 0x7b807b80u;  // bf16x2 (2^120, 2^120)
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t a = __byte_perm(q, 0u, i == 0 ? 0x1404u : 0x3424u);  // [0, c2i, 0, c2i+1]
    const uint32_t b = (a & 0x80008000u) | ((a & 0x7f007f00u) >> 4);
    const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&b),
                                     *reinterpret_cast<const __nv_bfloat162*>(&kTwo120));
    w[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint2(w[0], w[1]);
}

// Whether a code of c has e4m3's NaN magnitude 0x7f: adding 1 to each byte's magnitude
// carries into its bit 7 only there.
__device__ __forceinline__ bool e4m3x8_has_nan(uint2 c) {
  return ((((c.x & 0x7f7f7f7fu) + 0x01010101u) | ((c.y & 0x7f7f7f7fu) + 0x01010101u)) &
          0x80808080u) != 0u;
}

// Eight code values as eight bf16 (16 bytes, element 0 in the low half of .x), exact.
template <int KF>
__device__ __forceinline__ uint4 kv_codes8_bf16(uint2 c) {
  if constexpr (KF == kKvE4m3) {
    if (!e4m3x8_has_nan(c)) {  // else the exact per-code path below, which keeps NaN
      const uint2 lo = e4m3x4_bf16_finite(c.x), hi = e4m3x4_bf16_finite(c.y);
      return make_uint4(lo.x, lo.y, hi.x, hi.y);
    }
  }
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t src = i < 2 ? c.x : c.y;
    const int sh = (i & 1) * 16;
    const __nv_bfloat162 b = __floats2bfloat162_rn(kv_code_f32<KF>((src >> sh) & 0xffu),
                                                   kv_code_f32<KF>((src >> (sh + 8)) & 0xffu));
    w[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Eight consecutive cache elements starting at p (16-byte aligned for bf16, 8-byte for codes)
// as bf16 values: the elements themselves, or the code values (unscaled).
template <int KF>
__device__ __forceinline__ uint4 kv_load8_bf16(const KvElem<KF>* p) {
  if constexpr (KF == kKvAct)
    return *reinterpret_cast<const uint4*>(p);
  else
    return kv_codes8_bf16<KF>(*reinterpret_cast<const uint2*>(p));
}

// One cache element as fp32 with its scale applied (the value the CPU reads back). The
// product is rounded on its own (__fmul_rn: never contracted into an FMA with a following
// add), as the CPU's dequantized scratch row is.
template <int KF, typename E>
__device__ __forceinline__ float kv_value(E e, float scale) {
  if constexpr (KF == kKvAct)
    return ld(e);
  else
    return __fmul_rn(kv_code_f32<KF>(e), scale);
}

}  // namespace sala::cuda
