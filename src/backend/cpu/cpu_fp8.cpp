// W8A8 FP8 on the CPU: the oracle of BackendOptions::fp8_weights, which a GPU FP8 GEMM must
// reproduce. The recipe is compressed-tensors' FP8_DYNAMIC (vLLM / SGLang load it; the
// quantization itself is core/fp8.h's fp8_quantize_rows / fp8_row_scale):
//   weights, per output channel n:  s_w[n] = amax(|W[n, :]|) / 448 (1 for an all-zero row),
//                                   w_q[n, k] = e4m3(W[n, k] / s_w[n]);
//   activations, per GEMM input row t (dynamic, per token):
//                                   s_x[t] = amax(|x[t, :]|) / 448 (1 for an all-zero row),
//                                   x_q[t, k] = e4m3(x[t, k] / s_x[t]);
//   y[t, n] = (Σ_k x_q[t, k] · w_q[n, k]) · s_x[t] · s_w[n].
// e4m3() is core/fp8.h's nearest-even, saturating conversion. A product of two e4m3 values is
// exact in fp32; the sum is in fp32 (sgemm's order) and the two scales multiply it in the
// order written.
#include <omp.h>

#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <cstring>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "core/check.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/safetensors.h"

namespace sala {

Weight CpuBackend::upload_linear(const TensorView& src, WeightFormat format) {
  if (format != WeightFormat::FP8_E4M3 && format != WeightFormat::INT4_GROUPED)
    return Backend::upload_linear(src, format);
  SALA_CHECK(src.shape.size() == 2, "{}: a quantized weight must be 2-D", src.name);
  const int64_t rows = src.shape[0], cols = src.shape[1];
  const auto w = std::make_unique_for_overwrite<float[]>(size_t(rows * cols));  // all written
  src.to_f32(w.get());
  if (format == WeightFormat::INT4_GROUPED)
    return int4_weight_rtn(src.name, w.get(), rows, cols, int4_group_);
  auto* codes = static_cast<uint8_t*>(alloc_bytes(size_t(rows * cols)));
  auto* scales = static_cast<float*>(alloc_bytes(size_t(rows) * sizeof(float)));
  fp8_quantize_rows(w.get(), rows, cols, codes, scales);
  return Weight{codes, WeightFormat::FP8_E4M3, rows, cols, scales, int32_t(cols)};
}

Weight CpuBackend::upload_fp8(const TensorView& codes, const std::vector<float>& scales) {
  SALA_CHECK(codes.dtype == DType::F8_E4M3 && codes.shape.size() == 2, "{}: not a 2-D FP8 tensor",
             codes.name);
  const int64_t rows = codes.shape[0], cols = codes.shape[1];
  if (int64_t(scales.size()) != rows)
    fail("{}: {} scales for {} output channels", codes.name, scales.size(), rows);
  auto* c = static_cast<uint8_t*>(alloc_bytes(size_t(rows * cols)));
  auto* s = static_cast<float*>(alloc_bytes(size_t(rows) * sizeof(float)));
  std::memcpy(c, codes.data, size_t(rows * cols));
  std::memcpy(s, scales.data(), size_t(rows) * sizeof(float));
  return Weight{c, WeightFormat::FP8_E4M3, rows, cols, s, int32_t(cols)};
}

void CpuBackend::linear_fp8(const Tensor& x, const Weight& w, Tensor& y) {
  SALA_CHECK(w.scales && w.group == w.cols, "fp8 weight without per-channel scales");
  SALA_CHECK(x.cols == w.cols && y.rows == x.rows && y.cols == w.rows,
             "linear shapes x[{},{}] w[{},{}] y[{},{}]", x.rows, x.cols, w.rows, w.cols, y.rows,
             y.cols);
  const int64_t T = x.rows, K = x.cols, N = w.rows;
  if (T == 0) return;
  const float* xp = static_cast<const float*>(x.data);
  std::vector<float> xq(static_cast<size_t>(T * K)), sx(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    sx[size_t(t)] = fp8_row_scale(xp + t * K, K);
    for (int64_t k = 0; k < K; ++k)
      xq[size_t(t * K + k)] = round_fp8_e4m3(xp[t * K + k] / sx[size_t(t)]);
  }
  // Output columns in blocks of kRows weight rows, decoded to fp32 e4m3 values per block.
  constexpr int64_t kRows = 64;
  const int64_t blocks = (N + kRows - 1) / kRows;
  const auto* codes = static_cast<const uint8_t*>(w.data);
  float* yp = static_cast<float*>(y.data);
#pragma omp parallel
  {
    std::vector<float> wv(size_t(kRows * K));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * kRows, nb = std::min(kRows, N - n0);
      for (int64_t i = 0; i < nb * K; ++i) wv[size_t(i)] = fp8_e4m3_to_f32(codes[n0 * K + i]);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(nb), int(K), 1.f,
                  xq.data(), int(K), wv.data(), int(K), 0.f, yp + n0, int(y.cols));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = n0; n < n0 + nb; ++n)
          yp[t * y.cols + n] = yp[t * y.cols + n] * sx[size_t(t)] * w.scales[n];
    }
  }
  round_all(y);
}

}  // namespace sala
