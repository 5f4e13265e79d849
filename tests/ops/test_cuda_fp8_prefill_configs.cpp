// The FP8 GEMM's CUTLASS configurations for prefill runs (cuda_gemm_fp8_sm90.cu: kPrefill, the
// production one, and the candidates of Fp8Sm90Config) against the CPU oracle, and their speed
// at a prompt chunk of 2,048 rows on the 9B's projections. Part of test_cuda_ops.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_gemm_fp8_sm90.h"
#include "backend/cuda/cuda_kernels.h"
#include "cuda_test_util.h"
#include "fp8_gemm_test_util.h"

namespace sala::test {
namespace {

using cuda::Fp8Sm90Config;
constexpr Fp8Sm90Config kConfigs[] = {Fp8Sm90Config::kPrefill, Fp8Sm90Config::kPrefill128x256,
                                       Fp8Sm90Config::kPrefill256x128,
                                       Fp8Sm90Config::kPrefillPingpong};
const char* config_name(Fp8Sm90Config c) {
  switch (c) {
    case Fp8Sm90Config::kPrefill: return "128x128c2";
    case Fp8Sm90Config::kPrefill128x256: return "128x256c2";
    case Fp8Sm90Config::kPrefill256x128: return "256x128c2";
    case Fp8Sm90Config::kPrefillPingpong: return "pingpong";
    default: return "?";
  }
}

// x [T, K] bf16 on the GPU quantized per token as the prefill path does.
struct Codes {
  DevBuf codes, sx;
  Codes(const void* x, int64_t T, int64_t K) : codes(size_t(T * K)), sx(size_t(T) * 4) {
    cuda::launch_quantize_rows_fp8(static_cast<const cuda::bf16*>(x), T, K, K,
                                   static_cast<uint8_t*>(codes.p), static_cast<float*>(sx.p),
                                   nullptr);
  }
};

bool run(Fp8Sm90Config c, const Codes& q, const Weight& w, void* y, int64_t T, int64_t N,
         int64_t K, const DevBuf& ws) {
  return cuda::launch_fp8_scaled_gemm_sm90_config(
      c, static_cast<const uint8_t*>(q.codes.p), static_cast<const float*>(q.sx.p),
      static_cast<const uint8_t*>(w.data), w.scales, static_cast<cuda::bf16*>(y), T, N, K, ws.p,
      size_t(64) << 20, nullptr);
}

// Every configuration against the CPU oracle (expect_fp8_close: fp32 order and the FP8
// mainloop's bounded truncation), and whether it gives kPrefill's bits (printed: the same K
// blocks in the same order promote alike, so equal bits are expected but not required).
TEST(CudaFp8, PrefillConfigs) {
  REQUIRE_GPU();
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major != 9) GTEST_SKIP() << "the CUTLASS FP8 GEMMs are sm_90";
  DevBuf ws(size_t(64) << 20);
  uint32_t seed = 2500;
  const std::vector<std::pair<int64_t, int64_t>> projections{
      {4096, 4096}, {4096, 8704}, {16384, 4096}, {520, 48}};  // (K, N)
  for (int64_t T : {65, 300, 777})
    for (auto [K, N] : projections) {
      Pair p;
      const W2 w = up_fp8(p, randn(N, K, seed++, 1.f / std::sqrt(float(K))));
      auto x = p.up(randn(T, K, seed++, 1.f));
      auto y = p.out(T, N);
      p.cpu->linear(x.c, w.c, y.c);
      const Codes q(x.g.data, T, K);
      std::vector<float> first;
      for (const auto c : kConfigs) {
        ASSERT_EQ(cudaMemset(y.g.data, 0xff, size_t(T * N) * 2), cudaSuccess);
        ASSERT_TRUE(run(c, q, w.g, y.g.data, T, N, K, ws))
            << config_name(c) << " refused " << T << " x " << K << " x " << N;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        auto [cpu, gpu] = p.download(y);
        const std::string what = std::string("fp8 prefill gemm ") + config_name(c);
        expect_fp8_close(shape(what.c_str(), {T, K, N}), gpu, cpu);
        if (first.empty())
          first = gpu;
        else
          std::printf("[ fp8 prefill gemm ] %s %lld x %lld x %lld: %s kPrefill's bits\n",
                      config_name(c), (long long)T, (long long)K, (long long)N,
                      gpu == first ? "the same as" : "not");
      }
    }
}

// µs per GEMM (quantization excluded) at 2,048 rows, and per 9B forward (24 lightning
// q/k/v/gate stacks, 8 sparse ones, o, gate_up, down in all 32).
TEST(CudaFp8, PrefillConfigsSpeed) {
  REQUIRE_GPU();
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major != 9) GTEST_SKIP() << "the CUTLASS FP8 GEMMs are sm_90";
  struct Proj {
    int64_t K, N;
    int per_forward;
  };
  const Proj projs[] = {{4096, 16384, 24}, {4096, 8704, 8}, {4096, 4096, 32}, {4096, 32768, 32},
                        {16384, 4096, 32}};
  constexpr int64_t T = 2048;
  DevBuf ws(size_t(64) << 20);
  std::printf("\n[ fp8 prefill gemm ] T = %lld, us per GEMM (TFLOP/s)\n[ fp8 prefill gemm ] %-14s",
              (long long)T, "K x N");
  for (const auto c : kConfigs) std::printf(" %16s", config_name(c));
  std::printf("\n");
  double fwd[std::size(kConfigs)] = {};
  for (const Proj& pr : projs) {
    Pair p;
    const W2 w = up_fp8(p, randn(pr.N, pr.K, 2600, 0.02f));
    auto x = p.up(randn(T, pr.K, 2700, 1.f));
    auto y = p.out(T, pr.N);
    const Codes q(x.g.data, T, pr.K);
    std::printf("[ fp8 prefill gemm ] %5lld x %-6lld", (long long)pr.K, (long long)pr.N);
    for (size_t i = 0; i < std::size(kConfigs); ++i) {
      for (int r = 0; r < 3; ++r) run(kConfigs[i], q, w.g, y.g.data, T, pr.N, pr.K, ws);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const int reps = 20;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) run(kConfigs[i], q, w.g, y.g.data, T, pr.N, pr.K, ws);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
              .count() / reps;
      std::printf(" %8.1f (%5.0f)", us, 2.0 * T * pr.N * pr.K / us / 1e6);
      fwd[i] += us * pr.per_forward;
    }
    std::printf("\n");
  }
  std::printf("[ fp8 prefill gemm ] 9B forward of %lld rows, ms:", (long long)T);
  for (double f : fwd) std::printf(" %.2f", f / 1e3);
  std::printf("\n");
}

}  // namespace
}  // namespace sala::test
