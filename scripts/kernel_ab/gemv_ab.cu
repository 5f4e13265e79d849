// A/B of the skinny GEMV kernels (bf16: cuda_gemv.cu, W4A16: cuda_gemv_int4.cu, W8A8 FP8:
// cuda_gemv_fp8.cu) built from one
// source tree, with nothing but the CUDA toolkit: scripts/kernel_ab/run.sh compiles this file
// against each variant's src/ on the GPU machine, runs every build and compares their outputs
// and times. Prints, per kernel, shape and row count M: the median µs of 30 launches (after 5
// warm-ups) and an FNV-1a hash of the output bytes (the same hash in two builds: the same
// bits). Inputs: fixed pseudo-random bf16 x and weights, int4 words repacked as at upload.
// FP8: random e4m3 codes (no NaN) for weights and x, per-row / per-channel scales.
// Usage: gemv_ab [KINDS] (a comma list of bf16, int4, fp8; default all).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ab_util.h"
#include "backend/cuda/cuda_kernels.h"

using namespace sala::cuda;
using kernel_ab::rng;

static uint64_t fnv(const std::vector<unsigned char>& b) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
  return h;
}

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : "";
  const int shapes[][2] = {{4096, 4096}, {12288, 4096}, {16384, 4096}, {32768, 4096}, {4096, 16384}};
  const int rows[] = {1, 8, 16, 40, 64};
  const int kMaxN = 32768, kMaxK = 16384, kMaxM = 64;
  uint64_t s = 12345;
  std::vector<__nv_bfloat16> hx(size_t(kMaxM) * kMaxK), hw(size_t(kMaxN) * 4096 + size_t(4096) * kMaxK);
  for (auto& v : hx) v = __float2bfloat16(float(int(rng(s) % 2001) - 1000) / 1000.f);
  for (auto& v : hw) v = __float2bfloat16(float(int(rng(s) % 2001) - 1000) / 20000.f);
  std::vector<uint32_t> hq(hw.size() / 8);
  for (auto& v : hq) v = rng(s);
  std::vector<float> hs(hw.size() / 128);
  for (auto& v : hs) v = float(1 + rng(s) % 1000) / 50000.f;
  auto e4m3 = [&] {  // any code but the NaNs 0x7f / 0xff
    const uint8_t c = uint8_t(rng(s));
    return (c & 0x7f) == 0x7f ? uint8_t(c & 0xfe) : c;
  };
  std::vector<uint8_t> hc(hw.size()), hxq(size_t(kMaxM) * kMaxK);
  for (auto& v : hc) v = e4m3();
  for (auto& v : hxq) v = e4m3();
  std::vector<float> hsx(kMaxM), hws(kMaxN);
  for (auto& v : hsx) v = float(1 + rng(s) % 1000) / 100000.f;
  for (auto& v : hws) v = float(1 + rng(s) % 1000) / 100000.f;
  __nv_bfloat16 *x, *w, *y;
  uint32_t* q;
  float *sc, *sx, *wsc;
  uint8_t *wq, *xq;
  CK(cudaMalloc(&wq, hc.size()));
  CK(cudaMalloc(&xq, hxq.size()));
  CK(cudaMalloc(&sx, hsx.size() * 4));
  CK(cudaMalloc(&wsc, hws.size() * 4));
  CK(cudaMemcpy(wq, hc.data(), hc.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(xq, hxq.data(), hxq.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sx, hsx.data(), hsx.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(wsc, hws.data(), hws.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&x, hx.size() * 2));
  CK(cudaMalloc(&w, hw.size() * 2));
  CK(cudaMalloc(&q, hq.size() * 4));
  CK(cudaMalloc(&sc, hs.size() * 4));
  CK(cudaMalloc(&y, size_t(kMaxM) * kMaxN * 2));
  CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sc, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  launch_int4_repack(q, int64_t(hq.size()), st);
  gemv_init();
  gemv_int4_init();
  gemv_fp8_init();
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const char* names[] = {"bf16", "int4", "fp8"};
  for (int kind = 0; kind < 3; ++kind) {
    if (*only && ("," + std::string(only) + ",").find("," + std::string(names[kind]) + ",") ==
                     std::string::npos)
      continue;
    for (const auto& sh : shapes)
      for (int M : rows) {
        const int N = sh[0], K = sh[1];
        GemvOut o{};
        o.y[0] = y;
        o.end[0] = N;
        o.cols[0] = N;
        o.nparts = 1;
        auto launch = [&] {
          if (kind == 0) launch_gemv(x, K, w, N, K, M, o, st);
          else if (kind == 1) launch_gemv_int4(x, K, q, sc, N, K, 128, M, o, st);
          else launch_gemv_fp8(xq, K, sx, wq, wsc, N, K, M, o, st);
        };
        std::vector<float> us;
        for (int i = 0; i < 35; ++i) {
          CK(cudaEventRecord(e0, st));
          launch();
          CK(cudaEventRecord(e1, st));
          CK(cudaEventSynchronize(e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (i >= 5) us.push_back(ms * 1000.f);
        }
        std::sort(us.begin(), us.end());
        std::vector<unsigned char> out(size_t(M) * N * 2);
        CK(cudaMemcpy(out.data(), y, out.size(), cudaMemcpyDeviceToHost));
        std::printf("%-4s %6d x %5d M=%2d %9.2f us  %016llx\n", names[kind], N, K, M,
                    us[us.size() / 2], (unsigned long long)fnv(out));
      }
  }
  return 0;
}
