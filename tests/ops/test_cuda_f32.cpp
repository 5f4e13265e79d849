// CUDA backend vs CPU backend, both in fp32 mode (NumericMode::F32, golden README §4: weights
// upcast exactly, every activation fp32, nothing rounded to bf16), op by op (harness:
// cuda_test_util.h). Inputs are fp32 values that are not bf16 values (randn_f32), so a kernel
// that rounds a load or a store to bf16 errs by ~1e-3 relative and fails; the bound is the
// fp32 level (kF32RelL2 / kF32RelMax: other summation orders, expf vs std::exp, cuBLASLt vs
// OpenBLAS), far below that. The sparse layers in fp32 mode are in test_cuda_sparse.cpp
// (CudaOpsF32.*); embedding, rope + gather, qk_norm_rope and linear_multi run in both modes
// in test_cuda_ops.cpp. fp32 steps are never recorded as CUDA graphs (CudaBackend). Without
// a GPU every test GTEST_SKIPs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"
#include "cuda_test_util.h"
#include "backend/step.h"

namespace sala::test {
namespace {

constexpr NumericMode F32 = NumericMode::F32;

void expect_f32(const Stat& s) {
  expect_close(s, kF32RelL2, kF32RelMax);
}

TEST(CudaOpsF32, Modes) {
  REQUIRE_GPU();
  Pair p(F32);
  EXPECT_EQ(p.gpu->act_dtype(), DType::F32);
  EXPECT_EQ(p.gpu->kv_element_bytes(), 4u);
  EXPECT_FALSE(p.gpu->graphs_enabled());  // fp32 steps run eagerly (see CudaBackend)
  // Weights: the checkpoint's bf16 values upcast exactly.
  const HostMat h = randn(3, 40, 7, 2.f);
  auto w = p.up(h);
  auto [a, b] = p.download(w);
  const std::vector<float> exact = h.f32();
  EXPECT_EQ(a, exact);
  EXPECT_EQ(b, exact);
}

TEST(CudaOpsF32, RmsNorm) {
  REQUIRE_GPU();
  uint32_t seed = 10;
  for (int64_t T : {1, 7, 33})
    for (int64_t cols : {256, 1032, 4096, 12288})
      for (int64_t n : {cols, int64_t(16), int64_t(128)}) {
        if (cols % n != 0) continue;
        Pair p(F32);
        auto x = p.up(randn_f32(T, cols, seed++, 2.f));
        auto w = p.up(randn_f32(1, n, seed++, 0.2f, 1.f));
        p.begin(rows_meta(int(T)));
        auto o = p.out(T, cols);
        p.cpu->rmsnorm(x.c, w.c, 1e-6f, o.c);
        p.gpu->rmsnorm(x.g, w.g, 1e-6f, o.g);
        expect_f32(p.cmp(shape("fp32 rmsnorm group", {T, cols, n}), o));
        p.cpu->rmsnorm(x.c, w.c, 1e-6f, x.c);  // in place
        p.gpu->rmsnorm(x.g, w.g, 1e-6f, x.g);
        expect_f32(p.cmp(shape("fp32 rmsnorm in-place", {T, cols, n}), x));
      }
}

TEST(CudaOpsF32, AddScaledRmsNorm) {
  REQUIRE_GPU();
  uint32_t seed = 100;
  for (int64_t T : {1, 5, 64})
    for (int64_t cols : {256, 1032, 4096, 8192}) {
      Pair p(F32);
      auto h = p.up(randn_f32(T, cols, seed++, 3.f));
      auto a = p.up(randn_f32(T, cols, seed++, 1.f));
      auto w = p.up(randn_f32(1, cols, seed++, 0.2f, 1.f));
      p.begin(rows_meta(int(T)));
      auto o = p.out(T, cols);
      const float alpha = 1.4f / std::sqrt(32.f);
      p.cpu->add_scaled_rmsnorm(h.c, a.c, alpha, w.c, 1e-6f, o.c);
      p.gpu->add_scaled_rmsnorm(h.g, a.g, alpha, w.g, 1e-6f, o.g);
      expect_f32(p.cmp(shape("fp32 add_scaled_rmsnorm h", {T, cols}), h));
      expect_f32(p.cmp(shape("fp32 add_scaled_rmsnorm out", {T, cols}), o));
    }
}

TEST(CudaOpsF32, Linear) {
  REQUIRE_GPU();
  struct S {
    int64_t T, K, N;
    bool f32_out;  // the lm_head's fp32 logits tensor (in fp32 mode every output is fp32)
  };
  uint32_t seed = 200;
  for (S s : {S{1, 256, 256, false}, S{3, 256, 512, false}, S{7, 40, 24, false},
              S{16, 4096, 1000, false}, S{17, 4096, 1024, false}, S{64, 512, 4096, false},
              S{300, 1024, 1024, false}, S{9, 16384, 512, false}, S{5, 256, 512, true},
              S{2, 4096, 4096, true}, S{12, 1024, 77, true}, S{8, 8, 3, false}}) {
    Pair p(F32);
    auto x = p.up(randn_f32(s.T + 1, s.K, seed++, 1.f));
    auto w = p.up(randn(s.N, s.K, seed++, 1.f / std::sqrt(float(s.K))));  // bf16 weights
    // Rows 1.. of x: a pointer that is not 256-byte aligned, as slices are.
    Tensor xc = x.c.slice_rows(1, s.T), xg = x.g.slice_rows(1, s.T);
    auto y = p.out(s.T, s.N);
    p.cpu->linear(xc, w.c, y.c);
    p.gpu->linear(xg, w.g, y.g);
    expect_f32(p.cmp(shape("fp32 linear", {s.T, s.K, s.N}), y));
  }
}

TEST(CudaOpsF32, Elementwise) {
  REQUIRE_GPU();
  uint32_t seed = 300;
  for (int64_t T : {1, 9, 128}) {
    const int64_t C = 1536;
    Pair p(F32);
    auto g = p.up(randn_f32(T, C, seed++, 3.f));
    auto u = p.up(randn_f32(T, C, seed++, 2.f));
    auto o = p.out(T, C);
    p.cpu->silu_mul(g.c, u.c, o.c);
    p.gpu->silu_mul(g.g, u.g, o.g);
    expect_f32(p.cmp(shape("fp32 silu_mul", {T, C}), o));
    p.cpu->mul_sigmoid(u.c, g.c, o.c);
    p.gpu->mul_sigmoid(u.g, g.g, o.g);
    expect_f32(p.cmp(shape("fp32 mul_sigmoid", {T, C}), o));
    p.cpu->silu_mul(g.c, u.c, g.c);  // in place
    p.gpu->silu_mul(g.g, u.g, g.g);
    expect_f32(p.cmp(shape("fp32 silu_mul in-place", {T, C}), g));
    p.cpu->div_scalar(u.c, 1.7f);
    p.gpu->div_scalar(u.g, 1.7f);
    const Stat s = p.cmp(shape("fp32 div_scalar 1.7", {T, C}), u);
    EXPECT_EQ(s.ndiff, 0) << s.name;  // one IEEE division, no rounding
  }
}

// Lightning layers: the recurrent, chunked and chunk-parallel kernels for float.
TEST(CudaOpsF32, Lightning) {
  REQUIRE_GPU();
  run_lightning(4, 16, F32);
  run_lightning(2, 64, F32);
  run_lightning(3, 128, F32);
}

TEST(CudaOpsF32, ArgmaxRows) {
  REQUIRE_GPU();
  for (int64_t V : {int64_t(800), int64_t(73448)})
    for (int64_t R : {int64_t(1), int64_t(7), int64_t(64)}) {
      Pair p(F32);
      auto x = p.up(randn_f32(R, 256, uint32_t(V + R), 1.f));
      auto w = p.up(randn(V, 256, uint32_t(V * 3 + R), 0.1f));
      auto logits = p.out(R, V, DType::F32);
      p.begin(rows_meta(int(R)));
      p.cpu->linear(x.c, w.c, logits.c);
      p.gpu->linear(x.g, w.g, logits.g);
      expect_f32(p.cmp(shape("fp32 logits", {R, 256, V}), logits));
      std::vector<int32_t> a(static_cast<size_t>(R)), b(static_cast<size_t>(R));
      p.cpu->argmax_rows(logits.c, a.data());
      p.gpu->argmax_rows(logits.g, b.data());
      std::vector<float> cl(static_cast<size_t>(R * V));
      p.cpu->download_f32(logits.c, cl.data());
      for (int64_t r = 0; r < R; ++r) {
        std::vector<float> row(cl.begin() + r * V, cl.begin() + (r + 1) * V);
        std::nth_element(row.begin(), row.begin() + 1, row.end(), std::greater<float>());
        if (row[0] - row[1] > 1e-4f * std::abs(row[0])) {  // fp32: only a near-tie may flip
          EXPECT_EQ(a[size_t(r)], b[size_t(r)]) << "V=" << V << " r=" << r;
        }
      }
    }
}

}  // namespace
}  // namespace sala::test
