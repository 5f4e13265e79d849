// W4A16 GEMV kernel variants and speed (issue 22); the correctness tests of the int4 path are
// test_cuda_int4_gemv.cpp's.
//   Variants         every Int4GemvVariant (issue 22) at the kernel level: kLean / kLean2 bit
//                    for bit kLegacy (plain, fp32 out, silu_pair), every one within the CPU
//                    bounds and row-invariant (rows of M = 1..64 equal the row alone)
//   Speed            the GEMV at M = 1, 8, 16, 64, each variant side by side: us, and GB/s of
//                    packed + scale bytes of the fastest; one 9B decode step per variant
//   DequantSpeed     the prefill path's dequantization per shape and per 9B forward
// Without a GPU every test GTEST_SKIPs (cuda_test_util.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "cuda_test_util.h"
#include "int4_test_util.h"

namespace sala::test {
namespace {

// One variant's y [M, N] (fp32 or bf16 out; silu_pair: [M, N / 2]) for x rows [r0, r0 + M),
// through the kernel launcher itself (the backend's GemmDispatch runs kInt4GemvDefault only).
std::vector<float> run_variant(cuda::Int4GemvVariant v, const Tensor& x, const Weight& w,
                               int64_t r0, int64_t M, bool f32, bool silu) {
  const int64_t cols = silu ? w.rows / 2 : w.rows;
  void* y = nullptr;
  EXPECT_EQ(cudaMalloc(&y, size_t(M * cols) * 4), cudaSuccess);
  cuda::GemvOut o{};
  o.y[0] = y, o.end[0] = w.rows, o.cols[0] = cols, o.nparts = 1, o.f32 = f32, o.silu_pair = silu;
  cuda::launch_gemv_int4_variant(v, static_cast<const cuda::bf16*>(x.data) + r0 * x.cols, x.cols,
                                 static_cast<const uint32_t*>(w.data), w.scales, w.rows,
                                 int(w.cols), w.group, int(M), o, 0);
  std::vector<float> r(size_t(M * cols));
  if (f32) {
    cudaMemcpy(r.data(), y, r.size() * 4, cudaMemcpyDeviceToHost);
  } else {
    std::vector<uint16_t> b(r.size());
    cudaMemcpy(b.data(), y, b.size() * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < b.size(); ++i) {
      const uint32_t u = uint32_t(b[i]) << 16;
      std::memcpy(&r[i], &u, 4);
    }
  }
  EXPECT_EQ(cudaFree(y), cudaSuccess);
  return r;
}

// Outputs whose bits differ (sizes must match).
int64_t bit_diffs(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

TEST(CudaInt4Gemv, Variants) {
  REQUIRE_GPU();
  using V = cuda::Int4GemvVariant;
  Pair p;
  uint32_t seed = 5100;
  struct S {
    int64_t N, K;
    int32_t group;
  };
  // 3072 / 384: group / 128 = 3 (the scale column's division), a part-filled last stage; 384:
  // warps without a K slice; 77, 130, 1000, 9000: a part-filled last tile; 8704, 9000: enough
  // 32-row tiles for kLean2's 2 CTAs per SM on 32-row tiles (>= 2 per SM; fewer: 16-row tiles).
  for (S s : {S{77, 1024, 128}, S{1000, 2048, 128}, S{130, 384, 128}, S{96, 512, 256},
              S{192, 3072, 384}, S{4096, 4096, 128}, S{512, 16384, 128}, S{8704, 1024, 128},
              S{9000, 512, 128}}) {
    const Int4Host q = weight(s.N, s.K, s.group, seed++);
    const Weight wc = upload_int4_host(*p.cpu, q), wg = upload_int4_host(*p.gpu, q);
    ASSERT_TRUE(cuda::gemv_int4_supported(wg.data, s.K, s.group, 1));
    auto xt = p.up(activations(s.K, seed++));
    constexpr int64_t kMs[] = {1, 2, 5, 8, 9, 16, 17, 33, 64};
    std::vector<std::vector<float>> cpu;  // the oracle per M of kMs
    for (int64_t M : kMs) cpu.push_back(run_linear(*p.cpu, xt.c, wc, 0, M, DType::F32));
    for (int vi = 0; vi < cuda::kInt4GemvVariants; ++vi) {
      const V v = V(vi);
      const bool exact = v == V::kLean || v == V::kLean2;  // kLegacy's bits
      const std::string vn = cuda::int4_gemv_variant_name(v);
      const std::vector<float> all = run_variant(v, xt.g, wg, 0, kRowsMax, false, false);
      int bad = 0;
      for (int64_t r = 0; r < kRowsMax; ++r)  // row invariance: each row alone
        if (std::memcmp(run_variant(v, xt.g, wg, r, 1, false, false).data(),
                        all.data() + r * s.N, size_t(s.N) * 4) != 0 &&
            bad++ < 4)
          ADD_FAILURE() << vn << " " << s.N << " x " << s.K << ": row " << r
                        << " of M=64 differs from the row alone";
      for (size_t mi = 0; mi < std::size(kMs); ++mi) {
        const int64_t M = kMs[mi];
        const std::string name = vn + " " + shape("int4 variant", {s.N, s.K, s.group, M});
        const std::vector<float> got = run_variant(v, xt.g, wg, 0, M, false, false);
        if (std::memcmp(got.data(), all.data(), got.size() * 4) != 0)
          ADD_FAILURE() << name << ": rows differ from the same rows at M=64";
        if (exact) {  // plain, fp32 out, silu_pair: kLegacy's bits
          EXPECT_EQ(bit_diffs(got, run_variant(V::kLegacy, xt.g, wg, 0, M, false, false)), 0)
              << name;
          EXPECT_EQ(bit_diffs(run_variant(v, xt.g, wg, 0, M, true, false),
                              run_variant(V::kLegacy, xt.g, wg, 0, M, true, false)),
                    0)
              << name << " f32 out";
          if (s.N % 64 == 0) {
            EXPECT_EQ(bit_diffs(run_variant(v, xt.g, wg, 0, M, false, true),
                                run_variant(V::kLegacy, xt.g, wg, 0, M, false, true)),
                      0)
                << name << " silu_pair";
          }
        }
        expect_int4_close(name, got, cpu[mi], M, s.N, true, 1);
      }
    }
  }
}

double time_us(const std::function<void(int)>& launch, int iters) {
  for (int i = 0; i < 3; ++i) launch(i);
  cudaDeviceSynchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) launch(i);
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
         iters;
}

struct SpeedShape {
  int64_t N, K;
  int per_forward;  // how often the 9B model's forward runs this shape (stacked weights)
};
// configs/minicpm-sala-9b.json: 24 lightning layers (q/k/v/gate 4 x 4096 stacked), 8 sparse
// layers (q 4096 + k 256 + v 256 + gate 4096), o_proj, gate_up, down in all 32.
constexpr SpeedShape kShapes[] = {
    {4096, 4096, 32}, {8704, 4096, 8}, {16384, 4096, 24}, {32768, 4096, 32}, {4096, 16384, 32}};

// Packed weights rotated over more than the L2 (random codes; scales 1e-3); bf16 output. Each
// (shape, M) line gives every Int4GemvVariant's us side by side and the fastest one's GB/s;
// the closing lines, each variant's 9B decode step (M = 1).
TEST(CudaInt4Gemv, Speed) {
  REQUIRE_GPU();
  using V = cuda::Int4GemvVariant;
  constexpr int kV = cuda::kInt4GemvVariants;
  std::printf("\n[ gemv int4 ] %-22s %4s", "shape N x K", "M");
  for (int v = 0; v < kV; ++v) std::printf(" %10s", cuda::int4_gemv_variant_name(V(v)));
  std::printf(" %12s %12s  (us; GB/s of the fastest; default %s)\n", "GB/s packed", "GB/s +scales",
              cuda::int4_gemv_variant_name(cuda::kInt4GemvDefault));
  const HostMat hx = randn(kRowsMax, 16384, 899, 1.f);
  void *x = nullptr, *y = nullptr;
  cudaMalloc(&x, hx.bits.size() * 2);
  cudaMemcpy(x, hx.bits.data(), hx.bits.size() * 2, cudaMemcpyHostToDevice);
  cudaMalloc(&y, size_t(kRowsMax) * 32768 * 2);
  double step_us[kV] = {};
  for (const SpeedShape s : kShapes) {
    const int64_t packed = s.N * s.K / 2, scales = s.N * (s.K / 128) * 4;
    const int copies = int(std::max<int64_t>(2, (400ll << 20) / (packed + scales) + 1));
    void *w = nullptr, *sc = nullptr;
    ASSERT_EQ(cudaMalloc(&w, size_t(packed) * copies), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&sc, size_t(scales) * copies), cudaSuccess);
    cudaMemset(w, 0x5a, size_t(packed) * copies);
    std::vector<float> one(size_t(scales / 4), 1e-3f);
    for (int c = 0; c < copies; ++c)
      cudaMemcpy(static_cast<char*>(sc) + size_t(c) * scales, one.data(), size_t(scales),
                 cudaMemcpyHostToDevice);
    cuda::GemvOut o{};
    o.y[0] = y, o.end[0] = s.N, o.cols[0] = s.N, o.nparts = 1;
    for (int M : {1, 8, 16, 64}) {
      double us[kV], best = 1e30;
      for (int v = 0; v < kV; ++v) {
        us[v] = time_us(
            [&](int i) {
              cuda::launch_gemv_int4_variant(
                  V(v), static_cast<const cuda::bf16*>(x), s.K,
                  reinterpret_cast<const uint32_t*>(static_cast<char*>(w) + size_t(i % copies) * packed),
                  reinterpret_cast<const float*>(static_cast<char*>(sc) + size_t(i % copies) * scales),
                  s.N, int(s.K), 128, M, o, 0);
            },
            60);
        best = std::min(best, us[v]);
        if (M == 1) step_us[v] += us[v] * s.per_forward;
      }
      std::printf("[ gemv int4 ] %8lld x %-12lld %4d", (long long)s.N, (long long)s.K, M);
      for (int v = 0; v < kV; ++v) std::printf(" %10.2f", us[v]);
      std::printf(" %12.0f %12.0f\n", double(packed) / best / 1e3,
                  double(packed + scales) / best / 1e3);
    }
    cudaFree(w);
    cudaFree(sc);
  }
  for (int v = 0; v < kV; ++v)
    std::printf("[ gemv int4 ] 9B projections at M = 1, one decode step, %-10s: %.3f ms of GEMVs\n",
                cuda::int4_gemv_variant_name(V(v)), step_us[v] / 1e3);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(x);
  cudaFree(y);
}

// The prefill path's cost: one dequantization of each weight per forward (bf16 out).
TEST(CudaInt4Gemv, DequantSpeed) {
  REQUIRE_GPU();
  std::printf("\n[ int4 dequant ] %-22s %10s %14s\n", "shape N x K", "us", "GB/s (r + w)");
  double forward_us = 0;
  for (const SpeedShape s : kShapes) {
    const int64_t packed = s.N * s.K / 2, scales = s.N * (s.K / 128) * 4;
    void *w = nullptr, *sc = nullptr, *out = nullptr;
    ASSERT_EQ(cudaMalloc(&w, size_t(packed)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&sc, size_t(scales)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out, size_t(s.N * s.K) * 2), cudaSuccess);
    cudaMemset(w, 0x5a, size_t(packed));
    cudaMemset(sc, 0, size_t(scales));
    const double us = time_us(
        [&](int) {
          cuda::launch_int4_dequantize(static_cast<const uint32_t*>(w),
                                       static_cast<const float*>(sc), s.N, s.K, 128,
                                       static_cast<cuda::bf16*>(out), 0);
        },
        20);
    forward_us += us * s.per_forward;
    std::printf("[ int4 dequant ] %8lld x %-12lld %10.2f %14.0f\n", (long long)s.N,
                (long long)s.K, us, double(packed + scales + s.N * s.K * 2) / us / 1e3);
    cudaFree(w);
    cudaFree(sc);
    cudaFree(out);
  }
  std::printf("[ int4 dequant ] 9B projections, one prefill forward (any row count): %.3f ms\n",
              forward_us / 1e3);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace sala::test
