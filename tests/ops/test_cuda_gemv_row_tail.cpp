// The ring GEMVs' row tail (GemvOut::tail, cuda_gemv_row_tail.cuh: the residual norm after
// o_proj / down_proj, done by the GEMV's last CTAs) against what it replaces: the GEMV, then
// launch_rmsnorm (bf16 activations) or launch_rmsnorm_fp8 (with the next projection's FP8
// codes) with a = y.
//
//   BitExact      bf16 and FP8 weights; n = 2048, 4096, 8192 (V = 1, 2, 4 of the kernel's
//                 threads per tail thread); K = 1024 / n / 16384; M = 1..16; no codes, codes,
//                 codes with skip_out, codes at an odd address: y, h, out, codes and scales bit
//                 for bit; two calls back to back (the second on the first's h: the arrival
//                 count is zero again after each call, also read back)
//   GraphReplay   three fused launches recorded in a CUDA graph, replayed three times (h
//                 reset before each): the bits of the same three eager calls
//   Speed         µs per call back to back (weights rotated past L2) of o_proj's and
//                 down_proj's shapes, M = 1, 8, 16: the GEMV alone, the GEMV then the norm
//                 kernel, the GEMV with the tail; with and without FP8 codes (prints only: the
//                 tail's own cost, which session 44's timelines put above its work)
// Without a GPU every test GTEST_SKIPs (cuda_test_util.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "cuda_fp8_fused_util.h"
#include "cuda_test_util.h"

