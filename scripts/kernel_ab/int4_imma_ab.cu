// The int4 GEMVs of W4A16 decode side by side (issue 22): the ring GEMV (cuda_gemv_int4.cu, bf16
// tensor cores on dequantized codes) and the int8 experiment (int4_imma_gemv.cu, int8 tensor
// cores on the codes and x's exact digits, its digit kernel included), on the 9B's shapes at
// M = 1, 2, 4, 8, with each one's error against the exact product (double) in bf16 ulps, over
// weights rotated through >= 160 MB (DRAM, not the 50 MB L2). Session 35 (H200): the int8 GEMV
// slower at every shape and M (docs/PERF.md).
//
// Build (GPU machine or here; int4_ab.sh does): nvcc -O2 -std=c++20 --expt-relaxed-constexpr
//   -gencode arch=compute_90a,code=sm_90a -I src scripts/kernel_ab/int4_imma_ab.cu
//   scripts/kernel_ab/int4_imma_gemv.cu src/backend/cuda/cuda_gemv.cu
//   src/backend/cuda/cuda_gemv_int4.cu -o /tmp/int4_imma_ab
// Prints per shape and M: µs per launch (median of 20 back to back) of each kernel, TB/s of
// weight + scale bytes, and the largest error in ulps with the share of outputs >= 1 ulp off.
// Exit 1 when the int8 GEMV is off by more than max(2, ring + 1) ulps.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ab_util.h"
#include "backend/cuda/cuda_kernels.h"
#include "int4_imma.h"

using namespace sala::cuda;
using kernel_ab::median_us;
using kernel_ab::rng;

// Largest |got − ref| in bf16 ulps of ref, and the share of outputs ≥ 1 ulp off.
static void ulps(const std::vector<__nv_bfloat16>& got, const std::vector<double>& ref,
                 double* worst, double* share) {
  int off = 0;
  *worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = double(__bfloat162float(__float2bfloat16_rn(float(ref[i]))));
    const double e = std::floor(std::log2(std::max(std::fabs(r), 1e-30)));
    const double u = std::fabs(double(__bfloat162float(got[i])) - r) / std::exp2(e - 7);
    *worst = std::max(*worst, u);
    off += u >= 1;
  }
  *share = 100.0 * off / double(ref.size());
}

