// W8A8 FP8 on the CPU (BackendOptions::fp8_weights; the recipe is in cpu_fp8.cpp): the codes
// and scales of a quantized weight, linear() against the recipe recomputed here in double,
// its distance from the fp32 GEMM, and the bytes of a quantized model (planning == loading).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "core/fp8.h"
#include "core/safetensors.h"
#include "model/weights.h"

namespace sala {
namespace {

const std::string kTinyChat = std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat";

TensorView view_of(const std::vector<float>& v, int64_t rows, int64_t cols) {
  TensorView t;
  t.name = "test";
  t.dtype = DType::F32;
  t.shape = {rows, cols};
  t.data = reinterpret_cast<const uint8_t*>(v.data());
  t.nbytes = v.size() * sizeof(float);
  return t;
}

float amax_scale(const float* v, int64_t n) {
  float a = 0.f;
  for (int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(v[i]));
  return a > 0.f ? a / kFp8E4m3Max : 1.f;
}

struct Case {
  int64_t T = 5, K = 48, N = 70;  // N > 64: two weight-row blocks
  std::vector<float> w, x;
  Case() {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    w.resize(size_t(N * K));
    x.resize(size_t(T * K));
    for (float& v : w) v = nd(rng) * 0.05f;
    for (float& v : x) v = nd(rng) * 3.f;
    for (int64_t k = 0; k < K; ++k) w[size_t(3 * K + k)] = 0.f;  // an all-zero output channel
    for (int64_t k = 0; k < K; ++k) x[size_t(2 * K + k)] = 0.f;  // an all-zero input row
    x[size_t(K + 5)] = 1e4f;                                      // an outlier sets row 1's scale
  }
};

// CPU fp32 with W8A8 FP8 projections (BackendOptions::fp8_weights).
BackendOptions fp8_options(int threads) {
  BackendOptions o;
  o.threads = threads;
  o.fp8_weights = true;
  return o;
}

TEST(Fp8Linear, WeightCodesAndScalesFollowTheRecipe) {
  Case c;
  auto be = make_backend("cpu", fp8_options(1));
  ASSERT_EQ(be->linear_format(), WeightFormat::FP8_E4M3);
  const Weight w = be->upload_linear(view_of(c.w, c.N, c.K), WeightFormat::FP8_E4M3);
  ASSERT_EQ(w.format, WeightFormat::FP8_E4M3);
  ASSERT_EQ(w.group, c.K);
  EXPECT_EQ(w.nbytes(), size_t(c.N * c.K + c.N * 4));
  const auto* codes = static_cast<const uint8_t*>(w.data);
  for (int64_t n = 0; n < c.N; ++n) {
    const float s = amax_scale(c.w.data() + n * c.K, c.K);
    ASSERT_EQ(w.scales[n], s) << n;
    for (int64_t k = 0; k < c.K; ++k)
      ASSERT_EQ(codes[n * c.K + k], f32_to_fp8_e4m3(c.w[size_t(n * c.K + k)] / s)) << n << "," << k;
  }
}

TEST(Fp8Linear, LinearIsTheRecipeAndCloseToFp32) {
  Case c;
  auto q = make_backend("cpu", fp8_options(2));
  auto f = make_backend("cpu", BackendOptions{NumericMode::F32, 2});
  const Weight wq = q->upload_linear(view_of(c.w, c.N, c.K), WeightFormat::FP8_E4M3);
  const Weight wf = f->upload_linear(view_of(c.w, c.N, c.K), WeightFormat::F32);
  Tensor x = q->upload_weight(view_of(c.x, c.T, c.K));
  Tensor yq = q->alloc(c.T, c.N, DType::F32), yf = f->alloc(c.T, c.N, DType::F32);
  q->linear(x, wq, yq);
  f->linear(x, wf, yf);
  const float* pq = static_cast<const float*>(yq.data);
  const float* pf = static_cast<const float*>(yf.data);
  double err2 = 0, ref2 = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    const float sx = amax_scale(c.x.data() + t * c.K, c.K);
    for (int64_t n = 0; n < c.N; ++n) {
      double acc = 0;  // every product of two e4m3 values is exact; the sum is in double here
      for (int64_t k = 0; k < c.K; ++k)
        acc += double(round_fp8_e4m3(c.x[size_t(t * c.K + k)] / sx)) *
               fp8_e4m3_to_f32(static_cast<const uint8_t*>(wq.data)[n * c.K + k]);
      const double want = acc * sx * wq.scales[n];
      const double got = pq[t * c.N + n];
      EXPECT_NEAR(got, want, 1e-5 * (std::fabs(want) + 1e-3)) << "t=" << t << " n=" << n;
      if (n == 3 || t == 2) EXPECT_EQ(got, 0.0) << "zero channel / row, t=" << t << " n=" << n;
      err2 += (got - pf[t * c.N + n]) * (got - pf[t * c.N + n]);
      ref2 += double(pf[t * c.N + n]) * pf[t * c.N + n];
    }
  }
  // 3 mantissa bits: each quantized value is within 2^-4 of its own; the GEMM averages that.
  EXPECT_LT(std::sqrt(err2 / ref2), 0.08) << "rel L2 of the fp8 GEMM vs fp32";
  EXPECT_GT(std::sqrt(err2 / ref2), 0.0) << "the fp8 GEMM must not be the fp32 one";
}

// Projections quantized, lm_head / embedding / norms fp32: planning predicts what loading holds.
TEST(Fp8Linear, QuantizedModelBytesMatchThePlan) {
  const ModelConfig cfg = load_model_config(kTinyChat);
  Checkpoint ckpt(kTinyChat);
  auto be = make_backend("cpu", fp8_options(0));
  const ModelWeights w = load_weights(cfg, ckpt, *be, nullptr);
  size_t proj_params = 0, proj_rows = 0, other_params = 0;
  for (auto& [name, shape] : expected_tensors(cfg)) {
    size_t n = 1;
    for (int64_t s : shape) n *= size_t(s);
    if (shape.size() == 2 && name != "model.embed_tokens.weight" && name != "lm_head.weight") {
      proj_params += n;
      proj_rows += size_t(shape[0]);
    } else {
      other_params += n;
    }
  }
  EXPECT_EQ(planned_weight_bytes(cfg, WeightFormat::FP8_E4M3, WeightFormat::F32),
            proj_params + proj_rows * 4 + other_params * 4);
  EXPECT_EQ(w.body_linear_bytes(), proj_params + proj_rows * 4);
  EXPECT_EQ(w.layers[0].qkvg.format, WeightFormat::FP8_E4M3);
  EXPECT_EQ(w.layers[0].down_proj.format, WeightFormat::FP8_E4M3);
  EXPECT_EQ(w.lm_head.format, WeightFormat::F32);
  // A stacked weight's parts share its codes and per-channel scales.
  EXPECT_EQ(w.layers[0].k_proj.scales, w.layers[0].qkvg.scales + w.layers[0].q_proj.rows);
}

}  // namespace
}  // namespace sala
