// The FP8 GEMM's CUTLASS configuration for decode-only steps of 32..64 rows
// (cuda_gemm_fp8_sm90.cu, Fp8Sm90Config::kDecode) against the CPU oracle, and its speed beside
// the production path's at the 9B's projections. Part of test_cuda_ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_gemm_fp8_sm90.h"
#include "backend/cuda/cuda_kernels.h"
#include "cuda_test_util.h"
#include "fp8_gemm_test_util.h"

namespace sala::test {
namespace {

// ---- CUTLASS configurations for decode-only steps of 17..64 rows ----
constexpr cuda::Fp8Sm90Config kDecodeConfigs[] = {cuda::Fp8Sm90Config::kDecode};
const char* config_name(cuda::Fp8Sm90Config) { return "64x128"; }

// x [T, K] quantized on the GPU as the decode path does (codes, sx).
struct Quantized {
  DevBuf codes, sx;
  Quantized(const Pair::T2& x, int64_t T, int64_t K) : codes(size_t(T * K)), sx(size_t(T) * 4) {
    cuda::launch_quantize_rows_fp8(static_cast<const cuda::bf16*>(x.g.data), T, K, K,
                                   static_cast<uint8_t*>(codes.p), static_cast<float*>(sx.p),
                                   nullptr);
  }
};

// Each configuration at decode-step sizes against the CPU oracle (the same criteria as the
// cuBLASLt and prefill paths: fp32 order and the FP8 mainloop's bounded truncation).
TEST(CudaFp8, DecodeConfigs) {
  REQUIRE_GPU();
  DevBuf ws(size_t(64) << 20);
  uint32_t seed = 1500;
  const std::vector<std::pair<int64_t, int64_t>> projections{
      {4096, 4096}, {4096, 16384}, {16384, 4096}, {48, 520}};  // (K, N)
  for (int64_t T : {17, 40, 64})
    for (auto [K, N] : projections) {
      Pair p;
      const W2 w = up_fp8(p, randn(N, K, seed++, 1.f / std::sqrt(float(K))));
      auto x = p.up(randn(T, K, seed++, 1.f));
      auto y = p.out(T, N);
      p.cpu->linear(x.c, w.c, y.c);
      const Quantized q(x, T, K);
      for (const auto c : kDecodeConfigs) {
        ASSERT_EQ(cudaMemset(y.g.data, 0xff, size_t(T * N) * 2), cudaSuccess);
        ASSERT_TRUE(cuda::launch_fp8_scaled_gemm_sm90_config(
            c, static_cast<const uint8_t*>(q.codes.p), static_cast<const float*>(q.sx.p),
            static_cast<const uint8_t*>(w.g.data), w.g.scales, static_cast<cuda::bf16*>(y.g.data),
            T, N, K, ws.p, size_t(64) << 20, nullptr))
            << config_name(c) << " refused " << T << " x " << K << " x " << N;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        auto [cpu, gpu] = p.download(y);
        const std::string what = std::string("fp8 decode gemm ") + config_name(c);
        expect_fp8_close(shape(what.c_str(), {T, K, N}), gpu, cpu);
      }
    }
}

// µs per projection of a decode-only step of M rows: the production path (p.gpu->linear:
// quantize, then CUTLASS where launch_fp8_scaled_gemm_sm90 takes the shape, else cuBLASLt's
// fp32 sums and the scaling kernel) vs quantize + the CUTLASS decode configuration; and the
// sum over a 9B step's projections (24 lightning q/k/v/gate stacks, 8 sparse ones, o, gate_up,
// down in all 32).
TEST(CudaFp8, DecodeConfigsSpeed) {
  REQUIRE_GPU();
  struct Proj {
    int64_t K, N;
    int per_step;
  };
  const Proj projs[] = {{4096, 16384, 24}, {4096, 8704, 8}, {4096, 4096, 32}, {4096, 32768, 32},
                        {16384, 4096, 32}};
  DevBuf ws(size_t(64) << 20);
  const size_t ws_bytes = size_t(64) << 20;
  std::printf("\n[ fp8 decode gemm ] %-14s %3s %11s %9s %10s\n", "K x N", "M", "cuBLASLt",
              "quantize", config_name(kDecodeConfigs[0]));
  for (int64_t M : {17, 32, 64}) {
    double step[3] = {};
    for (const Proj& pr : projs) {
      Pair p;
      p.begin_decode_step(M);
      // Weights rotated past the 50 MB L2, as a step's 200+ distinct projections are.
      const int copies = int(std::clamp<int64_t>(120'000'000 / (pr.K * pr.N) + 1, 1, 4));
      const HostMat hw = randn(pr.N, pr.K, 1600, 0.02f);
      std::vector<W2> w;
      for (int i = 0; i < copies; ++i) w.push_back(up_fp8(p, hw));
      auto x = p.up(randn(M, pr.K, 1700, 1.f));
      auto y = p.out(M, pr.N);
      auto time_us = [&](auto&& f) {
        for (int i = 0; i < copies; ++i) f(i);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const int reps = 16 * copies;
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) f(r % copies);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                   .count() / reps;
      };
      double t[3];
      t[0] = time_us([&](int i) { p.gpu->linear(x.g, w[size_t(i)].g, y.g); });
      DevBuf codes(size_t(M * pr.K)), sx(size_t(M) * 4);
      t[1] = time_us([&](int) {
        cuda::launch_quantize_rows_fp8(static_cast<const cuda::bf16*>(x.g.data), M, pr.K, pr.K,
                                       static_cast<uint8_t*>(codes.p), static_cast<float*>(sx.p),
                                       nullptr);
      });
      t[2] = t[1] + time_us([&](int i) {
          EXPECT_TRUE(cuda::launch_fp8_scaled_gemm_sm90_config(
              kDecodeConfigs[0], static_cast<const uint8_t*>(codes.p),
              static_cast<const float*>(sx.p), static_cast<const uint8_t*>(w[size_t(i)].g.data),
              w[size_t(i)].g.scales, static_cast<cuda::bf16*>(y.g.data), M, pr.N, pr.K, ws.p,
              ws_bytes, nullptr));
        });
      std::printf("[ fp8 decode gemm ] %5lld x %-6lld %3lld %9.2f us %7.2f us %7.2f us\n",
                  (long long)pr.K, (long long)pr.N, (long long)M, t[0], t[1], t[2]);
      for (int i = 0; i < 3; ++i) step[i] += t[i] * pr.per_step;
    }
    std::printf("[ fp8 decode gemm ] 9B projections, M = %lld: linear() %.3f ms, quantize + %s "
                "%.3f ms\n", (long long)M, step[0] / 1e3, config_name(kDecodeConfigs[0]),
                step[2] / 1e3);
  }
}

}  // namespace
}  // namespace sala::test
