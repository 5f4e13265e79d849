// W4A16 on the CPU: the oracle a GPU int4 GEMM must reproduce (issue 22). The weight is
// compressed-tensors' pack-quantized int4 (core/int4.h): codes q [N, K] packed eight per word,
// scales s [N, K / group] as stored in the checkpoint (bf16 / fp16 / fp32, widened exactly).
//   W[n, k] = q[n, k] · s[n, k / group]   in fp32 (exact: at most 15 significant bits),
//   y[t, n] = Σ_k x[t, k] · W[n, k]        fp32 sgemm over the dequantized rows;
// activations are not quantized (A16), and the output is rounded like every other GEMM's in
// bf16 mode.
#include <omp.h>

#include <algorithm>
#include <cblas.h>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/check.h"
#include "core/error.h"
#include "core/int4.h"
#include "core/safetensors.h"

namespace sala {

Weight CpuBackend::int4_weight_rtn(const std::string& name, const float* w, int64_t rows,
                                   int64_t cols, int32_t group) {
  if (group <= 0 || cols % group != 0 || cols % kInt4PerWord != 0)
    fail("{}: W4A16 needs the input width {} to be a multiple of the group size {} and of 8",
         name, cols, group);
  auto* words = static_cast<uint32_t*>(alloc_bytes(size_t(rows * cols / kInt4PerWord) * 4));
  auto* scales = static_cast<float*>(alloc_bytes(size_t(rows * (cols / group)) * sizeof(float)));
  int4_quantize_rtn(w, rows, cols, group, words, scales);
  return Weight{words, WeightFormat::INT4_GROUPED, rows, cols, scales, group};
}

Weight CpuBackend::upload_int4(const TensorView& packed, const std::vector<float>& scales,
                               int32_t group) {
  SALA_CHECK(packed.dtype == DType::I32 && packed.shape.size() == 2, "{}: not a 2-D I32 tensor",
             packed.name);
  const int64_t rows = packed.shape[0], cols = packed.shape[1] * kInt4PerWord;
  if (group <= 0 || cols % group != 0)
    fail("{}: group size {} does not divide the input width {}", packed.name, group, cols);
  if (int64_t(scales.size()) != rows * (cols / group))
    fail("{}: {} scales for {} rows of {} groups", packed.name, scales.size(), rows, cols / group);
  auto* words = static_cast<uint32_t*>(alloc_bytes(packed.nbytes));
  auto* s = static_cast<float*>(alloc_bytes(scales.size() * sizeof(float)));
  std::memcpy(words, packed.data, packed.nbytes);
  std::memcpy(s, scales.data(), scales.size() * sizeof(float));
  return Weight{words, WeightFormat::INT4_GROUPED, rows, cols, s, group};
}

void CpuBackend::linear_int4(const Tensor& x, const Weight& w, Tensor& y) {
  SALA_CHECK(w.scales && w.group > 0 && w.cols % w.group == 0, "int4 weight without group scales");
  SALA_CHECK(x.cols == w.cols && y.rows == x.rows && y.cols == w.rows,
             "linear shapes x[{},{}] w[{},{}] y[{},{}]", x.rows, x.cols, w.rows, w.cols, y.rows,
             y.cols);
  const int64_t T = x.rows, K = x.cols, N = w.rows, G = K / w.group;
  if (T == 0) return;
  // Output columns in blocks of kRows weight rows, dequantized to fp32 per block [kRows, K].
  constexpr int64_t kRows = 64;
  const int64_t blocks = (N + kRows - 1) / kRows;
  const auto* words = static_cast<const uint32_t*>(w.data);
  const float* xp = static_cast<const float*>(x.data);
  float* yp = static_cast<float*>(y.data);
#pragma omp parallel
  {
    std::vector<float> wv(size_t(kRows * K));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * kRows, nb = std::min(kRows, N - n0);
      for (int64_t i = 0; i < nb; ++i)
        int4_dequantize_row(words + (n0 + i) * (K / kInt4PerWord), w.scales + (n0 + i) * G, K,
                            w.group, wv.data() + i * K);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(nb), int(K), 1.f, xp,
                  int(K), wv.data(), int(K), 0.f, yp + n0, int(y.cols));
    }
  }
  round_all(y);
}

}  // namespace sala
