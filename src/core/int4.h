// Symmetric int4 weights with one scale per group of input columns: the W4A16 format of
// compressed-tensors' "pack-quantized" layout (llm-compressor's GPTQ / W4A16 preset, which vLLM
// and SGLang load), and the numerics of the CPU oracle (issue 22).
//
//   weight_packed  int32 [N, K / 8]: value q[n, k] (an int4 in [-8, 7]) is stored as the
//                  unsigned nibble q + 8 in bits 4·(k % 8) .. 4·(k % 8) + 3 of word k / 8
//                  (compressed-tensors pack_to_int32(value, 4), packed_dim 1: offset by
//                  1 << (num_bits - 1), eight consecutive columns per int32, lowest bits first)
//   weight_scale   [N, K / group] in the checkpoint's dtype (bf16 as llm-compressor writes it,
//                  fp16 or fp32 accepted); read widened to fp32, which is exact
//   weight_shape   int32 [2] = {N, K}
//   W[n, k] ≈ q[n, k] · scale[n, k / group], computed in fp32 (exact: a 4-bit integer times a
//   bf16 / fp16 scale has at most 15 significant bits).
//
// Quantization (round to nearest, "RTN"; compressed-tensors' calculate_qparams + quantize for
// symmetric int): per row n and group g,
//   scale = stored(max(|W[n, g·G .. g·G + G)|) / 7.5)   (7.5 = (q_max − q_min) / 2; an
//           all-zero group gets 1, whose codes are 0 for any scale),
//   q     = clamp(round_half_even(W / scale), −8, 7), the division in fp32 by the scale as
//           stored (stored(): rounded to the scale dtype, bf16 here).
#pragma once
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"

namespace sala {

inline constexpr int kInt4Min = -8, kInt4Max = 7;
inline constexpr int kInt4PerWord = 8;  // int4 values per packed int32

// The int4 value at column k of a packed row (words [K / 8]).
inline int int4_at(const uint32_t* words, int64_t k) {
  return int((words[k / kInt4PerWord] >> (4 * (k % kInt4PerWord))) & 0xfu) - 8;
}

// Packs q[0 .. cols) (each in [-8, 7], cols a multiple of 8) into words[cols / 8].
inline void int4_pack_row(const int8_t* q, int64_t cols, uint32_t* words) {
  for (int64_t w = 0; w < cols / kInt4PerWord; ++w) {
    uint32_t word = 0;
    for (int i = 0; i < kInt4PerWord; ++i)
      word |= (uint32_t(q[w * kInt4PerWord + i] + 8) & 0xfu) << (4 * i);
    words[w] = word;
  }
}

// The scale of one group of weights (values v[0 .. n)), rounded to bf16 as it is stored.
inline float int4_group_scale(const float* v, int64_t n) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(v[i]));
  return amax > 0.f ? round_bf16(amax / 7.5f) : 0.0078125f;  // bf16 eps, as the library
}

// The int4 code of x with a given (stored) scale: nearest, ties to even (torch.round), clamped.
inline int int4_quantize(float x, float scale) {
  const float r = std::nearbyint(x / scale);  // the default rounding mode: to nearest even
  return int(std::fmin(std::fmax(r, float(kInt4Min)), float(kInt4Max)));
}

// Row n of a W4A16 weight dequantized into out[0 .. cols): q · scale in fp32.
// words: [cols / 8] packed codes; scales: [cols / group] fp32 (as stored, widened).
inline void int4_dequantize_row(const uint32_t* words, const float* scales, int64_t cols,
                                int32_t group, float* out) {
  if (group % kInt4PerWord != 0) {
    for (int64_t k = 0; k < cols; ++k) out[k] = float(int4_at(words, k)) * scales[k / group];
    return;
  }
  for (int64_t w = 0; w < cols / kInt4PerWord; ++w) {  // a word's 8 values share one scale
    const uint32_t word = words[w];
    const float s = scales[w * kInt4PerWord / group];
    for (int i = 0; i < kInt4PerWord; ++i)
      out[w * kInt4PerWord + i] = float(int((word >> (4 * i)) & 0xfu) - 8) * s;
  }
}

// RTN quantization of a [rows, cols] fp32 matrix: words [rows, cols / 8], scales
// [rows, cols / group] (bf16 values). cols must be a multiple of 8 and of group. Rows are
// independent, so a large matrix is split over the cores (the bits do not change).
inline void int4_quantize_rtn(const float* w, int64_t rows, int64_t cols, int32_t group,
                              uint32_t* words, float* scales) {
  const int64_t groups = cols / group;
  parallel_parts(rows, cols, [&](int64_t r0, int64_t r1) {
    std::vector<int8_t> q(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = w + r * cols;
      for (int64_t g = 0; g < groups; ++g) {
        const float s = int4_group_scale(row + g * group, group);
        scales[r * groups + g] = s;
        for (int64_t k = g * group; k < (g + 1) * group; ++k)
          q[size_t(k)] = int8_t(int4_quantize(row[k], s));
      }
      int4_pack_row(q.data(), cols, words + r * (cols / kInt4PerWord));
    }
  });
}

}  // namespace sala
