// The Hopper skinny GEMM (cuda_skinny_sm90.cu) against the CPU oracle, launched directly:
//   Sm90MatchesCpuAndIsRowInvariant  shapes with partial 128-row tiles and 1..4 K splits,
//       M = 1, 17, 40, 64: close to the CPU's bf16 linear; row m's bits equal for every M and
//       every split; fp32 output holds the bf16 output's values; the first 576 weight rows
//       alone (another N, so another split) give the same bits as within the whole weight.
//   SpeculativeStepsThroughDispatch  verify steps of 17..64 rows (5-row calls) through the
//       backend, bf16 and W8A8 FP8 weights: linear_multi's parts equal linear() on the whole
//       weight, linear_silu_mul equals its two-op default (linear_multi, then silu_mul), bit
//       for bit; all close to the CPU; odd part widths and a gate of 1,056 columns (partial
//       64-row halves).
//   Fp8RowInvariantAcrossSplitsAndCloseToGemv  the FP8 kernel on codes: rows bit-equal for
//       every M and K split, within 4e-3 rel L2 of the FP8 ring GEMV.
// Skipped without an sm_90 GPU (the kernel exists only there; GemmDispatch falls back).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_skinny_sm90.h"
#include "cuda_test_util.h"
#include "fp8_gemm_test_util.h"

namespace sala {
namespace {
using namespace test;

cuda::GemvOut out1(void* y, int64_t N, bool f32) {
  cuda::GemvOut o{};
  o.y[0] = y;
  o.end[0] = N;
  o.cols[0] = N;
  o.nparts = 1;
  o.f32 = f32;
  return o;
}

TEST(CudaSkinny, Sm90MatchesCpuAndIsRowInvariant) {
  REQUIRE_GPU();
  if (!cuda::skinny_sm90_available()) GTEST_SKIP() << "not an sm_90 GPU";
  Pair p;
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, cuda::skinny_sm90_workspace_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0, cuda::skinny_sm90_workspace_bytes()), cudaSuccess);
  uint32_t seed = 700;
  struct S {
    int64_t N, K;
  };
  for (S s : {S{576, 4096}, S{1024, 4096}, S{3000, 2048}, S{8192, 1024}, S{640, 256}}) {
    auto w = p.up(randn(s.N, s.K, seed++, 1.f / 64.f));
    auto x = p.up(randn(64, s.K, seed++, 1.f));
    std::vector<float> ref64;  // every split and M: the same bits
    for (int splits : {0, 1, 2, 4}) {
      // Forced splits need whole chunks (4 of whole 64-k stages) and the workspace's bound.
      if (splits > 1 && (s.N > 2048 || s.K / 64 < splits)) continue;
      for (int M : {64, 40, 17, 1}) {
        p.begin_decode_step(M);
        const Tensor xc = x.c.slice_rows(0, M);
        auto y = p.out(M, s.N), yf = p.out(M, s.N, DType::F32);
        p.cpu->linear(xc, w.c, y.c);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        cuda::launch_skinny_sm90(static_cast<const __nv_bfloat16*>(x.g.data), s.K,
                                 static_cast<const __nv_bfloat16*>(w.g.data), s.N, int(s.K), M,
                                 out1(y.g.data, s.N, false), ws, nullptr, splits);
        cuda::launch_skinny_sm90(static_cast<const __nv_bfloat16*>(x.g.data), s.K,
                                 static_cast<const __nv_bfloat16*>(w.g.data), s.N, int(s.K), M,
                                 out1(yf.g.data, s.N, true), ws, nullptr, splits);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::string what = "skinny sm90 splits " + std::to_string(splits);
        expect_close(p.cmp(shape(what.c_str(), {M, s.K, s.N}), y), 4e-3, 1.6e-2);
        std::vector<float> got(size_t(M * s.N)), gotf(size_t(M * s.N));
        p.gpu->download_f32(y.g, got.data());
        p.gpu->download_f32(yf.g, gotf.data());
        EXPECT_EQ(0, std::memcmp(got.data(), gotf.data(), got.size() * 4)) << what << " fp32 out";
        if (ref64.empty()) ref64 = got;
        EXPECT_EQ(0, std::memcmp(got.data(), ref64.data(), got.size() * 4))
            << what << " N " << s.N << " K " << s.K << ": rows of M=" << M
            << " differ from M=64 of the heuristic's split";
        if (M == 40 && s.N > 576) {  // the first 576 weight rows as their own weight
          auto yp = p.out(M, 576);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          cuda::launch_skinny_sm90(static_cast<const __nv_bfloat16*>(x.g.data), s.K,
                                   static_cast<const __nv_bfloat16*>(w.g.data), 576, int(s.K), M,
                                   out1(yp.g.data, 576, false), ws, nullptr, 0);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          std::vector<float> part(size_t(M * 576));
          p.gpu->download_f32(yp.g, part.data());
          int64_t differ = 0;
          for (int64_t m = 0; m < M; ++m)
            differ += std::memcmp(&part[size_t(m * 576)], &got[size_t(m * s.N)], 576 * 4) != 0;
          EXPECT_EQ(differ, 0) << what << " N " << s.N << ": rows of the 576-row slice differ";
        }
      }
    }
  }
  cudaFree(ws);
}

