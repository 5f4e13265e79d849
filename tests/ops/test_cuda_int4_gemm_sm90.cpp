// The sm_90 W4A16 prefill GEMM (cuda_gemm_int4_sm90.cu) and its weight copy
// (launch_int4_shuffle_codes, launch_int4_scales_transposed), launched directly:
//   MatchesDequantized  both configurations against a double-precision product of the
//                       dequantizer's bf16(q · s) weights (launch_int4_dequantize) and the x
//                       rows: fp32 sums in another order, one bf16 rounding; fp32 scales that
//                       are not bf16 values (kF32Scales) and bf16-valued ones (both, which
//                       then give the same bits); a part of a stacked weight (row offset, the
//                       whole weight's scale leading dimension); M = 1, 65, 300; N not a
//                       multiple of 16 refused
//   BackendCopies       the CUDA backend keeps the copy on sm_90 in bf16 mode unless
//                       BackendOptions::int4_prefill_gemm is false, and its prompt runs match
//                       the dequantize + cuBLASLt path's (the option off) to the GEMM contract;
//                       a weight of rows not in whole 16-row blocks takes that path itself
//   Speed               each configuration at M = 2,048 (a prompt chunk) on the 9B's shapes
//                       against the dequantize + cuBLASLt path and a bf16 weight, per shape
//                       and per 9B forward
// Off sm_90 (and without a GPU) every test GTEST_SKIPs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_gemm_int4_sm90.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "core/int4.h"
#include "cuda_test_util.h"
#include "int4_test_util.h"

