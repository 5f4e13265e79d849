// The W4A16 skinny GEMM of decode steps of 17..64 rows on Hopper (cuda_skinny_int4_sm90.cu)
// against the CPU oracle (CpuBackend::linear_int4) and its own invariants:
//   MatchesCpu     decode-only steps of 17..64 rows through GemmDispatch on the model's shapes
//                  and odd ones, groups 128 / 256: plain bf16 outputs and fp32 logits (the
//                  bf16-rounded values), linear_multi parts (== the plain outputs, bit for bit),
//                  linear_silu_mul (bf16(bf16(silu(g)) · u)) against the CPU's composition
//   SplitsAndRows  direct launches: every K split gives the bits of the automatic one, and
//                  the rows of M = 1, 9, 17 equal those of 64 (the bits depend only on the row)
//   Speed          µs per launch at M = 1, 8, 16, 17, 32, 64 on the 9B's projections beside the
//                  int4 GEMV's at the same M; the 9B's projections per 1- and 64-row step
// Skips without an sm_90 GPU: the kernel is Hopper-only (elsewhere the GEMV takes these rows).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_skinny_sm90.h"
#include "cuda_test_util.h"
#include "int4_test_util.h"

namespace sala::test {
namespace {

#define REQUIRE_SM90()                                                                       \
  do {                                                                                       \
    REQUIRE_GPU();                                                                           \
    if (!cuda::skinny_sm90_available()) GTEST_SKIP() << "no sm_90 GPU: no int4 skinny GEMM"; \
  } while (0)

// y of a direct launch: [M, N] as floats (bf16 outputs).
std::vector<float> launch(Pair& p, const Tensor& x, const Weight& w, int M, int splits, void* ws) {
  Tensor y = p.gpu->alloc(M, w.rows, DType::BF16);
  cuda::GemvOut o{};
  o.y[0] = y.data, o.end[0] = w.rows, o.cols[0] = w.rows, o.nparts = 1;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cuda::launch_skinny_int4_sm90(static_cast<const cuda::bf16*>(x.data), x.cols,
                                static_cast<const uint32_t*>(w.data), w.scales, w.rows, int(w.cols),
                                w.group, M, o, ws, 0, splits);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> r(size_t(M * w.rows));
  p.gpu->download_f32(y, r.data());
  return r;
}

TEST(CudaInt4Skinny, MatchesCpu) {
  REQUIRE_SM90();
  Pair p;
  void* ws = nullptr;  // the direct launches' split workspace
  ASSERT_EQ(cudaMalloc(&ws, cuda::skinny_sm90_workspace_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0, cuda::skinny_sm90_workspace_bytes()), cudaSuccess);
  uint32_t seed = 7100;
  struct S {
    int64_t N, K;
    int32_t group;
  };
  for (S s : {S{4096, 4096, 128}, S{16384, 4096, 128}, S{4096, 16384, 128}, S{1000, 2048, 256},
              S{77, 1024, 128}}) {
    const Int4Host q = weight(s.N, s.K, s.group, seed++);
    const Weight wc = upload_int4_host(*p.cpu, q), wg = upload_int4_host(*p.gpu, q);
    auto x = p.up(activations(s.K, seed++));
    for (int64_t M : {17, 24, 33, 40, 57, 64}) {
      ASSERT_TRUE(cuda::skinny_int4_sm90_supported(x.g.data, s.K, wg.data, s.K, s.group, M))
          << s.N << " x " << s.K;
      p.begin_decode_step(M);
      const std::string name = shape("int4 skinny", {s.N, s.K, s.group, M});
      const std::vector<float> y = run_linear(*p.gpu, x.g, wg, 0, M, DType::BF16);
      expect_int4_close(name, y, run_linear(*p.cpu, x.c, wc, 0, M, DType::F32), M, s.N, true, 2);
      EXPECT_EQ(y, run_linear(*p.gpu, x.g, wg, 0, M, DType::F32)) << name << ": fp32 logits";
      // The skinny kernel's own bits (a GEMV taking these rows would pass the bound above).
      EXPECT_EQ(y, launch(p, x.g, wg, int(M), 0, ws)) << name << ": not the skinny kernel's";
      // Three parts of the outputs (the middle one inside a 128-row tile): the same values.
      const std::vector<int64_t> parts = {s.N / 2 - 13, 26, s.N - s.N / 2 - 13};
      std::vector<Tensor> ys;
      std::vector<Tensor*> yp;
      for (int64_t c : parts) ys.push_back(p.gpu->alloc(M, c, DType::BF16));
      for (Tensor& t : ys) yp.push_back(&t);
      p.gpu->linear_multi(x.g.slice_rows(0, M), wg, yp);
      int64_t c0 = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        std::vector<float> h(size_t(M * parts[i]));
        p.gpu->download_f32(ys[i], h.data());
        for (int64_t m = 0; m < M; ++m)
          ASSERT_EQ(0, std::memcmp(h.data() + m * parts[i], y.data() + m * s.N + c0,
                                   size_t(parts[i]) * 4))
              << name << ": part " << i << " row " << m;
        c0 += parts[i];
      }
    }
  }
  // silu_pair: [gate; up] stacked, against the CPU's linear_silu_mul.
  for (int64_t I : {int64_t(1024), int64_t(16384)}) {
    const int64_t K = 4096;
    const Int4Host q = weight(2 * I, K, 128, seed++);
    const Weight gc = upload_int4_host(*p.cpu, q), gg = upload_int4_host(*p.gpu, q);
    auto x = p.up(activations(K, seed++));
    for (int64_t M : {17, 40, 64}) {
      p.begin_decode_step(M);
      auto g = p.out(M, I), u = p.out(M, I);
      p.gpu->linear_silu_mul(x.g.slice_rows(0, M), gg, g.g, u.g);
      p.cpu->linear_silu_mul(x.c.slice_rows(0, M), gc, g.c, u.c);
      auto [c, e] = p.download(g);
      expect_int4_close(shape("int4 skinny silu_pair", {M, K, I}), e, c, M, I, true, 2);
    }
  }
  cudaFree(ws);
}

TEST(CudaInt4Skinny, SplitsAndRows) {
  REQUIRE_SM90();
  Pair p;
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, cuda::skinny_sm90_workspace_bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0, cuda::skinny_sm90_workspace_bytes()), cudaSuccess);
  uint32_t seed = 7200;
  for (auto [N, K] : {std::pair<int64_t, int64_t>{4096, 4096}, {1000, 16384}, {300, 2048}}) {
    const Int4Host q = weight(N, K, 128, seed++);
    const Weight w = upload_int4_host(*p.gpu, q);
    auto x = p.up(activations(K, seed++));
    const std::string name = shape("int4 skinny", {N, K});
    const std::vector<float> ref = launch(p, x.g, w, 64, 0, ws);
    for (int s : {1, 2, 4}) {
      if (K % (s * 512) != 0) continue;  // splits divide the 4 chunks of 64-k stages
      EXPECT_EQ(ref, launch(p, x.g, w, 64, s, ws)) << name << ": " << s << " splits";
    }
    for (int M : {1, 9, 17}) {
      const std::vector<float> few = launch(p, x.g, w, M, 0, ws);
      EXPECT_EQ(0, std::memcmp(few.data(), ref.data(), few.size() * 4))
          << name << ": the rows of M = " << M << " differ from M = 64";
    }
  }
  cudaFree(ws);
}