// FP8 codes (valid e4m3, no NaN) and scales straight into the kernel: every M and every K
// split give row m the same bits; close to the FP8 ring GEMV (the CPU-checked path).
TEST(CudaSkinny, Fp8RowInvariantAcrossSplitsAndCloseToGemv) {
  REQUIRE_GPU();
  if (!cuda::skinny_sm90_available()) GTEST_SKIP() << "not an sm_90 GPU";
  const int64_t N = 1000, K = 2048;
  std::vector<uint8_t> hw(static_cast<size_t>(N * K)), hx(static_cast<size_t>(64 * K));
  uint32_t st = 5;
  auto next = [&] { return st = st * 1664525u + 1013904223u; };
  for (auto* v : {&hw, &hx})
    for (auto& c : *v)  // sign, exponent 3..11, mantissa: finite e4m3 codes
      c = uint8_t((next() >> 24 & 0x80) | ((3 + (next() >> 20) % 9) << 3) | (next() >> 16 & 7));
  std::vector<float> hsw(static_cast<size_t>(N)), hsx(64);
  for (auto& f : hsw) f = float(1 + (next() >> 16) % 100) / 2000.f;
  for (auto& f : hsx) f = float(1 + (next() >> 16) % 100) / 200.f;
  uint8_t *w = nullptr, *x = nullptr;
  float *sw = nullptr, *sx = nullptr;
  __nv_bfloat16 *y = nullptr, *yg = nullptr;
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&w, hw.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&x, hx.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&sw, hsw.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&sx, hsx.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y, size_t(64 * N) * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&yg, size_t(64 * N) * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ws, cuda::skinny_sm90_workspace_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0, cuda::skinny_sm90_workspace_bytes()), cudaSuccess);
  cudaMemcpy(w, hw.data(), hw.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(x, hx.data(), hx.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(sw, hsw.data(), hsw.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(sx, hsx.data(), hsx.size() * 4, cudaMemcpyHostToDevice);
  cuda::gemv_fp8_init();
  auto bits = [&](const __nv_bfloat16* d, int M) {
    std::vector<uint16_t> h(size_t(M * N));
    cudaMemcpy(h.data(), d, h.size() * 2, cudaMemcpyDeviceToHost);
    return h;
  };
  std::vector<uint16_t> ref;
  for (int splits : {0, 1, 2, 4})
    for (int M : {64, 40, 17, 1}) {
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      cuda::launch_skinny_fp8_sm90(x, K, sx, w, sw, N, int(K), M, out1(y, N, false), ws, nullptr,
                                   splits);
      cuda::launch_gemv_fp8(x, K, sx, w, sw, N, int(K), M, out1(yg, N, false), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = bits(y, M), gemv = bits(yg, M);
      if (ref.empty()) ref = got;
      EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 2))
          << "fp8 splits " << splits << " M " << M << ": rows differ from M=64 unsplit-default";
      double num = 0, den = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        auto f = [](uint16_t b) {
          const uint32_t u = uint32_t(b) << 16;
          float v;
          std::memcpy(&v, &u, 4);
          return double(v);
        };
        num += (f(got[i]) - f(gemv[i])) * (f(got[i]) - f(gemv[i]));
        den += f(gemv[i]) * f(gemv[i]);
      }
      EXPECT_LE(std::sqrt(num / den), 4e-3) << "fp8 splits " << splits << " M " << M;
    }
  for (void* ptr : {(void*)w, (void*)x, (void*)sw, (void*)sx, (void*)y, (void*)yg, ws})
    cudaFree(ptr);
}

