// The two 8-bit float formats PyTorch ships (torch.float8_e4m3fn, torch.float8_e5m2), as
// defined by the OCP "8-bit Floating Point Specification (OFP8)" rev. 1.0 (2023), and exact
// scalar conversions to and from fp32. These are the CPU oracle's numerics (issue 17, item 6):
// the CPU backend quantizes and dequantizes with these, and GPU FP8 kernels are compared with it.
//
//   e4m3fn  S EEEE MMM  bias 7:  no infinities; S.1111.111 is NaN (the only NaN codes, 0x7f and
//           0xff); S.1111.110 = ±448 is the largest finite value; subnormals S.0000.MMM are
//           M/8 * 2^-6, the smallest 2^-9.
//   e5m2    S EEEEE MM  bias 15: IEEE 754 binary16 truncated to its top byte: S.11111.00 is
//           ±inf, S.11111.{01,10,11} are NaN; ±57344 is the largest finite value; subnormals
//           S.00000.MM are M/4 * 2^-14, the smallest 2^-16.
//
// fp32 -> fp8 rounds to nearest, ties to even (the low mantissa bit, i.e. bit 0 of the code), and
// keeps the sign of zero (-0, and negatives that round to zero, give 0x80). NaN gives the all-ones
// NaN code with the input's sign (0x7f / 0xff). Overflow (a value whose
// rounding with an unbounded exponent exceeds the largest finite value; ±inf included):
//   e4m3fn SATURATES to ±448 (0x7e / 0xfe). Checkpoints in the compressed-tensors "float-quantized"
//          format (llm-compressor, loaded by vLLM / SGLang) are produced by clamping to
//          ±torch.finfo(float8_e4m3fn).max before the cast, and vLLM's activation quantization
//          clamps the same way, so saturating is "clamp to ±448, then round" for every input.
//   e5m2   gives ±inf (0x7c / 0xfc), the IEEE 754 rule for a format with infinities
//          (|x| >= 61440, the midpoint between 57344 and the would-be next step 65536, is inf).
//          Callers that want saturation clamp to ±kFp8E5m2Max first, as with e4m3.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/parallel.h"

namespace sala {

inline constexpr float kFp8E4m3Max = 448.f;    // 0x7e: 1.75 * 2^8
inline constexpr float kFp8E5m2Max = 57344.f;  // 0x7b: 1.75 * 2^15

namespace fp8_detail {

// Magnitude code (no sign bit) of |f| = the bits `a` (finite, not NaN) with kMan mantissa bits and
// exponent bias kBias, rounded to nearest even, with an unbounded exponent: the result may exceed
// the format's largest code, and the caller decides what overflow means. Exact integer arithmetic.
template <int kMan, int kBias>
inline uint32_t fp8_round_magnitude(uint32_t a) {
  const int fe = int(a >> 23);
  if (fe == 0) return 0;   // zero or an fp32 subnormal (< 2^-126): far below half the smallest code
  const int e = fe - 127;  // |f| = sig * 2^(e - 23)
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;  // 24 significant bits
  constexpr int kEmin = 1 - kBias;                   // exponent of the smallest normal
  const bool normal = e >= kEmin;
  // Bits to drop: down to kMan fraction bits, plus the distance below the normal range.
  const int shift = (23 - kMan) + (normal ? 0 : kEmin - e);
  if (shift > 24) return 0;  // |f| < 2^(kEmin - kMan - 1): below half the smallest subnormal
  uint32_t q = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  // Subnormal: q is the code itself (q == 2^kMan is the smallest normal, exponent field 1).
  // Normal: q carries the implicit bit 2^kMan; a carry out of the mantissa bumps the exponent.
  return normal ? (uint32_t(e + kBias - 1) << kMan) + q : q;
}

}  // namespace fp8_detail

inline float fp8_e4m3_to_f32(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t exp = (c >> 3) & 0xfu;
  const uint32_t man = c & 0x7u;
  if (exp == 0xf && man == 0x7)
    return std::bit_cast<float>(sign | 0x7fc00000u);  // NaN, sign kept
  if (exp == 0) {  // subnormal (or zero): man * 2^-9, exact in fp32
    const float v = float(man) * (1.f / 512.f);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | (exp - 7 + 127) << 23 | man << 20);
}

inline uint8_t f32_to_fp8_e4m3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;   // NaN
  if (a == 0x7f800000u) return sign | 0x7e;  // ±inf saturates, as clamp-then-cast does
  const uint32_t m = fp8_detail::fp8_round_magnitude<3, 7>(a);
  return sign | uint8_t(m > 0x7eu ? 0x7eu : m);  // saturate to ±448
}

inline float fp8_e5m2_to_f32(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t exp = (c >> 2) & 0x1fu;
  const uint32_t man = c & 0x3u;
  if (exp == 0x1f)  // inf (man == 0) or NaN, sign kept
    return std::bit_cast<float>(sign | (man ? 0x7fc00000u : 0x7f800000u));
  if (exp == 0) {  // subnormal (or zero): man * 2^-16, exact in fp32
    const float v = float(man) * (1.f / 65536.f);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | (exp - 15 + 127) << 23 | man << 21);
}

inline uint8_t f32_to_fp8_e5m2(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;   // NaN
  if (a == 0x7f800000u) return sign | 0x7c;  // ±inf
  const uint32_t m = fp8_detail::fp8_round_magnitude<2, 15>(a);
  return sign | uint8_t(m > 0x7bu ? 0x7cu : m);  // overflow -> ±inf (IEEE)
}

inline float round_fp8_e4m3(float f) {
  return fp8_e4m3_to_f32(f32_to_fp8_e4m3(f));
}
inline float round_fp8_e5m2(float f) {
  return fp8_e5m2_to_f32(f32_to_fp8_e5m2(f));
}

// The FP8 quantization recipe of a weight matrix or of activation rows (compressed-tensors'
// FP8_DYNAMIC, which vLLM and SGLang load): per row r of v [rows, cols],
//   scale[r] = amax(|v[r, :]|) / 448 (1 for an all-zero row: its codes are 0 for any scale),
//   code[r, c] = e4m3(v[r, c] / scale[r]).
// `sala quantize`, the CPU backend's load-time quantization and its per-token activation
// quantization all use it, so a quantized checkpoint and quantizing at load give the same bits.
inline float fp8_row_scale(const float* v, int64_t cols) {
  float amax = 0.f;
  for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(v[c]));
  return amax > 0.f ? amax / kFp8E4m3Max : 1.f;
}
// Rows are independent, so a large matrix (a 9B checkpoint's projections: 9.2 G values,
// about a minute on one core) is split over the machine's cores; the bits are the same.
inline void fp8_quantize_rows(const float* v, int64_t rows, int64_t cols, uint8_t* codes,
                              float* scales) {
  parallel_parts(rows, cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      scales[r] = fp8_row_scale(v + r * cols, cols);
      for (int64_t c = 0; c < cols; ++c)
        codes[r * cols + c] = f32_to_fp8_e4m3(v[r * cols + c] / scales[r]);
    }
  });
}

}  // namespace sala