namespace sala::test {
namespace {

using cuda::bf16;
using cuda::Fp8Act;
using cuda::GemvOut;

enum class Codes { kNone, kAligned, kSkipOut, kOdd };

// One problem: x [M, K] bf16 (and its FP8 codes), W [n, K] (bf16 or e4m3 codes with per-row
// scales), h [M, n], the norm weight [n].
struct Problem {
  int64_t M, K, n;
  bool fp8;
  HostMat x, w16, h, nw;
  std::vector<uint8_t> w8;
  std::vector<float> ws;
  Problem(int64_t M_, int64_t K_, int64_t n_, bool fp8_, uint32_t seed)
      : M(M_), K(K_), n(n_), fp8(fp8_), x(randn(M_, K_, seed, 1.f)),
        w16(fp8_ ? HostMat{} : randn(n_, K_, seed + 1, 0.05f)), h(randn(M_, n_, seed + 2, 2.f)),
        nw(randn(1, n_, seed + 3, 0.2f, 1.f)) {
    if (!fp8) return;
    std::mt19937 rng(seed + 4);
    w8.resize(size_t(n * K));
    for (auto& c : w8) {
      c = uint8_t(rng() & 0xffu);
      if ((c & 0x7fu) == 0x7fu) c ^= 1u;  // no NaN codes (the quantizer never writes them)
    }
    ws.resize(size_t(n));
    for (auto& s : ws) s = 1e-3f * float(1 + rng() % 100);
  }
};

struct Result {
  std::vector<uint8_t> y, h, out, codes, scales;
};

// The GEMV of p's first M rows (fused: with the tail) on fresh device copies; `calls`
// back-to-back calls, each on the h the previous one left.
Result run(const Problem& p, int64_t M, Codes codes, bool fused, int calls = 1) {
  const int64_t K = p.K, n = p.n;
  const size_t act = size_t(M * n) * 2;
  Dev x(size_t(M * K) * 2, p.x.bits.data()), xq(size_t(M * K) + 16), sx(size_t(M) * 4),
      w(p.fp8 ? p.w8.size() : size_t(n * K) * 2, p.fp8 ? static_cast<const void*>(p.w8.data())
                                                         : p.w16.bits.data()),
      ws(size_t(n) * 4, p.fp8 ? p.ws.data() : nullptr), y(act), h(act, p.h.bits.data()),
      nw(size_t(n) * 2, p.nw.bits.data()), out(act), q(size_t(M * n) + 256),
      qs(size_t(M) * 4), sync(8);
  CUDA_OK(cudaMemset(y.p, 0xff, act));
  CUDA_OK(cudaMemset(out.p, 0xff, act));
  CUDA_OK(cudaMemset(q.p, 0xa5, q.n));
  CUDA_OK(cudaMemset(sync.p, 0, 8));
  const cudaStream_t st = nullptr;
  Fp8Act fa{};
  if (codes != Codes::kNone) {
    fa.codes = q.as<uint8_t>(codes == Codes::kOdd ? 1 : 0);
    fa.scales = qs.as<float>();
    fa.skip_out = codes == Codes::kSkipOut;
  }
  GemvOut o{};
  o.y[0] = y.p;
  o.end[0] = n;
  o.cols[0] = n;
  o.nparts = 1;
  const float alpha = 0.375f, eps = 1e-5f;
  for (int c = 0; c < calls; ++c) {
    if (fused) {
      o.tail.h = h.as<bf16>();
      o.tail.w = nw.as<bf16>();
      o.tail.alpha = alpha;
      o.tail.eps = eps;
      o.tail.out = out.as<bf16>();
      o.tail.q = fa;
      o.tail.sync = sync.as<unsigned>();
      o.tail.n = int(n);
    }
    if (p.fp8) {
      cuda::launch_quantize_rows_fp8(x.as<bf16>(), M, K, K, xq.as<uint8_t>(), sx.as<float>(), st);
      cuda::launch_gemv_fp8(xq.as<uint8_t>(), K, sx.as<float>(), w.as<uint8_t>(), ws.as<float>(),
                            n, int(K), int(M), o, st);
    } else {
      cuda::launch_gemv(x.as<bf16>(), K, w.as<bf16>(), n, int(K), int(M), o, st);
    }
    if (!fused) {
      if (codes == Codes::kNone)
        cuda::launch_rmsnorm<bf16>(h.as<bf16>(), y.as<bf16>(), alpha, nw.as<bf16>(), int(n), M,
                                   eps, out.as<bf16>(), st);
      else
        cuda::launch_rmsnorm_fp8(h.as<bf16>(), y.as<bf16>(), alpha, nw.as<bf16>(), nullptr,
                                 int(n), M, eps, out.as<bf16>(), fa, st);
    }
  }
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(sync.get(4), std::vector<uint8_t>(4, 0)) << "arrival count not zero after the GEMV";
  Result r{y.get(act), h.get(act), out.get(act), {}, {}};
  if (codes != Codes::kNone) {
    r.codes = q.get(size_t(M * n), codes == Codes::kOdd ? 1 : 0);
    r.scales = qs.get(size_t(M) * 4);
  }
  return r;
}

void expect_same(const Result& ref, const Result& got, Codes codes, const std::string& name) {
  EXPECT_EQ(first_diff(ref.y, got.y), -1) << name << ": y differs";
  EXPECT_EQ(first_diff(ref.h, got.h), -1) << name << ": h differs";
  if (codes != Codes::kSkipOut) {
    const int64_t i = first_diff(ref.out, got.out);
    EXPECT_EQ(i, -1) << name << ": out differs first at element " << i / 2;
  }
  EXPECT_EQ(first_diff(ref.codes, got.codes), -1) << name << ": codes differ";
  EXPECT_EQ(first_diff(ref.scales, got.scales), -1) << name << ": scales differ";
}

bool tail_runs_here(bool fp8) {
  return fp8 ? cuda::gemv_fp8_row_tail_supported() : cuda::gemv_row_tail_supported();
}

TEST(CudaGemvRowTail, BitExact) {
  REQUIRE_GPU();
  if (!tail_runs_here(false)) GTEST_SKIP() << "no ring GEMV on this GPU";
  uint32_t seed = 4400;
  for (bool fp8 : {false, true})
    for (int64_t n : {2048, 4096, 8192})
      for (int64_t K : {int64_t(1024), n, int64_t(16384)}) {
        if (K == 16384 && n != 4096) continue;
        const Problem p(cuda::kGemvRowTailRows, K, n, fp8, seed += 8);
        for (int64_t M = 1; M <= cuda::kGemvRowTailRows; ++M) {
          if (n != 4096 && M % 5 != 1) continue;  // 1, 6, 11, 16
          for (Codes c : {Codes::kNone, Codes::kAligned, Codes::kSkipOut, Codes::kOdd}) {
            if (c == Codes::kOdd && n != 4096) continue;
            const std::string name = std::string(fp8 ? "fp8" : "bf16") + " n " +
                                     std::to_string(n) + " K " + std::to_string(K) + " M " +
                                     std::to_string(M) + " codes " + std::to_string(int(c));
            const int calls = M == 3 || M == 16 ? 2 : 1;
            expect_same(run(p, M, c, false, calls), run(p, M, c, true, calls), c, name);
            if (HasFailure()) return;  // one shape's report is enough
          }
        }
      }
}

TEST(CudaGemvRowTail, GraphReplay) {
  REQUIRE_GPU();
  if (!tail_runs_here(true)) GTEST_SKIP() << "no ring GEMV on this GPU";
  for (bool fp8 : {false, true}) {
    const int64_t M = 8, K = 4096, n = 4096;
    const Problem p(M, K, n, fp8, fp8 ? 4500 : 4510);
    const Result eager = run(p, M, Codes::kAligned, true, 3);
    // The same three calls recorded once (the graph holds the sync counters' round trip),
    // replayed on the same inputs three times: each replay starts from the original h.
    const size_t act = size_t(M * n) * 2;
    Dev x(size_t(M * K) * 2, p.x.bits.data()), xq(size_t(M * K)), sx(size_t(M) * 4),
        w(fp8 ? p.w8.size() : size_t(n * K) * 2,
          fp8 ? static_cast<const void*>(p.w8.data()) : p.w16.bits.data()),
        ws(size_t(n) * 4, fp8 ? p.ws.data() : nullptr), y(act), h0(act, p.h.bits.data()),
        h(act), nw(size_t(n) * 2, p.nw.bits.data()), out(act), q(size_t(M * n)),
        qs(size_t(M) * 4), sync(8);
    CUDA_OK(cudaMemset(sync.p, 0, 8));
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    GemvOut o{};
    o.y[0] = y.p;
    o.end[0] = n;
    o.cols[0] = n;
    o.nparts = 1;
    o.tail.h = h.as<bf16>();
    o.tail.w = nw.as<bf16>();
    o.tail.alpha = 0.375f;
    o.tail.eps = 1e-5f;
    o.tail.out = out.as<bf16>();
    o.tail.q = Fp8Act{q.as<uint8_t>(), qs.as<float>(), false};
    o.tail.sync = sync.as<unsigned>();
    o.tail.n = int(n);
    if (fp8) {
      cuda::gemv_fp8_init();
      cuda::launch_quantize_rows_fp8(x.as<bf16>(), M, K, K, xq.as<uint8_t>(), sx.as<float>(), st);
    } else {
      cuda::gemv_init();
    }
    CUDA_OK(cudaStreamSynchronize(st));
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < 3; ++c) {
      if (fp8)
        cuda::launch_gemv_fp8(xq.as<uint8_t>(), K, sx.as<float>(), w.as<uint8_t>(),
                              ws.as<float>(), n, int(K), int(M), o, st);
      else
        cuda::launch_gemv(x.as<bf16>(), K, w.as<bf16>(), n, int(K), int(M), o, st);
    }
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; ++r) {
      CUDA_OK(cudaMemcpyAsync(h.p, h0.p, act, cudaMemcpyDeviceToDevice, st));
      CUDA_OK(cudaGraphLaunch(exec, st));
      CUDA_OK(cudaStreamSynchronize(st));
      const std::string name = std::string(fp8 ? "fp8" : "bf16") + " replay " + std::to_string(r);
      EXPECT_EQ(first_diff(eager.h, h.get(act)), -1) << name << ": h differs";
      EXPECT_EQ(first_diff(eager.out, out.get(act)), -1) << name << ": out differs";
      EXPECT_EQ(first_diff(eager.codes, q.get(size_t(M * n))), -1) << name << ": codes differ";
      EXPECT_EQ(sync.get(4), std::vector<uint8_t>(4, 0)) << name << ": arrival count not zero";
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(st));
  }
}

