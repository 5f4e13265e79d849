// Shared by the W4A16 op tests (test_cuda_int4_gemv.cpp, test_cuda_int4_skinny.cpp): test
// weights and activations with hard cases, the GPU-vs-CPU bound of the int4 GEMMs, and one
// linear() on a backend.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/int4.h"
#include "cuda_test_util.h"

namespace sala::test {

inline constexpr int64_t kRowsMax = cuda::kGemvMaxRows;

inline uint16_t bf16_bits(float f) {  // nearest-even (finite values)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Weights ~N(0, 1/64²), every 7th row x40 (groups of very different scales), one all-zero row
// (scale = bf16 eps, codes 0), as the checkpoint's RTN codes with `group`.
inline Int4Host weight(int64_t N, int64_t K, int32_t group, uint32_t seed) {
  HostMat h = randn(N, K, seed, 1.f / 64.f);
  const std::vector<float> f = h.f32();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = size_t(n * K + k);
      if (n == N / 2) h.bits[i] = 0;
      else if (n % 7 == 3) h.bits[i] = bf16_bits(f[i] * 40.f);
    }
  return int4_rtn(h, group);
}

// x [rows, K]: N(0, 1), row 3 zero, row 5 large (x100), row 11 tiny (x1e-4).
inline HostMat activations(int64_t K, uint32_t seed, int64_t rows = kRowsMax) {
  HostMat x = randn(rows, K, seed, 1.f);
  const std::vector<float> f = x.f32();
  auto set = [&](int64_t r, float s) {
    for (int64_t k = 0; k < K; ++k) x.bits[size_t(r * K + k)] = bf16_bits(f[size_t(r * K + k)] * s);
  };
  set(3, 0.f);
  set(5, 100.f);
  set(11, 1e-4f);
  return x;
}

// GPU e against CPU r ([M, N] of bf16 values). GEMV rows: both sum exact products in fp32 in
// different orders, so an output is equal or `ulps` bf16 ulp apart (near-zero outputs: 1e-4 of
// the row's largest), on at most 3 % of outputs. Dequantized rows (prefill): bf16(q · s) weights,
// the GEMM contract (rel L2 4e-3, max 1.6e-2).
inline void expect_int4_close(const std::string& name, const std::vector<float>& e,
                       const std::vector<float>& r, int64_t M, int64_t N, bool gemv, double ulps) {
  ASSERT_EQ(e.size(), r.size()) << name;
  const Stat st = compare(name, e, r);
  expect_close(st, 4e-3, 1.6e-2);
  if (!gemv) return;
  int64_t bad = 0, diff = 0, worst = -1;
  for (int64_t m = 0; m < M; ++m) {
    double rowmax = 0;
    for (int64_t n = 0; n < N; ++n) rowmax = std::max(rowmax, std::fabs(double(r[size_t(m * N + n)])));
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * N + n);
      const double d = std::fabs(double(e[i]) - double(r[i]));
      if (!(d == 0)) ++diff;
      if (!(d <= std::max(ulps * bf16_ulp(std::fabs(double(r[i]))), 1e-4 * rowmax)))
        ++bad, worst = worst < 0 ? int64_t(i) : worst;
    }
  }
  EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << M * N << " outside the bound; first at m="
                    << (worst < 0 ? -1 : worst / N) << " n=" << (worst < 0 ? -1 : worst % N)
                    << " gpu=" << (worst < 0 ? 0.f : e[size_t(worst)])
                    << " cpu=" << (worst < 0 ? 0.f : r[size_t(worst)]);
  EXPECT_LE(double(diff), 0.03 * double(M * N)) << name << ": " << diff << " of " << M * N
                                                << " differ (max ulp " << st.max_ulp << ")";
}

// y = x[r0, r0 + M) · Wᵀ on one backend, as fp32 [M, N]; yt: the output type.
inline std::vector<float> run_linear(Backend& be, const Tensor& x, const Weight& w, int64_t r0,
                              int64_t M, DType yt) {
  Tensor y = be.alloc(M, w.rows, yt);
  be.linear(x.slice_rows(r0, M), w, y);
  std::vector<float> r(size_t(M * w.rows));
  be.download_f32(y, r.data());
  return r;
}

// Microseconds per launch(i) over iters calls (after 3 warm-up calls; i picks the weight copy).
inline double time_us(const std::function<void(int)>& launch, int iters) {
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
inline constexpr SpeedShape kShapes[] = {
    {4096, 4096, 32}, {8704, 4096, 8}, {16384, 4096, 24}, {32768, 4096, 32}, {4096, 16384, 32}};

// The packed codes and group-128 scales (1e-3) of an [N, K] weight for the speed tests, in
// enough copies to rotate over more than the L2 (400 MB): copy 0 random codes (so that printed
// output bits depend on every weight), the others 0x5a bytes.
struct Int4SpeedWeights {
  int64_t packed, scales;
  int copies;
  void* w = nullptr;
  void* sc = nullptr;
  Int4SpeedWeights(int64_t N, int64_t K)
      : packed(N * K / 2), scales(N * (K / 128) * 4),
        copies(int(std::max<int64_t>(2, (400ll << 20) / (packed + scales) + 1))) {
    EXPECT_EQ(cudaMalloc(&w, size_t(packed) * copies), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&sc, size_t(scales) * copies), cudaSuccess);
    cudaMemset(w, 0x5a, size_t(packed) * copies);
    std::vector<uint32_t> codes(size_t(packed / 4));
    uint32_t r = 12345u + uint32_t(N);
    for (uint32_t& c : codes) c = r = r * 1664525u + 1013904223u;
    cudaMemcpy(w, codes.data(), size_t(packed), cudaMemcpyHostToDevice);
    std::vector<float> one(size_t(scales / 4), 1e-3f);
    for (int c = 0; c < copies; ++c)
      cudaMemcpy(static_cast<char*>(sc) + size_t(c) * scales, one.data(), size_t(scales),
                 cudaMemcpyHostToDevice);
  }
  ~Int4SpeedWeights() {
    cudaFree(w);
    cudaFree(sc);
  }
  Int4SpeedWeights(const Int4SpeedWeights&) = delete;
  Int4SpeedWeights& operator=(const Int4SpeedWeights&) = delete;
  const uint32_t* words(int i) const {
    return reinterpret_cast<const uint32_t*>(static_cast<char*>(w) + size_t(i % copies) * packed);
  }
  const float* scale(int i) const {
    return reinterpret_cast<const float*>(static_cast<char*>(sc) + size_t(i % copies) * scales);
  }
};

}  // namespace sala::test