TEST(CudaSkinny, SpeculativeStepsThroughDispatch) {
  REQUIRE_GPU();
  if (!cuda::skinny_sm90_available()) GTEST_SKIP() << "not an sm_90 GPU";
  uint32_t seed = 800;
  const int64_t K = 1024, I = 1056;
  const std::vector<int64_t> parts{200, 56, 64, 256};
  for (const bool fp8 : {false, true})
  for (int calls : {4, 8, 12}) {  // 20, 40, 60 rows
    Pair p;
    // The same weight in both backends: bf16, or W8A8 FP8 quantized from it at upload.
    auto weight = [&](int64_t rows) {
      const HostMat h = randn(rows, K, seed++, 1.f / 32.f);
      if (!fp8) {
        auto t = p.up(h);
        return std::pair<Weight, Weight>{Weight(t.c), Weight(t.g)};
      }
      const W2 q = up_fp8(p, h);
      return std::pair<Weight, Weight>{q.c, q.g};
    };
    const std::string fmt = fp8 ? "fp8 " : "bf16 ";
    StepMeta m;
    std::vector<int32_t> ids(5, 5);
    for (int i = 0; i < calls; ++i) m.add_seq(ids.data(), 5, 100 + i, i, {}, true, true);
    p.begin(m);
    const int64_t T = 5 * calls;
    auto x = p.up(randn(T, K, seed++, 1.f));
    const auto w = weight(576), w2 = weight(2 * I);
    auto whole = p.out(T, 576);
    p.gpu->linear(x.g, w.second, whole.g);
    p.cpu->linear(x.c, w.first, whole.c);
    expect_close(p.cmp(shape((fmt + "skinny step linear").c_str(), {T, K, 576}), whole), 4e-3,
                 1.6e-2);
    std::vector<float> all(size_t(T * 576));
    p.gpu->download_f32(whole.g, all.data());
    std::vector<Pair::T2> ys;
    for (int64_t n : parts) ys.push_back(p.out(T, n));
    std::vector<Tensor*> yg;
    for (auto& y : ys) yg.push_back(&y.g);
    p.gpu->linear_multi(x.g, w.second, yg);
    int64_t c0 = 0, differ = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      std::vector<float> part(size_t(T * parts[i]));
      p.gpu->download_f32(ys[i].g, part.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < parts[i]; ++c)
          differ += part[size_t(t * parts[i] + c)] != all[size_t(t * 576 + c0 + c)];
      c0 += parts[i];
    }
    EXPECT_EQ(differ, 0) << fmt << "parts vs linear() on the stacked weight, T=" << T;
    auto g = p.out(T, I), u = p.out(T, I), g2 = p.out(T, I);
    p.cpu->linear_silu_mul(x.c, w2.first, g.c, u.c);
    p.gpu->linear_silu_mul(x.g, w2.second, g.g, u.g);
    expect_close(p.cmp(shape((fmt + "skinny step linear_silu_mul").c_str(), {T, K, I}), g), 4e-3,
                 1.6e-2);
    p.gpu->Backend::linear_silu_mul(x.g, w2.second, g2.g, u.g);  // linear_multi, then silu_mul
    expect_same_bits(*p.gpu, g.g, *p.gpu, g2.g,
                     shape((fmt + "skinny fused vs two ops").c_str(), {T, K, I}));
  }
}

}  // namespace
}  // namespace sala
