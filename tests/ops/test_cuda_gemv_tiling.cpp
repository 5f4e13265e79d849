// The bf16 skinny GEMM's tilings (cuda_gemv.cu, GemvTiling: tiles of 32, 64 or 128 weight rows,
// and 32 rows in the wide kernel's loop, issue 21) give the same bits: the 32-row ring is the reference (its rows are tested against
// the CPU and for row invariance in test_cuda_gemv.cpp), every wider tiling must equal it bit
// for bit, for every M in 1..64, so a verify row equals its decode row whatever tiling either
// step runs.
//   GemvTilingsBitEqual   shapes with odd N, K not a multiple of 128 (slices ending inside a
//                         u-step, slices empty), strided x, several tiles per CTA; plain bf16,
//                         fp32 logits, parts (boundaries inside tiles), silu_pair (N a
//                         multiple of 256, of 128 only: 128-row tiles narrowed to 64, of 64
//                         only: the 32-row ring)
//   CudaFp8Gemv.TilingsBitEqual  the same for the FP8 GEMV (launch_gemv_fp8's tilings)
//   CudaFp8Gemv.TilingSpeed      us per tiling on the model's shapes (prints)
// Without a GPU the tests GTEST_SKIP (SALA_REQUIRE_GPU=1: a failure).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "cuda_test_util.h"

