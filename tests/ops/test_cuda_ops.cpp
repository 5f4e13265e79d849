// CUDA backend vs CPU backend in bf16 emulation (NumericMode::BF16), op by op (harness:
// cuda_test_util.h): element-wise ops, norms, GEMMs, RoPE, lightning (GLA) layers, argmax
// (recorded decode steps: test_cuda_graphs.cpp; GEMV row invariance, verify-step dispatch and
// speed: test_cuda_gemv.cpp; same binary). The sparse (InfLLM-v2) layers are in
// test_cuda_sparse.cpp.
//
// Element-wise ops must agree to the bit or within one bf16 ulp on a few elements (fp32 exp /
// sqrt differences before a rounding); GEMMs and the GLA kernels within bf16 round-off of a
// different fp32 summation order. Without a GPU (CI) every test GTEST_SKIPs with a loud
// message; with SALA_REQUIRE_GPU=1 the missing GPU is a failure (scripts/gpu_check.sh sets it).
// A table of the measured errors is printed at the end.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"
#include "cuda_test_util.h"
#include "backend/step.h"

namespace sala::test {
namespace {

// ---- element-wise, norms, GEMM ------------------------------------------------------------

// Bit-exact in both modes (fp32: a table that is not bf16 values).
TEST(CudaOps, Embedding) {
  REQUIRE_GPU();
  for (const NumericMode mode : {NumericMode::BF16, NumericMode::F32}) {
    const bool f32 = mode == NumericMode::F32;
    Pair p(mode);
    auto table = f32 ? p.up(randn_f32(512, 256, 1, 0.05f)) : p.up(randn(512, 256, 1, 0.05f));
    StepMeta m;
    std::vector<int32_t> ids = {0, 511, 7, 7, 300, 1, 2, 99, 504};
    m.add_seq(ids.data(), int32_t(ids.size()), 0, 0, {}, false, false);
    p.begin(m);
    auto o = p.out(int64_t(ids.size()), 256);
    p.cpu->embedding(table.c, 12.f, o.c);
    p.gpu->embedding(table.g, 12.f, o.g);
    expect_ulp(p.cmp(shape(f32 ? "fp32 embedding x12" : "embedding x12", {9, 256}), o), 0, 0);
  }
}

TEST(CudaOps, RmsNorm) {
  REQUIRE_GPU();
  uint32_t seed = 10;
  // Widths for each kernel: warp (n <= 512), 16-byte vectors (n = 8 · threads, 4096, 8192),
  // the general block kernel (1032, 12288).
  for (int64_t T : {1, 7, 33})
    for (int64_t cols : {256, 1032, 4096, 8192, 12288})
      for (int64_t n : {cols, int64_t(16), int64_t(128)}) {
        if (cols % n != 0) continue;
        Pair p;
        auto x = p.up(randn(T, cols, seed++, 2.f));
        auto w = p.up(randn(1, n, seed++, 0.2f, 1.f));
        StepMeta m = rows_meta(int(T));
        p.begin(m);
        auto o = p.out(T, cols);
        p.cpu->rmsnorm(x.c, w.c, 1e-6f, o.c);
        p.gpu->rmsnorm(x.g, w.g, 1e-6f, o.g);
        // out = bf16(bf16(x · inv) · w) rounds twice: an fp32 sum of squares in another order
        // can move the first rounding by one ulp of y, which is up to two ulps of out.
        expect_ulp(p.cmp(shape("rmsnorm group", {T, cols, n}), o), 2, 0.02);
        // in place, as the model does for q/k norms and o_norm
        p.cpu->rmsnorm(x.c, w.c, 1e-6f, x.c);
        p.gpu->rmsnorm(x.g, w.g, 1e-6f, x.g);
        expect_ulp(p.cmp(shape("rmsnorm in-place", {T, cols, n}), x), 2, 0.02);
      }
}

TEST(CudaOps, AddScaledRmsNorm) {
  REQUIRE_GPU();
  uint32_t seed = 100;
  for (int64_t T : {1, 5, 64})
    for (int64_t cols : {256, 1032, 4096, 8192, 12288}) {
      Pair p;
      auto h = p.up(randn(T, cols, seed++, 3.f));
      auto a = p.up(randn(T, cols, seed++, 1.f));
      auto w = p.up(randn(1, cols, seed++, 0.2f, 1.f));
      StepMeta m = rows_meta(int(T));
      p.begin(m);
      auto o = p.out(T, cols);
      const float alpha = 1.4f / std::sqrt(32.f);
      p.cpu->add_scaled_rmsnorm(h.c, a.c, alpha, w.c, 1e-6f, o.c);
      p.gpu->add_scaled_rmsnorm(h.g, a.g, alpha, w.g, 1e-6f, o.g);
      expect_ulp(p.cmp(shape("add_scaled_rmsnorm h", {T, cols}), h), 0, 0);
      expect_ulp(p.cmp(shape("add_scaled_rmsnorm out", {T, cols}), o), 2, 0.02);  // as RmsNorm
    }
}

// Tensor parallelism's split o_norm: each rank's Σ x² of its columns, then the gated norm of
// its columns with the whole row's sum (the model all-reduces the partials in between; here
// the two halves of a row play two ranks).
TEST(CudaOps, SplitRmsNormMulSigmoid) {
  REQUIRE_GPU();
  uint32_t seed = 700;
  for (int64_t T : {1, 9, 130})
    for (int64_t cols : {256, 4096}) {
      Pair p;
      const int64_t half = cols / 2;
      auto a0 = p.up(randn(T, half, seed++, 2.f)), a1 = p.up(randn(T, half, seed++, 2.f));
      auto z = p.up(randn(T, half, seed++, 1.f));
      auto w = p.up(randn(1, half, seed++, 0.2f, 1.f));
      StepMeta m = rows_meta(int(T));
      p.begin(m);
      auto s0 = p.out(T, 1, DType::F32), s1 = p.out(T, 1, DType::F32);
      p.cpu->row_sum_squares(a0.c, s0.c);
      p.gpu->row_sum_squares(a0.g, s0.g);
      p.cpu->row_sum_squares(a1.c, s1.c);
      p.gpu->row_sum_squares(a1.g, s1.g);
      expect_close(p.cmp(shape("row_sum_squares", {T, half}), s0), 1e-6, 1e-6);
      // The whole row's sum: the CPU's, on both (the op under test is the norm below).
      const std::vector<float> c0 = p.download(s0).first, c1 = p.download(s1).first;
      std::vector<float> total(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) total[size_t(t)] = c0[size_t(t)] + c1[size_t(t)];
      // F32 on both (p.up would store a "checkpoint" F32 tensor as bf16 on the GPU).
      auto ss = p.out(T, 1, DType::F32);
      std::memcpy(ss.c.data, total.data(), total.size() * sizeof(float));
      ASSERT_EQ(cudaMemcpy(ss.g.data, total.data(), total.size() * sizeof(float),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      auto o = p.out(T, half);
      p.cpu->rmsnorm_mul_sigmoid_ss(a0.c, ss.c, cols, w.c, 1e-6f, z.c, o.c);
      p.gpu->rmsnorm_mul_sigmoid_ss(a0.g, ss.g, cols, w.g, 1e-6f, z.g, o.g);
      // The same inv on both (the sum is given): the three roundings agree but for the fp32
      // sigmoid (expf), which moves a bf16 gate by one ulp now and then (as mul_sigmoid).
      expect_ulp(p.cmp(shape("rmsnorm_mul_sigmoid_ss", {T, cols}), o), 1, 0.01);
      p.cpu->rmsnorm_mul_sigmoid_ss(a1.c, ss.c, cols, w.c, 1e-6f, z.c, a1.c);  // in place
      p.gpu->rmsnorm_mul_sigmoid_ss(a1.g, ss.g, cols, w.g, 1e-6f, z.g, a1.g);
      expect_ulp(p.cmp(shape("rmsnorm_mul_sigmoid_ss in-place", {T, cols}), a1), 1, 0.01);
    }
}

TEST(CudaOps, Linear) {
  REQUIRE_GPU();
  struct S {
    int64_t T, K, N;
    bool f32_out;
  };
  uint32_t seed = 200;
  for (S s : {S{1, 256, 256, false}, S{3, 256, 512, false}, S{7, 40, 24, false},
              S{17, 4096, 1024, false}, S{64, 512, 4096, false}, S{300, 1024, 1024, false},
              S{1, 4096, 2048, false}, S{5, 256, 512, true}, S{2, 4096, 4096, true},
              // decode / verify rows (GEMV path, M <= 64) at the model's shapes and odd sizes
              S{16, 4096, 1000, false}, S{9, 16384, 512, false}, S{12, 1024, 77, true},
              S{4, 4096, 4096, false}, S{8, 8, 3, false}, S{24, 4096, 1000, false},
              S{33, 16384, 512, false}, S{40, 4096, 4096, false}, S{47, 1024, 77, true},
              S{64, 4096, 2048, true}, S{57, 8, 3, false}}) {
    Pair p;
    auto x = p.up(randn(s.T + 1, s.K, seed++, 1.f));
    auto w = p.up(randn(s.N, s.K, seed++, 1.f / std::sqrt(float(s.K))));
    // Rows 1.. of x: a pointer that is not 256-byte aligned, as slices are.
    Tensor xc = x.c.slice_rows(1, s.T), xg = x.g.slice_rows(1, s.T);
    auto y = p.out(s.T, s.N, s.f32_out ? DType::F32 : DType::BF16);
    p.cpu->linear(xc, w.c, y.c);
    p.gpu->linear(xg, w.g, y.g);
    expect_close(p.cmp(shape(s.f32_out ? "linear f32-out" : "linear", {s.T, s.K, s.N}), y), 4e-3,
                 1.6e-2);
  }
}

TEST(CudaOps, Elementwise) {
  REQUIRE_GPU();
  uint32_t seed = 300;
  for (int64_t T : {1, 9, 128}) {
    const int64_t C = 1536;
    Pair p;
    auto g = p.up(randn(T, C, seed++, 3.f));
    auto u = p.up(randn(T, C, seed++, 2.f));
    auto o = p.out(T, C);
    p.cpu->silu_mul(g.c, u.c, o.c);
    p.gpu->silu_mul(g.g, u.g, o.g);
    expect_ulp(p.cmp(shape("silu_mul", {T, C}), o), 1, 0.01);
    p.cpu->mul_sigmoid(u.c, g.c, o.c);
    p.gpu->mul_sigmoid(u.g, g.g, o.g);
    expect_ulp(p.cmp(shape("mul_sigmoid", {T, C}), o), 1, 0.01);
    p.cpu->silu_mul(g.c, u.c, g.c);  // in place, as the model does
    p.gpu->silu_mul(g.g, u.g, g.g);
    expect_ulp(p.cmp(shape("silu_mul in-place", {T, C}), g), 1, 0.01);
    p.cpu->div_scalar(u.c, 16.f);
    p.gpu->div_scalar(u.g, 16.f);
    expect_ulp(p.cmp(shape("div_scalar 16", {T, C}), u), 0, 0);
    p.cpu->div_scalar(u.c, 1.7f);
    p.gpu->div_scalar(u.g, 1.7f);
    expect_ulp(p.cmp(shape("div_scalar 1.7", {T, C}), u), 0, 0);
  }
}

// In both modes (fp32: inputs that are not bf16 values; fp32 bounds; gather and copy_cols
// bit-exact).
TEST(CudaOps, RopeAndGather) {
  REQUIRE_GPU();
  uint32_t seed = 400;
  for (const NumericMode mode : {NumericMode::BF16, NumericMode::F32})
    for (int hd : {16, 64, 128})
      for (int64_t past : {int64_t(0), int64_t(4093), int64_t(131000), int64_t(524000)}) {
        const bool f32 = mode == NumericMode::F32;
        Pair p(mode);
        const int64_t T = 6, C = int64_t(hd) * 4;
        auto x = f32 ? p.up(randn_f32(T, C, seed++, 1.f)) : p.up(randn(T, C, seed++, 1.f));
        StepMeta m;
        std::vector<int32_t> ids(8, 3);
        m.add_seq(ids.data(), 2, past, 0, {}, false, false);
        m.add_seq(ids.data(), 4, past + 77, 1, {}, false, false);
        m.logit_rows = {5, 0, 3};
        p.begin(m);
        p.cpu->rope(x.c, hd, 10000.0);
        p.gpu->rope(x.g, hd, 10000.0);
        const Stat sr = p.cmp(shape(f32 ? "fp32 rope" : "rope", {T, C, hd, past}), x);
        if (f32)
          expect_close(sr, kF32RelL2, kF32RelMax);
        else
          expect_ulp(sr, 1, 0.02);
        // gather on its own input (the rope outputs of the two backends may differ by an ulp)
        auto y = f32 ? p.up(randn_f32(T, C, seed++, 1.f)) : p.up(randn(T, C, seed++, 1.f));
        auto o = p.out(3, C);
        p.cpu->gather_logit_rows(y.c, o.c);
        p.gpu->gather_logit_rows(y.g, o.g);
        expect_ulp(p.cmp(shape(f32 ? "fp32 gather_logit_rows" : "gather_logit_rows", {3, C}), o), 0,
                   0);
        // a rank's columns out of gathered rows (tensor parallelism): bit-exact copies
        for (int64_t c0 : {int64_t(0), int64_t(hd), C / 2 - 3}) {
          auto cols = p.out(T, C / 2);
          p.cpu->copy_cols(y.c, c0, cols.c);
          p.gpu->copy_cols(y.g, c0, cols.g);
          expect_ulp(p.cmp(shape("copy_cols", {T, C, c0}), cols), 0, 0);
        }
      }
}

// ---- lightning (GLA) layers, greedy argmax ----------------------------------------------------

TEST(CudaOps, ArgmaxRows) {
  // Greedy picks on the device equal the CPU's (first maximum), on random logits from the
  // lm_head GEMM with fp32 output, and on all-equal rows (ties go to id 0).
  REQUIRE_GPU();
  for (int64_t V : {int64_t(800), int64_t(73448)}) {
    for (int64_t R : {int64_t(1), int64_t(7), int64_t(64)}) {
      Pair p;
      auto x = p.up(randn(R, 256, uint32_t(V + R), 1.f));
      auto w = p.up(randn(V, 256, uint32_t(V * 3 + R), 0.1f));
      auto logits = p.out(R, V, DType::F32);
      p.begin(rows_meta(int(R)));
      p.cpu->linear(x.c, w.c, logits.c);
      p.gpu->linear(x.g, w.g, logits.g);
      std::vector<int32_t> a(static_cast<size_t>(R)), b(static_cast<size_t>(R));
      p.cpu->argmax_rows(logits.c, a.data());
      p.gpu->argmax_rows(logits.g, b.data());
      // bf16-emulating CPU and the GPU GEMM may differ by an ulp; compare the GPU pick with
      // the first maximum of the GPU's own logits, and with the CPU where its top-2 is clear.
      std::vector<float> gl(static_cast<size_t>(R * V)), cl(gl.size());
      p.gpu->download_f32(logits.g, gl.data());
      p.cpu->download_f32(logits.c, cl.data());
      for (int64_t r = 0; r < R; ++r) {
        const float* row = &gl[size_t(r * V)];
        EXPECT_EQ(b[size_t(r)], int32_t(std::max_element(row, row + V) - row))
            << "V=" << V << " r=" << r;
        const float* crow = &cl[size_t(r * V)];
        std::vector<float> sorted(crow, crow + V);
        std::nth_element(sorted.begin(), sorted.begin() + 1, sorted.end(), std::greater<float>());
        if (sorted[0] - sorted[1] > 0.05f) {
          EXPECT_EQ(a[size_t(r)], b[size_t(r)]) << "V=" << V << " r=" << r;
        }
      }
      auto zero = p.up(HostMat{R, 256, std::vector<uint16_t>(size_t(R * 256), 0)});
      p.gpu->linear(zero.g, w.g, logits.g);
      p.gpu->argmax_rows(logits.g, b.data());
      for (int64_t r = 0; r < R; ++r) EXPECT_EQ(b[size_t(r)], 0) << "tie on an all-zero row";
    }
  }
}

TEST(CudaOps, LightningTiny) {
  REQUIRE_GPU();
  run_lightning(4, 16, NumericMode::BF16);
}
TEST(CudaOps, LightningHead128) {
  REQUIRE_GPU();
  run_lightning(3, 128, NumericMode::BF16);
}
TEST(CudaOps, LightningHead64) {
  REQUIRE_GPU();
  run_lightning(2, 64, NumericMode::BF16);
}

// ---- fused projections, q/k norm + RoPE, GEMV speed, recorded decode steps ---------------

// linear_multi of x [T, 512] by a [576, 512] weight into parts of 256 / 32 / 32 / 256 columns
// on both backends of p (x: bf16 values, or fp32 values in fp32 mode).
struct MultiRun {
  static constexpr int64_t kK = 512;
  const std::vector<int64_t> parts{256, 32, 32, 256};
  Pair::T2 x, w;
  std::vector<Pair::T2> ys;
  MultiRun(Pair& p, int64_t T, uint32_t& seed, bool f32)
      : x(f32 ? p.up(randn_f32(T, kK, seed++, 1.f)) : p.up(randn(T, kK, seed++, 1.f))),
        w(p.up(randn(576, kK, seed++, 1.f / std::sqrt(float(kK))))) {
    for (int64_t n : parts) ys.push_back(p.out(T, n));
    std::vector<Tensor*> yc, yg;
    for (auto& y : ys) yc.push_back(&y.c), yg.push_back(&y.g);
    p.cpu->linear_multi(x.c, w.c, yc);
    p.gpu->linear_multi(x.g, w.g, yg);
  }
};

// In both modes (fp32: inputs that are not bf16 values, cuBLASLt per part).
TEST(CudaOps, LinearMulti) {
  REQUIRE_GPU();
  uint32_t seed = 250;
  for (const NumericMode mode : {NumericMode::BF16, NumericMode::F32})
    for (int64_t T : {1, 3, 8, 16, 17, 40, 64}) {
      const bool f32 = mode == NumericMode::F32;
      Pair p(mode);
      const int64_t K = MultiRun::kK;
      const MultiRun r(p, T, seed, f32);
      const auto& parts = r.parts;
      const auto& ys = r.ys;
      for (size_t i = 0; i < parts.size(); ++i)
        expect_close(p.cmp(shape(f32 ? "fp32 linear_multi part" : "linear_multi part",
                                 {T, K, int64_t(i), parts[i]}),
                           ys[i]),
                     f32 ? kF32RelL2 : 4e-3, f32 ? kF32RelMax : 1.6e-2);
      // One part's numbers equal a plain linear() on its row slice (bit for bit on the GPU).
      auto y1 = p.out(T, 32);
      p.gpu->linear(r.x.g, r.w.g.slice_rows(256, 32), y1.g);
      std::vector<float> a(size_t(T * 32)), b(size_t(T * 32));
      p.gpu->download_f32(ys[1].g, a.data());
      p.gpu->download_f32(y1.g, b.data());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
          << "linear_multi vs linear, T=" << T;
    }
}

// The fused gate_up GEMV + SiLU (M <= 64: one kernel) gives the bits of the two-op default
// (linear_multi then silu_mul) on the GPU, and the CPU's numbers within GEMM round-off.
TEST(CudaOps, LinearSiluMul) {
  REQUIRE_GPU();
  uint32_t seed = 270;
  for (const NumericMode mode : {NumericMode::BF16, NumericMode::F32})
    for (int64_t I : {256, 1056})
      for (int64_t T : {1, 5, 8, 16, 24, 40, 64}) {
        const bool f32 = mode == NumericMode::F32;
        Pair p(mode);
        const int64_t K = 512;
        auto x = f32 ? p.up(randn_f32(T, K, seed++, 1.f)) : p.up(randn(T, K, seed++, 1.f));
        auto w = p.up(randn(2 * I, K, seed++, 2.f / std::sqrt(float(K))));
        auto g = p.out(T, I), u = p.out(T, I), g2 = p.out(T, I);
        p.cpu->linear_silu_mul(x.c, w.c, g.c, u.c);
        p.gpu->linear_silu_mul(x.g, w.g, g.g, u.g);
        expect_close(p.cmp(shape(f32 ? "fp32 linear_silu_mul" : "linear_silu_mul", {T, K, I}), g),
                     f32 ? kF32RelL2 : 4e-3, f32 ? kF32RelMax : 1.6e-2);
        p.gpu->Backend::linear_silu_mul(x.g, w.g, g2.g, u.g);  // linear_multi, then silu_mul
        expect_same_bits(*p.gpu, g.g, *p.gpu, g2.g,
                         shape(f32 ? "fp32 fused vs two ops" : "fused vs two ops", {T, K, I}));
      }
}

// Decode-only steps of 17..64 rows: one cuBLASLt GEMM over the stacked weight, then its parts
// (linear_multi) or silu(gate) · up (linear_silu_mul) (GemmDispatch::stacked_gemm). Every part equals the same
// columns of linear() on the whole stacked weight, bit for bit (a weight row's arithmetic does
// not depend on N or on its tile); linear_silu_mul equals its two-op default; both are close
// to the CPU.
TEST(CudaOps, WideDecodeSteps) {
  REQUIRE_GPU();
  uint32_t seed = 290;
  for (int64_t T : {17, 40, 64}) {
    Pair p;
    p.begin_decode_step(T);
    const int64_t K = MultiRun::kK;
    const MultiRun r(p, T, seed, false);
    const auto& parts = r.parts;
    const auto& ys = r.ys;
    const auto& x = r.x;
    auto full = p.out(T, 576);
    p.gpu->linear(x.g, r.w.g, full.g);
    std::vector<float> whole(size_t(T * 576));
    p.gpu->download_f32(full.g, whole.data());
    int64_t c0 = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      expect_close(p.cmp(shape("wide linear_multi part", {T, K, int64_t(i), parts[i]}), ys[i]),
                   4e-3, 1.6e-2);
      std::vector<float> part(size_t(T * parts[i]));
      p.gpu->download_f32(ys[i].g, part.data());
      int64_t differ = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < parts[i]; ++c)
          differ += part[size_t(t * parts[i] + c)] != whole[size_t(t * 576 + c0 + c)];
      EXPECT_EQ(differ, 0) << "part " << i << " vs linear() on the stacked weight, T=" << T;
      c0 += parts[i];
    }
    // The lm_head: fp32 logits of bf16-rounded values (SPEC §4.7), close to the CPU's (on
    // Hopper the skinny GEMM takes these rows, elsewhere cuBLASLt and a rounding pass).
    auto logits = p.out(T, 576, DType::F32);
    p.cpu->linear(x.c, r.w.c, logits.c);
    p.gpu->linear(x.g, r.w.g, logits.g);
    expect_close(p.cmp(shape("wide lm_head", {T, K, 576}), logits), 4e-3, 1.6e-2);
    std::vector<float> lg(size_t(T * 576));
    p.gpu->download_f32(logits.g, lg.data());
    int64_t unrounded = 0;
    for (float v : lg) unrounded += round_bf16(v) != v;
    EXPECT_EQ(unrounded, 0) << "logits that are not bf16 values, T=" << T;
    const int64_t I = 1056;
    auto w2 = p.up(randn(2 * I, K, seed++, 2.f / std::sqrt(float(K))));
    auto g = p.out(T, I), u = p.out(T, I), g2 = p.out(T, I);
    p.cpu->linear_silu_mul(x.c, w2.c, g.c, u.c);
    p.gpu->linear_silu_mul(x.g, w2.g, g.g, u.g);
    expect_close(p.cmp(shape("wide linear_silu_mul", {T, K, I}), g), 4e-3, 1.6e-2);
    p.gpu->Backend::linear_silu_mul(x.g, w2.g, g2.g, u.g);  // linear_multi, then silu_mul
    expect_same_bits(*p.gpu, g.g, *p.gpu, g2.g, shape("wide fused vs two ops", {T, K, I}));
  }
}

// In both modes (fp32: q, k, norm weights that are not bf16 values; fp32 bounds).
TEST(CudaOps, QkNormRope) {
  REQUIRE_GPU();
  uint32_t seed = 450;
  for (const NumericMode mode : {NumericMode::BF16, NumericMode::F32})
    for (int hd : {16, 64, 128})
      for (int64_t past : {int64_t(0), int64_t(4093), int64_t(131000), int64_t(524000)}) {
        const bool f32 = mode == NumericMode::F32;
        Pair p(mode);
        auto in = [&](int64_t r, int64_t c, float scale, float mean) {
          return f32 ? p.up(randn_f32(r, c, seed++, scale, mean))
                     : p.up(randn(r, c, seed++, scale, mean));
        };
        const int64_t T = 5, C = int64_t(hd) * 6;
        auto q = in(T, C, 2.f, 0.f);
        auto k = in(T, C, 1.f, 0.f);
        auto qn = in(1, hd, 0.2f, 1.f);
        auto kn = in(1, hd, 0.2f, 1.f);
        StepMeta m;
        std::vector<int32_t> ids(8, 3);
        m.add_seq(ids.data(), 2, past, 0, {}, false, false);
        m.add_seq(ids.data(), 3, past + 9, 1, {}, false, false);
        p.begin(m);
        p.cpu->qk_norm_rope(q.c, k.c, qn.c, kn.c, 1e-6f, hd, 10000.0);
        p.gpu->qk_norm_rope(q.g, k.g, qn.g, kn.g, 1e-6f, hd, 10000.0);
        const Stat sq =
            p.cmp(shape(f32 ? "fp32 qk_norm_rope q" : "qk_norm_rope q", {T, C, hd, past}), q);
        const Stat sk =
            p.cmp(shape(f32 ? "fp32 qk_norm_rope k" : "qk_norm_rope k", {T, C, hd, past}), k);
        for (const Stat& st : {sq, sk}) {
          if (f32)
            expect_close(st, kF32RelL2, kF32RelMax);
          else
            expect_ulp(st, 1, 0.03);
        }
      }
}

}  // namespace
}  // namespace sala::test