namespace sala::test {
namespace {

using cuda::Int4Sm90Config;

bool sm90() {
  int dev = 0, major = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         major == 9;
}
#define REQUIRE_SM90()                                      \
  do {                                                      \
    REQUIRE_GPU();                                          \
    if (!sm90()) GTEST_SKIP() << "the int4 GEMM is sm_90"; \
  } while (0)

template <typename T>
T* dev(size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> down(const T* p, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// A weight [N, K] in the device layout with its dequantized bf16 values and both copies.
struct DevInt4 {
  int64_t N, K;
  int group;
  uint32_t* w;        // device layout (launch_int4_repack)
  float* s;           // [N, K / group]
  uint32_t* codes;    // the shuffled order
  float* scales_f32;  // [K / group, N]
  void* scales_b16 = nullptr;  // the same as bf16 (bf16-valued scales only)
  std::vector<float> wd;  // dequantized, as fp32 [N, K] (with_values)
  DevInt4(int64_t n, int64_t k, int g, bool bf16_scales, uint32_t seed, bool with_values = true)
      : N(n), K(k), group(g) {
    std::vector<uint32_t> words(size_t(N * K / 8));
    uint32_t r = seed;
    for (uint32_t& x : words) x = r = r * 1664525u + 1013904223u;
    std::vector<float> sc(size_t(N * (K / g)));
    for (float& x : sc) {
      r = r * 1664525u + 1013904223u;
      x = std::ldexp(1.f + float(r >> 9) / float(1 << 23), int(r % 7) - 12);  // 24-bit mantissas
      if (bf16_scales) x = round_bf16(x);
    }
    w = dev<uint32_t>(words.size());
    s = dev<float>(sc.size());
    cudaMemcpy(w, words.data(), words.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(s, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice);
    cuda::launch_int4_repack(w, int64_t(words.size()), 0);
    codes = dev<uint32_t>(words.size());
    cuda::launch_int4_shuffle_codes(w, N, K, codes, 0);
    scales_f32 = dev<float>(sc.size());
    cuda::launch_int4_scales_transposed(s, N, K / g, scales_f32, false, N, 0);
    if (bf16_scales) {
      scales_b16 = dev<uint16_t>(sc.size());
      cuda::launch_int4_scales_transposed(s, N, K / g, scales_b16, true, N, 0);
    }
    if (!with_values) return;
    cuda::bf16* d = dev<cuda::bf16>(size_t(N * K));
    cuda::launch_int4_dequantize(w, s, N, K, g, d, 0);
    const std::vector<cuda::bf16> h = down(d, size_t(N * K));
    wd.resize(h.size());
    for (size_t i = 0; i < h.size(); ++i) wd[i] = float(h[i]);
    cudaFree(d);
  }
  ~DevInt4() {
    cudaFree(w);
    cudaFree(s);
    cudaFree(codes);
    cudaFree(scales_f32);
    cudaFree(scales_b16);
  }
};

TEST(CudaInt4Sm90, MatchesDequantized) {
  REQUIRE_SM90();
  struct Case {
    int64_t N, K;
    int group;
    int64_t r0, n;  // the part: weight rows [r0, r0 + n)
  };
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, 32 << 20), cudaSuccess);
  uint32_t seed = 9100;
  for (const bool bf16_scales : {false, true})
    for (const Case c : {Case{256, 512, 64, 0, 256}, Case{1008, 1024, 128, 0, 1008},
                         Case{3072, 2048, 128, 1024, 1536}, Case{512, 4096, 256, 256, 256}}) {
      const DevInt4 W(c.N, c.K, c.group, bf16_scales, seed++);
      for (const int64_t M : {1, 65, 300}) {
        const HostMat hx = randn(M, c.K, seed++, 1.f);
        const std::vector<float> xf = hx.f32();
        cuda::bf16* x = dev<cuda::bf16>(size_t(M * c.K));
        cudaMemcpy(x, hx.bits.data(), hx.bits.size() * 2, cudaMemcpyHostToDevice);
        cuda::bf16* y = dev<cuda::bf16>(size_t(M * c.n));
        std::vector<cuda::bf16> first_bits;
        for (const Int4Sm90Config cfg : {Int4Sm90Config::kF32Scales, Int4Sm90Config::kBf16Scales}) {
          const bool b16 = cfg == Int4Sm90Config::kBf16Scales;
          if (b16 && !bf16_scales) continue;
          const std::string name = shape("int4 gemm sm90", {c.N, c.K, c.group, c.r0, c.n, M,
                                                            int64_t(bf16_scales), int64_t(b16)});
          cudaMemset(y, 0xff, size_t(M * c.n) * 2);
          const auto* codes = reinterpret_cast<const uint8_t*>(W.codes) + c.r0 * c.K / 2;
          const void* sc = b16 ? static_cast<const void*>(
                                     static_cast<const uint16_t*>(W.scales_b16) + c.r0)
                               : static_cast<const void*>(W.scales_f32 + c.r0);
          ASSERT_TRUE(cuda::launch_int4_gemm_sm90_config(cfg, x, codes, sc, c.N, y, M, c.n, c.K,
                                                         c.group, ws, 32 << 20, 0))
              << name;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << name;
          const std::vector<cuda::bf16> e = down(y, size_t(M * c.n));
          // bf16-valued scales: the two conversions make the same weights
          if (first_bits.empty())
            first_bits = e;
          else
            EXPECT_EQ(0, std::memcmp(e.data(), first_bits.data(), e.size() * 2)) << name;
          int64_t bad = 0, first = -1;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t j = 0; j < c.n; ++j) {
              double ref = 0, mag = 0;
              const float* wr = &W.wd[size_t((c.r0 + j) * c.K)];
              const float* xr = &xf[size_t(m * c.K)];
              for (int64_t k = 0; k < c.K; ++k) {
                ref += double(wr[k]) * xr[k];
                mag += std::fabs(double(wr[k]) * xr[k]);
              }
              const double got = float(e[size_t(m * c.n + j)]);
              // one bf16 rounding (half an ulp: at most 2^-8 relative) + fp32 sums in
              // another order
              if (!(std::fabs(got - ref) <= std::fabs(ref) * 0x1p-8 + mag * 1e-6))
                ++bad, first = first < 0 ? m * c.n + j : first;
            }
          EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << M * c.n
                            << " outside the bound; first at " << first;
        }
        if (M == 65) {  // 8 rows of the part past a 16-row block: refused, nothing written
          EXPECT_FALSE(cuda::launch_int4_gemm_sm90_config(
              Int4Sm90Config::kF32Scales, x, reinterpret_cast<const uint8_t*>(W.codes),
              W.scales_f32, c.N, y, M, c.n - 8, c.K, c.group, ws, 32 << 20, 0));
        }
        cudaFree(x);
        cudaFree(y);
      }
    }
  cudaFree(ws);
}

TEST(CudaInt4Sm90, BackendCopies) {
  REQUIRE_SM90();
  BackendOptions off;
  off.int4_prefill_gemm = false;
  Pair on_pair, off_pair(NumericMode::BF16, off);
  EXPECT_EQ(on_pair.gpu->int4_weight_copies(), 2);
  EXPECT_EQ(off_pair.gpu->int4_weight_copies(), 1);
  uint32_t seed = 9300;
  // 3072 rows: the copy's GEMM (the GEMM contract against the dequantized path); 1000 rows (not
  // whole 16-row blocks): no copy, the dequantized path itself (the same bits).
  for (const int64_t N : {3072, 1000})
    for (const int64_t M : {65, 300}) {
      const int64_t K = 2048;
      const Int4Host q = weight(N, K, 128, seed++);
      const Weight w_on = upload_int4_host(*on_pair.gpu, q);
      const Weight w_off = upload_int4_host(*off_pair.gpu, q);
      const HostMat hx = activations(K, seed++, M);
      auto x_on = on_pair.up(hx);
      auto x_off = off_pair.up(hx);
      const std::string name = shape("int4 prompt run, copy vs dequantized", {N, K, M});
      const std::vector<float> on = run_linear(*on_pair.gpu, x_on.g, w_on, 0, M, DType::BF16);
      const std::vector<float> off_y = run_linear(*off_pair.gpu, x_off.g, w_off, 0, M, DType::BF16);
      if (N % 16 == 0)
        expect_close(compare(name, on, off_y), 4e-3, 1.6e-2);
      else
        EXPECT_EQ(on, off_y) << name;
    }
}

TEST(CudaInt4Sm90, Speed) {
  REQUIRE_SM90();
  constexpr int64_t M = 2048;
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, 32 << 20), cudaSuccess);
  const HostMat hx = randn(M, 16384, 951, 1.f);
  cuda::bf16* x = dev<cuda::bf16>(hx.bits.size());
  cudaMemcpy(x, hx.bits.data(), hx.bits.size() * 2, cudaMemcpyHostToDevice);
  cuda::bf16* y = dev<cuda::bf16>(size_t(M) * 32768);
  std::printf("\n[ int4 gemm sm90 ] M = %lld, us per GEMM (TFLOP/s)\n", (long long)M);
  std::printf("[ int4 gemm sm90 ] %-14s %14s %14s %16s %14s\n", "shape N x K", "f32 scales",
              "bf16 scales", "dequant+cuBLAS", "bf16 weight");
  double fwd[4] = {};
  for (const SpeedShape s : kShapes) {
    const DevInt4 W(s.N, s.K, 128, true, 77, false);
    double us[4];
    for (int i = 0; i < 2; ++i)
      us[i] = time_us(
          [&](int) {
            cuda::launch_int4_gemm_sm90_config(
                i ? Int4Sm90Config::kBf16Scales : Int4Sm90Config::kF32Scales, x,
                reinterpret_cast<uint8_t*>(W.codes), i ? W.scales_b16 : W.scales_f32, s.N, y, M,
                s.N, s.K, 128, ws, 32 << 20, 0);
          },
          10);
    // The dequantize + cuBLASLt path and a bf16 weight, through the backend (option off).
    BackendOptions off;
    off.int4_prefill_gemm = false;
    Pair q(NumericMode::BF16, off);
    const Int4Host hq = weight(s.N, s.K, 128, 79);
    const Weight w4 = upload_int4_host(*q.gpu, hq);
    auto xt = q.up(randn(M, s.K, 80, 1.f));
    auto dense = q.up(randn(s.N, s.K, 81, 1.f / 64.f));
    const Weight wb(dense.g);
    Tensor yt = q.gpu->alloc(M, s.N, DType::BF16);
    us[2] = time_us([&](int) { q.gpu->linear(xt.g, w4, yt); }, 10);
    us[3] = time_us([&](int) { q.gpu->linear(xt.g, wb, yt); }, 10);
    const double tflop = 2.0 * M * s.N * s.K / 1e6;
    std::printf("[ int4 gemm sm90 ] %6lld x %-6lld", (long long)s.N, (long long)s.K);
    for (int i = 0; i < 4; ++i) {
      std::printf(" %8.1f (%3.0f)", us[i], tflop / us[i]);
      fwd[i] += us[i] * s.per_forward;
    }
    std::printf("\n");
  }
  std::printf("[ int4 gemm sm90 ] 9B forward of 2,048 rows, ms:");
  for (int i = 0; i < 4; ++i) std::printf(" %.2f", fwd[i] / 1e3);
  std::printf("\n");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(ws);
  cudaFree(x);
  cudaFree(y);
}

}  // namespace
}  // namespace sala::test