namespace sala::test {
namespace {

using cuda::GemvOut;
using cuda::GemvTiling;

#define TILING_CUDA_OK(call)                                                                      \
  do {                                                                                            \
    const cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { TILING_CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

// One GEMV problem on the device: x [64, ldx] (the first K of each row used), w [N, K].
struct Problem {
  int64_t K, N, ldx;
  Buf x, w;
  Problem(int64_t k, int64_t n, int64_t ld, uint32_t seed)
      : K(k), N(n), ldx(ld), x(size_t(64 * ld) * 2), w(size_t(n * k) * 2) {
    const HostMat hx = randn(64, ld, seed, 1.f), hw = randn(n, k, seed + 1, 1.f / 64.f);
    TILING_CUDA_OK(cudaMemcpy(x.p, hx.bits.data(), hx.bits.size() * 2, cudaMemcpyHostToDevice));
    TILING_CUDA_OK(cudaMemcpy(w.p, hw.bits.data(), hw.bits.size() * 2, cudaMemcpyHostToDevice));
  }
  // The raw output bytes of rows [0, M) (parts side by side, part by part) under `tiling`;
  // outputs pre-filled with `fill` bytes, so an output one tiling leaves unwritten differs.
  // cols: the parts' columns (silu_pair: one part of N / 2).
  std::vector<uint8_t> run(int M, const std::vector<int64_t>& cols, bool f32, bool silu,
                           GemvTiling tiling, int fill) {
    GemvOut o{};
    std::vector<std::unique_ptr<Buf>> ys;
    const size_t es = f32 ? 4 : 2;
    int64_t end = 0;
    for (size_t p = 0; p < cols.size(); ++p) {
      ys.push_back(std::make_unique<Buf>(size_t(M * cols[p]) * es));
      TILING_CUDA_OK(cudaMemset(ys.back()->p, fill, size_t(M * cols[p]) * es));
      end += cols[p];
      o.y[p] = ys.back()->p, o.end[p] = silu ? N : end, o.cols[p] = cols[p];
    }
    o.nparts = int(cols.size());
    o.f32 = f32;
    o.silu_pair = silu;
    cuda::launch_gemv(static_cast<const cuda::bf16*>(x.p), ldx, static_cast<const cuda::bf16*>(w.p),
                      N, int(K), M, o, 0, tiling);
    TILING_CUDA_OK(cudaGetLastError());
    TILING_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> r;
    for (size_t p = 0; p < cols.size(); ++p) {
      std::vector<uint8_t> h(size_t(M * cols[p]) * es);
      TILING_CUDA_OK(cudaMemcpy(h.data(), ys[p]->p, h.size(), cudaMemcpyDeviceToHost));
      r.insert(r.end(), h.begin(), h.end());
    }
    return r;
  }
};

const char* name(GemvTiling t) {
  switch (t) {
    case GemvTiling::kRows32: return "rows32";
    case GemvTiling::kRows32Ahead: return "rows32-ahead";
    case GemvTiling::kRows64: return "rows64";
    case GemvTiling::kRows128: return "rows128";
    default: return "auto";
  }
}

// Every other tiling (32 rows ahead, 64, 128 rows, auto) equals the 32-row ring bit for bit,
// M = 1..64, on every output mode; counts the launches that really ran gemv_wide_kernel (must
// be most of them on a GPU with the ring).
TEST(CudaOps, GemvTilingsBitEqual) {
  REQUIRE_GPU();
  struct S {
    int64_t K, N, ldx;
    const char* mode;  // "bf16", "f32", "parts", "silu"
  };
  // K = 1000: 125 chunks, slices of 16, the last 13 (a partial u-step); K = 8: one chunk,
  // warps 1..7 empty; K = 4104: slices of 68 chunks (stages past the slice's 16-chunk steps);
  // N = 17000: more tiles than SMs at every width; ldx > K: strided rows.
  const S shapes[] = {{4096, 1024, 4096, "bf16"}, {1000, 77, 1000, "bf16"},
                      {4104, 333, 4112, "bf16"},  {8, 45, 8, "bf16"},
                      {2056, 129, 2056, "f32"},   {16384, 300, 16384, "bf16"},
                      {4096, 17000, 4096, "bf16"}, {4096, 2048, 4096, "f32"},
                      {4096, 2048, 4096, "parts"}, {1000, 1000, 1000, "parts"},
                      {4096, 2176, 4096, "silu"},  {4096, 2112, 4096, "silu"},
                      {1032, 2304, 1032, "silu"}};
  uint32_t seed = 2100;
  int64_t wide_runs = 0, runs = 0;
  for (const S& s : shapes) {
    Problem pb(s.K, s.N, s.ldx, seed);
    seed += 2;
    const std::string mode = s.mode;
    const bool f32 = mode == "f32", silu = mode == "silu";
    std::vector<int64_t> cols{s.N};
    if (mode == "parts") cols = {s.N / 2 - 37, 101, s.N - (s.N / 2 - 37) - 101};  // inside tiles
    if (silu) {
      cols = {s.N / 2};
      ASSERT_TRUE(cuda::gemv_silu_pair_supported(s.N)) << s.N;
    }
    int bad = 0;
    for (int M = 1; M <= 64; ++M) {
      const std::vector<uint8_t> ref = pb.run(M, cols, f32, silu, GemvTiling::kRows32, 0xff);
      for (GemvTiling t : {GemvTiling::kRows32Ahead, GemvTiling::kRows64, GemvTiling::kRows128,
                           GemvTiling::kAuto}) {
        const std::vector<uint8_t> got = pb.run(M, cols, f32, silu, t, 0xfe);
        ++runs;
        const int rows = cuda::gemv_tile_rows(s.N, M, silu, t);
        wide_runs += rows > 32 || rows == -32;
        if (got == ref) continue;
        size_t i = 0;
        while (got[i] == ref[i]) ++i;
        if (bad++ < 4)
          ADD_FAILURE() << name(t) << " differs from rows32: K " << s.K << ", N " << s.N << ", "
                        << s.mode << ", M " << M << ", byte " << i << " of " << ref.size()
                        << " (tile rows " << rows << ")";
      }
    }
    EXPECT_EQ(bad, 0) << "K " << s.K << ", N " << s.N << ", " << s.mode;
  }
  std::printf("[ gemv tiling ] %lld of %lld launches ran gemv_wide_kernel (32-ahead, 64, 128)\n",
              (long long)wide_runs, (long long)runs);
  // kRows32Ahead always, kRows64 / kRows128 on every shape but silu N = 2112: > half of them.
  EXPECT_GT(wide_runs * 2, runs) << "the wide tiles did not run (no ring on this GPU?)";
}

// ---- FP8 (cuda_gemv_fp8.cu: launch_gemv_fp8's tilings) ----

// Random finite e4m3 codes (no NaN: 0x7f / 0xff never drawn), reproducible from seed.
std::vector<uint8_t> codes(size_t n, uint32_t seed) {
  std::vector<uint8_t> r(n);
  for (auto& c : r) {
    seed = seed * 1664525u + 1013904223u;
    c = uint8_t(((seed >> 9) % 0x7f) | ((seed >> 24) & 0x80));
  }
  return r;
}

// One FP8 problem: codes x [64, ldx] + scales sx [64], codes w [N, K] + scales [N].
struct Fp8Problem {
  int64_t K, N, ldx;
  Buf x, sx, w, ws;
  Fp8Problem(int64_t k, int64_t n, int64_t ld, uint32_t seed)
      : K(k), N(n), ldx(ld), x(size_t(64 * ld)), sx(64 * 4), w(size_t(n * k)), ws(size_t(n) * 4) {
    const std::vector<uint8_t> hx = codes(size_t(64 * ld), seed), hw = codes(size_t(n * k), seed + 1);
    std::vector<float> hsx(64), hws(static_cast<size_t>(n));
    for (size_t i = 0; i < hsx.size(); ++i) hsx[i] = 1e-3f * float(1 + i % 7);
    for (size_t i = 0; i < hws.size(); ++i) hws[i] = 1e-4f * float(1 + i % 5);
    TILING_CUDA_OK(cudaMemcpy(x.p, hx.data(), hx.size(), cudaMemcpyHostToDevice));
    TILING_CUDA_OK(cudaMemcpy(w.p, hw.data(), hw.size(), cudaMemcpyHostToDevice));
    TILING_CUDA_OK(cudaMemcpy(sx.p, hsx.data(), hsx.size() * 4, cudaMemcpyHostToDevice));
    TILING_CUDA_OK(cudaMemcpy(ws.p, hws.data(), hws.size() * 4, cudaMemcpyHostToDevice));
  }
  // As Problem::run.
  std::vector<uint8_t> run(int M, const std::vector<int64_t>& cols, bool f32, bool silu,
                           GemvTiling tiling, int fill) {
    GemvOut o{};
    std::vector<std::unique_ptr<Buf>> ys;
    const size_t es = f32 ? 4 : 2;
    int64_t end = 0;
    for (size_t p = 0; p < cols.size(); ++p) {
      ys.push_back(std::make_unique<Buf>(size_t(M * cols[p]) * es));
      TILING_CUDA_OK(cudaMemset(ys.back()->p, fill, size_t(M * cols[p]) * es));
      end += cols[p];
      o.y[p] = ys.back()->p, o.end[p] = silu ? N : end, o.cols[p] = cols[p];
    }
    o.nparts = int(cols.size());
    o.f32 = f32;
    o.silu_pair = silu;
    cuda::launch_gemv_fp8(static_cast<const uint8_t*>(x.p), ldx, static_cast<const float*>(sx.p),
                          static_cast<const uint8_t*>(w.p), static_cast<const float*>(ws.p), N,
                          int(K), M, o, 0, tiling);
    TILING_CUDA_OK(cudaGetLastError());
    TILING_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> r;
    for (size_t p = 0; p < cols.size(); ++p) {
      std::vector<uint8_t> h(size_t(M * cols[p]) * es);
      TILING_CUDA_OK(cudaMemcpy(h.data(), ys[p]->p, h.size(), cudaMemcpyDeviceToHost));
      r.insert(r.end(), h.begin(), h.end());
    }
    return r;
  }
};

// The FP8 GEMV's tilings (32 rows with x ahead; 64 rows for M <= 32) equal its 32-row ring bit
// for bit, M = 1..64: K = 1008 (63 chunks of 16 k: slices of 8, the last 7, each a partial
// 256-k group: the second 64-row stage of the group all zeros), K = 16 (one chunk), odd N,
// strided x, parts, fp32 logits, silu_pair (N a multiple of 128, and of 64 only: 32 rows).
TEST(CudaFp8Gemv, TilingsBitEqual) {
  REQUIRE_GPU();
  struct S {
    int64_t K, N, ldx;
    const char* mode;
  };
  const S shapes[] = {{4096, 1024, 4096, "bf16"}, {1008, 77, 1024, "bf16"},
                      {16, 45, 16, "bf16"},       {4112, 333, 4112, "f32"},
                      {4096, 17000, 4096, "bf16"}, {4096, 2048, 4096, "parts"},
                      {4096, 2176, 4096, "silu"},  {4096, 2112, 4096, "silu"}};
  uint32_t seed = 2300;
  int64_t wide_runs = 0, runs = 0;
  for (const S& s : shapes) {
    Fp8Problem pb(s.K, s.N, s.ldx, seed);
    seed += 2;
    const std::string mode = s.mode;
    const bool f32 = mode == "f32", silu = mode == "silu";
    std::vector<int64_t> cols{s.N};
    if (mode == "parts") cols = {s.N / 2 - 37, 101, s.N - (s.N / 2 - 37) - 101};
    if (silu) {
      cols = {s.N / 2};
      ASSERT_TRUE(cuda::gemv_fp8_silu_pair_supported(s.N)) << s.N;
    }
    int bad = 0;
    for (int M = 1; M <= 64; ++M) {
      const std::vector<uint8_t> ref = pb.run(M, cols, f32, silu, GemvTiling::kRows32, 0xff);
      for (GemvTiling t : {GemvTiling::kRows32Ahead, GemvTiling::kRows64, GemvTiling::kAuto}) {
        const std::vector<uint8_t> got = pb.run(M, cols, f32, silu, t, 0xfe);
        const int rows = cuda::gemv_fp8_tile_rows(s.N, M, silu, t);
        ++runs;
        wide_runs += rows > 32 || rows == -32;
        if (got == ref) continue;
        size_t i = 0;
        while (got[i] == ref[i]) ++i;
        if (bad++ < 4)
          ADD_FAILURE() << "fp8 " << name(t) << " differs from rows32: K " << s.K << ", N " << s.N
                        << ", " << s.mode << ", M " << M << ", byte " << i << " of " << ref.size()
                        << " (tile rows " << rows << ")";
      }
    }
    EXPECT_EQ(bad, 0) << "fp8 K " << s.K << ", N " << s.N << ", " << s.mode;
  }
  std::printf("[ gemv fp8 tiling ] %lld of %lld launches ran gemv8_wide_kernel\n",
              (long long)wide_runs, (long long)runs);
  EXPECT_EQ(wide_runs, runs) << "the wide kernel did not run (no ring on this GPU?)";
}

// The FP8 GEMV alone (codes already quantized) under each tiling on the model's shapes
// (weights rotated over more than the L2). Prints only; CudaFp8Gemv.Speed: the default tiling.
TEST(CudaFp8Gemv, TilingSpeed) {
  REQUIRE_GPU();
  std::printf("\n[ gemv fp8 tiling ] %-20s %4s %9s %9s %9s %9s %15s\n", "shape N x K", "M",
              "r32 us", "r32a us", "r64 us", "r128 us", "auto us (rows)");
  for (auto [N, K] : {std::pair<int64_t, int64_t>{4096, 4096}, {16384, 4096}, {32768, 4096},
                      {4096, 16384}, {73448, 4096}}) {
    const int64_t bytes = N * K;
    const int copies = int(std::max<int64_t>(2, (400ll << 20) / bytes + 1));
    Fp8Problem pb(K, N, K, 77);
    Buf w(size_t(bytes) * size_t(copies)), y(size_t(64 * N) * 2);
    for (int c = 0; c < copies; ++c)
      TILING_CUDA_OK(cudaMemcpy(static_cast<uint8_t*>(w.p) + c * bytes, pb.w.p, size_t(bytes),
                                cudaMemcpyDeviceToDevice));
    GemvOut o{};
    o.y[0] = y.p, o.end[0] = N, o.cols[0] = N, o.nparts = 1;
    for (int M : {1, 8, 16, 24, 32, 40, 48, 64}) {
      double us[cuda::kGemvTilings];
      for (int ti = 0; ti < cuda::kGemvTilings; ++ti) {
        auto call = [&](int i) {
          cuda::launch_gemv_fp8(static_cast<const uint8_t*>(pb.x.p), K,
                                static_cast<const float*>(pb.sx.p),
                                static_cast<const uint8_t*>(w.p) + (i % copies) * bytes,
                                static_cast<const float*>(pb.ws.p), N, int(K), M, o, 0,
                                GemvTiling(ti));
        };
        for (int i = 0; i < 3; ++i) call(i);
        TILING_CUDA_OK(cudaDeviceSynchronize());
        const int iters = 60;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) call(i);
        TILING_CUDA_OK(cudaDeviceSynchronize());
        us[ti] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                     .count() /
                 iters;
      }
      std::printf("[ gemv fp8 tiling ] %8lld x %-9lld %4d %9.2f %9.2f %9.2f %9.2f %9.2f (%3d)\n",
                  (long long)N, (long long)K, M, us[0], us[1], us[2], us[3], us[4],
                  cuda::gemv_fp8_tile_rows(N, M, false, GemvTiling::kAuto));
    }
  }
}

}  // namespace
}  // namespace sala::test