TEST(CudaGemvRowTail, Speed) {
  REQUIRE_GPU();
  if (!tail_runs_here(true) || !tail_runs_here(false)) GTEST_SKIP() << "no ring GEMV here";
  std::printf("\n[ row tail ] %-4s %-9s %3s %-5s %9s %12s %12s %9s\n", "w", "proj", "M", "codes",
              "gemv us", "gemv+norm", "gemv+tail", "saved us");
  const int64_t n = 4096, kRows = cuda::kGemvRowTailRows;
  for (bool fp8 : {false, true})
    for (int64_t K : {int64_t(4096), int64_t(16384)}) {
      const int64_t bytes = n * K * (fp8 ? 1 : 2);
      const int copies = int(std::max<int64_t>(2, (400ll << 20) / bytes + 1));
      const HostMat hx = randn(kRows, K, 4700, 1.f), hh = randn(kRows, n, 4701, 2.f),
                    hw = randn(1, n, 4702, 0.2f, 1.f);
      Dev w(size_t(bytes) * size_t(copies)), ws(size_t(n) * 4),
          x(size_t(kRows * K) * 2, hx.bits.data()), xq(size_t(kRows * K)), sx(size_t(kRows) * 4), y(size_t(kRows * n) * 2),
          h(size_t(kRows * n) * 2, hh.bits.data()), nw(size_t(n) * 2, hw.bits.data()),
          out(size_t(kRows * n) * 2), q(size_t(kRows * n)), qs(size_t(kRows) * 4), sync(8);
      CUDA_OK(cudaMemset(w.p, 0x34, w.n));  // e4m3 0.75 / a small bf16 pair
      CUDA_OK(cudaMemset(sync.p, 0, 8));
      std::vector<float> sw(size_t(n), 1e-3f);
      CUDA_OK(cudaMemcpy(ws.p, sw.data(), sw.size() * 4, cudaMemcpyHostToDevice));
      cuda::launch_quantize_rows_fp8(x.as<bf16>(), kRows, K, K, xq.as<uint8_t>(), sx.as<float>(),
                                     0);
      for (int M : {1, 8, 16})
        for (bool codes : {false, true}) {
          if (codes && !fp8) continue;  // bf16 weights: the next projection's input is bf16
          const Fp8Act fa = codes ? Fp8Act{q.as<uint8_t>(), qs.as<float>(), true} : Fp8Act{};
          double us[3];
          for (int mode = 0; mode < 3; ++mode) {  // gemv, gemv + norm kernel, gemv + tail
            GemvOut o{};
            o.y[0] = y.p, o.end[0] = n, o.cols[0] = n, o.nparts = 1;
            if (mode == 2) {
              o.tail.h = h.as<bf16>(), o.tail.w = nw.as<bf16>(), o.tail.alpha = 0.01f;
              o.tail.eps = 1e-6f, o.tail.out = out.as<bf16>(), o.tail.q = fa;
              o.tail.sync = sync.as<unsigned>(), o.tail.n = int(n);
            }
            auto step = [&](int i) {
              const size_t off = size_t(i % copies) * size_t(bytes);
              if (fp8)
                cuda::launch_gemv_fp8(xq.as<uint8_t>(), K, sx.as<float>(), w.as<uint8_t>(off),
                                      ws.as<float>(), n, int(K), M, o, 0);
              else
                cuda::launch_gemv(x.as<bf16>(), K, w.as<bf16>(off), n, int(K), M, o, 0);
              if (mode != 1) return;
              if (codes)
                cuda::launch_rmsnorm_fp8(h.as<bf16>(), y.as<bf16>(), 0.01f, nw.as<bf16>(),
                                         nullptr, int(n), M, 1e-6f, out.as<bf16>(), fa, 0);
              else
                cuda::launch_rmsnorm<bf16>(h.as<bf16>(), y.as<bf16>(), 0.01f, nw.as<bf16>(),
                                           int(n), M, 1e-6f, out.as<bf16>(), 0);
            };
            for (int i = 0; i < 3; ++i) step(i);
            CUDA_OK(cudaDeviceSynchronize());
            const int iters = 200;
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < iters; ++i) step(i);
            CUDA_OK(cudaDeviceSynchronize());
            us[mode] = std::chrono::duration<double, std::micro>(
                           std::chrono::steady_clock::now() - t0).count() / iters;
          }
          std::printf("[ row tail ] %-4s %-9s %3d %-5s %9.2f %12.2f %12.2f %9.2f\n",
                      fp8 ? "fp8" : "bf16", K == n ? "o_proj" : "down_proj", M,
                      codes ? "yes" : "no", us[0], us[1], us[2], us[1] - us[2]);
        }
    }
}

}  // namespace
}  // namespace sala::test