TEST(CudaInt4Skinny, Speed) {
  REQUIRE_SM90();
  std::printf("\n[ skinny int4 ] %-18s %4s %10s %10s %12s\n", "shape N x K", "M", "us", "gemv us",
              "GB/s packed");
  const HostMat hx = randn(64, 16384, 7300, 1.f);
  void *x = nullptr, *y = nullptr, *ws = nullptr;
  cudaMalloc(&x, hx.bits.size() * 2);
  cudaMemcpy(x, hx.bits.data(), hx.bits.size() * 2, cudaMemcpyHostToDevice);
  cudaMalloc(&y, size_t(64) * 32768 * 2);
  cudaMalloc(&ws, cuda::skinny_sm90_workspace_bytes());
  cudaMemset(ws, 0, cuda::skinny_sm90_workspace_bytes());
  cuda::skinny_int4_sm90_init();
  cuda::gemv_int4_init();
  double step_us[2] = {}, gemv_step_us[2] = {};  // per 9B decode step at M = 1, 64
  for (const SpeedShape s : kShapes) {
    const Int4SpeedWeights sw(s.N, s.K);
    cuda::GemvOut o{};
    o.y[0] = y, o.end[0] = s.N, o.cols[0] = s.N, o.nparts = 1;
    for (int M : {1, 8, 16, 17, 32, 64}) {  // 1..16: the GEMV's rows, for the crossover
      const double us = time_us(
          [&](int i) {
            cuda::launch_skinny_int4_sm90(static_cast<const cuda::bf16*>(x), s.K, sw.words(i),
                                          sw.scale(i), s.N, int(s.K), 128, M, o, ws, 0);
          },
          60);
      const double gemv = time_us(
          [&](int i) {
            cuda::launch_gemv_int4(static_cast<const cuda::bf16*>(x), s.K, sw.words(i), sw.scale(i),
                                   s.N, int(s.K), 128, M, o, 0);
          },
          60);
      if (M == 1 || M == 64) {
        step_us[M == 64] += us * double(s.per_forward);
        gemv_step_us[M == 64] += gemv * double(s.per_forward);
      }
      std::printf("[ skinny int4 ] %8lld x %-8lld %4d %10.2f %10.2f %12.0f\n", (long long)s.N,
                  (long long)s.K, M, us, gemv, double(sw.packed) / us / 1e3);
    }
  }
  for (int b = 0; b < 2; ++b)
    std::printf(
        "[ skinny int4 ] 9B projections at M = %d, one decode step: %.3f ms (int4 GEMV: "
        "%.3f ms)\n",
        b ? 64 : 1, step_us[b] / 1e3, gemv_step_us[b] / 1e3);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(x);
  cudaFree(y);
  cudaFree(ws);
}

}  // namespace
}  // namespace sala::test
