// The Hopper skinny GEMM (cuda_skinny_sm90.cu) against the ring GEMV (cuda_gemv.cu) on the
// decode shapes, with nothing but the CUDA toolkit (built like gemv_ab.cu; run.sh's notes).
// Per shape and row count M: median µs of 30 launches (after 5 warm-ups) of each, the µs per
// launch of 20 back-to-back launches (PDL overlap), the relative L2 distance between their
// outputs, and whether every row of the skinny GEMM's M-row output equals its 64-row output
// bit for bit (row invariance). Exit 1 on a distance > 4e-3 or a row that differs. Variants
// measured with it and dropped are in docs/PERF_LOG.md (session 20).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ab_util.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_skinny_sm90.h"

using namespace sala::cuda;
using kernel_ab::median_us;
using kernel_ab::rng;

static std::vector<float> download(const __nv_bfloat16* p, size_t n) {
  std::vector<__nv_bfloat16> h(n);
  CK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

int main() {
  const int shapes[][2] = {{4096, 4096},  {8704, 4096},  {12288, 4096}, {16384, 4096},
                           {32768, 4096}, {4096, 16384}, {73448, 4096}};
  const int rows[] = {1, 8, 16, 40, 64};
  const int kMaxN = 73448, kMaxK = 16384, kMaxM = 64;
  uint64_t s = 12345;
  std::vector<__nv_bfloat16> hx(size_t(kMaxM) * kMaxK), hw(size_t(kMaxN) * 4096);
  for (auto& v : hx) v = __float2bfloat16(float(int(rng(s) % 2001) - 1000) / 1000.f);
  for (auto& v : hw) v = __float2bfloat16(float(int(rng(s) % 2001) - 1000) / 20000.f);
  __nv_bfloat16 *x, *w, *y0, *y1, *y64;
  void* ws;
  CK(cudaMalloc(&x, hx.size() * 2));
  CK(cudaMalloc(&w, hw.size() * 2));
  CK(cudaMalloc(&y0, size_t(kMaxM) * kMaxN * 2));
  CK(cudaMalloc(&y1, size_t(kMaxM) * kMaxN * 2));
  CK(cudaMalloc(&y64, size_t(kMaxM) * kMaxN * 2));
  CK(cudaMalloc(&ws, skinny_sm90_workspace_bytes()));
  CK(cudaMemset(ws, 0, skinny_sm90_workspace_bytes()));
  CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  gemv_init();
  skinny_sm90_init();
  int bad = 0;
  std::printf("µs per launch (median of 30; b2b: 20 back to back, PDL); sp: the K splits\n");
  std::printf("%-15s %2s %2s %8s %8s %8s %8s %9s %s\n", "shape", "M", "sp", "gemv", "skinny",
              "gemv_b2b", "skin_b2b", "rel_l2", "rows==M64");
  for (const auto& sh : shapes) {
    const int N = sh[0], K = sh[1];
    if (size_t(N) * K > hw.size()) continue;
    if (!skinny_sm90_supported(x, K, w, K, 64)) {
      std::printf("skinny GEMM not supported here\n");
      return 1;
    }
    auto out = [&](void* y) {
      GemvOut o{};
      o.y[0] = y;
      o.end[0] = N;
      o.cols[0] = N;
      o.nparts = 1;
      return o;
    };
    launch_skinny_sm90(x, K, w, N, K, 64, out(y64), ws, st);
    CK(cudaStreamSynchronize(st));
    const std::vector<float> r64 = download(y64, size_t(64) * N);
    for (int M : rows) {
      GemvOut o{};
      o.y[0] = y0;
      o.end[0] = N;
      o.cols[0] = N;
      o.nparts = 1;
      auto gemv = [&] { launch_gemv(x, K, w, N, K, M, o, st); };
      auto skinny = [&] { launch_skinny_sm90(x, K, w, N, K, M, out(y1), ws, st); };
      const float tg = median_us(gemv, st, 1), bg = median_us(gemv, st, 20);
      const float bs = median_us(skinny, st, 20), ts = median_us(skinny, st, 1);
      CK(cudaStreamSynchronize(st));
      const std::vector<float> a = download(y0, size_t(M) * N), b = download(y1, size_t(M) * N);
      double num = 0, den = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(a[i]) * a[i];
      }
      const double rel = std::sqrt(num / std::max(den, 1e-30));
      const bool same = std::memcmp(b.data(), r64.data(), b.size() * sizeof(float)) == 0;
      bad += rel > 4e-3 || !same;
      std::printf("%6d x %6d %2d %2d %8.2f %8.2f %8.2f %8.2f %9.2e %s\n", N, K, M,
                  skinny_sm90_splits(N, K), tg, ts, bg, bs, rel, same ? "yes" : "NO");
    }
  }
  std::printf("%s\n", bad ? "FAILED" : "all equal");
  return bad ? 1 : 0;
}