int main() {
  const int shapes[][2] = {{4096, 4096},  {12288, 4096}, {16384, 4096},
                           {32768, 4096}, {4096, 16384}};
  // Weights in copies of >= 160 MB in all, rotated launch by launch so that both kernels stream
  // from DRAM, not from the 50 MB L2 (copy 0 is the one checked against the reference).
  const int64_t kMaxWords = 32768 * 4096 / 8, kPoolWords = 3 * kMaxWords, kMaxK = 16384;
  uint64_t s = 2026;
  std::vector<uint32_t> hq(kPoolWords);
  for (auto& v : hq) v = rng(s);
  std::vector<float> hs(kPoolWords / 16);
  for (auto& v : hs) v = float(1 + rng(s) % 1000) / 50000.f;
  const int kMaxM = 8;
  std::vector<__nv_bfloat16> hx(size_t(kMaxM) * kMaxK);
  for (size_t i = 0; i < hx.size(); ++i) {  // N(0, 1)-like with every 16th value tiny
    const float u = float(int(rng(s) % 2001) - 1000) / 500.f;
    hx[i] = __float2bfloat16(i % 16 == 5 ? u * 1e-5f : u);
  }
  uint32_t* q;
  float* sc;
  __nv_bfloat16 *x, *y0, *y1;
  void* digits = nullptr;
  CK(cudaMalloc(&q, hq.size() * 4));
  CK(cudaMalloc(&sc, hs.size() * 4));
  CK(cudaMalloc(&x, hx.size() * 2));
  CK(cudaMalloc(&y0, size_t(kMaxM) * 32768 * 2));
  CK(cudaMalloc(&y1, size_t(kMaxM) * 32768 * 2));
  CK(cudaMalloc(&digits, gemv_int4_imma_scratch_bytes(kMaxK)));
  CK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sc, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  launch_int4_repack(q, int64_t(hq.size()), st);
  gemv_init();
  gemv_int4_init();
  gemv_int4_imma_init();
  bool ok = true;
  std::printf("%-13s %2s %9s %9s %7s %7s  %-16s %-16s\n", "shape", "M", "ring us", "int8 us",
              "ring", "int8", "ring ulp (%>=1)", "int8 ulp (%>=1)");
  for (const auto& sh : shapes)
    for (int M : {1, 2, 4, 8}) {
      const int N = sh[0], K = sh[1];
      const int64_t words = int64_t(N) * K / 8;  // one copy: words, then words / 16 scales
      const int copies =
          int(std::min<int64_t>(kPoolWords / words, (160ll << 20) / (words * 4) + 1));
      GemvOut o0{}, o1{};
      o0.y[0] = y0, o1.y[0] = y1;
      o0.end[0] = o1.end[0] = N;
      o0.cols[0] = o1.cols[0] = N;
      o0.nparts = o1.nparts = 1;
      int it = 0;
      auto copy = [&](int i) { return std::make_pair(q + i * words, sc + i * (words / 16)); };
      auto prod_at = [&](int i) {
        launch_gemv_int4(x, K, copy(i).first, copy(i).second, N, K, 128, M, o0, st);
      };
      auto imma_at = [&](int i) {  // its digit kernel included
        launch_gemv_int4_imma(x, K, copy(i).first, copy(i).second, N, K, M, o1, digits, kMaxK,
                              st);
      };
      const float t0 = median_us([&] { prod_at(it++ % copies); }, st, 20);
      const float t1 = median_us([&] { imma_at(it++ % copies); }, st, 20);
      prod_at(0);  // the checked outputs: copy 0
      imma_at(0);
      CK(cudaStreamSynchronize(st));
      std::vector<__nv_bfloat16> g0(size_t(M) * N), g1(size_t(M) * N);
      CK(cudaMemcpy(g0.data(), y0, g0.size() * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(g1.data(), y1, g1.size() * 2, cudaMemcpyDeviceToHost));
      std::vector<double> ref(size_t(M) * N);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double acc = 0;
          for (int k = 0; k < K; ++k) {
            const int code = int((hq[(size_t(n) * K + k) / 8] >> (4 * (k % 8))) & 15u);
            acc += double(code - 8) * hs[size_t(n) * (K / 128) + k / 128] *
                   double(__bfloat162float(hx[size_t(m) * K + k]));
          }
          ref[size_t(m) * N + n] = acc;
        }
      double w0, f0, w1, f1;
      ulps(g0, ref, &w0, &f0);
      ulps(g1, ref, &w1, &f1);
      const double gb = (double(N) * K / 2 + double(N) * (K / 128) * 4) / 1e3;  // bytes / 1e3
      std::printf("%6d x %5d %2d %9.2f %9.2f %7.2f %7.2f  %4.1f (%6.3f %%)  %4.1f (%6.3f %%)\n",
                  N, K, M, t0, t1, gb / t0 / 1e3, gb / t1 / 1e3, w0, f0, w1, f1);
      // The ring GEMV's class: a cancelling output may be 2 ulps off (CPU emulation of this
      // data: 2.0 at 32768 x 4096, M = 4 and 8); off by more than both is a bug.
      if (w1 > std::max(2.0, w0 + 1)) ok = false;
    }
  std::printf("TB/s: weight + scale bytes per µs / 1e6 (weights rotated over >= 160 MB). %s\n",
              ok ? "int8 within max(2, ring + 1) ulps everywhere"
                 : "INT8 OFF BY MORE THAN max(2, ring + 1) ULPS");
  return ok ? 0 : 1;
}
