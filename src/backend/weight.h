// A linear layer's weight in backend memory: what the GEMM entry points (Backend::linear,
// linear_multi, linear_silu_mul) take. Dense formats are a plain [out, in] matrix; a
// quantized format adds dequantization scales, one fp32 scale per `group` consecutive input
// columns of a row (group == cols: one scale per output channel). Memory planning and the
// benchmarks' floors ask a weight (or storage_bytes for a weight not yet loaded) for its
// bytes, so a format with fewer bits per element changes them without other code knowing.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "core/dtype.h"

namespace sala {

// The formats a backend stores weights in. BF16 / F32: dense. FP8_E4M3: e4m3fn codes
// (core/fp8.h) with one fp32 scale per output channel (group == cols): W ≈ code value · scale,
// the compressed-tensors FP8 layout. INT4_GROUPED (W4A16): symmetric int4 codes packed eight per
// uint32 word in compressed-tensors' order (core/int4.h; [rows, cols / 8] words) with one fp32
// scale per `group` input columns (the checkpoint's bf16 / fp16 / fp32 scale, widened):
// W ≈ q · scale; activations stay in the activation type.
enum class WeightFormat : uint8_t { BF16, F32, FP8_E4M3, INT4_GROUPED };

inline int weight_format_bits(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return 16;
    case WeightFormat::F32: return 32;
    case WeightFormat::FP8_E4M3: return 8;
    case WeightFormat::INT4_GROUPED: return 4;
  }
  return 0;
}
inline const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::F32: return "fp32";
    case WeightFormat::FP8_E4M3: return "fp8_e4m3";
    case WeightFormat::INT4_GROUPED: return "int4_w4a16";
  }
  return "?";
}

struct Tensor;  // backend.h

struct Weight {
  void* data = nullptr;  // [rows, cols] elements of `format`, row-major
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0, cols = 0;  // [out, in] (PyTorch nn.Linear): linear() computes x · Wᵀ
  float* scales = nullptr;     // [rows, cols / group] dequantization scales; null when dense
  int32_t group = 0;           // input columns per scale; 0 when dense

  // Bytes of a [rows, cols] weight in format f with one scale per `group` columns (0: none):
  // what load_weights will allocate for it.
  static size_t storage_bytes(WeightFormat f, int64_t rows, int64_t cols, int32_t group = 0) {
    const size_t data = size_t(rows) * size_t(cols) * size_t(weight_format_bits(f)) / 8;
    const size_t n_scales = group > 0 ? size_t(rows) * size_t((cols + group - 1) / group) : 0;
    return data + n_scales * sizeof(float);
  }
  size_t nbytes() const { return storage_bytes(format, rows, cols, group); }
  bool dense() const { return scales == nullptr; }

  // Rows [r0, r0 + n): the weight of some of the outputs (a stacked weight's parts).
  Weight slice_rows(int64_t r0, int64_t n) const {
    SALA_CHECK(r0 >= 0 && n >= 0 && r0 + n <= rows, "slice [{}, {}) of a {}-row weight", r0,
               r0 + n, rows);
    Weight w = *this;
    const size_t row_bytes = size_t(cols) * size_t(weight_format_bits(format)) / 8;
    w.data = static_cast<char*>(data) + size_t(r0) * row_bytes;
    if (scales) w.scales = scales + r0 * ((cols + group - 1) / group);
    w.rows = n;
    return w;
  }
};

// The element type of a dense format (and of the dense tensors beside quantized weights:
// embedding, norms, which stay in the activation type).
inline DType dense_dtype(WeightFormat f) {
  SALA_CHECK(f == WeightFormat::BF16 || f == WeightFormat::F32, "{} is not a dense format",
             weight_format_name(f));
  return f == WeightFormat::BF16 ? DType::BF16 : DType::F32;
}

}  // namespace sala
