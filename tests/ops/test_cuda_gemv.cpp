// The skinny GEMM (cuda_gemv.cu, M <= kGemvMaxRows = 64 rows in one pass over the weights)
// through the CUDA backend / GemmDispatch (harness: cuda_test_util.h; the FP8 GEMV's own tests:
// test_cuda_fp8_gemv.cpp):
//   GemvRowInvariance        a row's bits for M = 2..64 equal the row alone (plain, fp32
//                            logits, linear_multi parts, linear_silu_mul)
//   GemmDispatchVerifySteps  speculative verify steps (8 x 5 rows, with a prompt, 13 x 5 rows),
//                            bf16, FP8 and W4A16 weights: every sequence equals the sequence alone
//                            (bf16 runs of 17..64 rows on Hopper: the sequence in a 20-row step)
//   GemvSpeed                us / GB/s at M = 1 .. 64, and the same rows as launches of <= 16
// Without a GPU every test GTEST_SKIPs (SALA_REQUIRE_GPU=1: a failure).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_skinny_sm90.h"
#include "backend/step.h"
#include "cuda_test_util.h"
#include "fp8_gemm_test_util.h"

namespace sala::test {
namespace {

// Rows [0, M) of op(M) as fp32 [M, cols] (op writes the GPU tensor it returns).
template <class Op>
std::vector<float> gpu_rows(Backend& gpu, int64_t M, int64_t cols, Op&& op) {
  const Tensor y = op(M);
  std::vector<float> r(size_t(M * cols));
  gpu.download_f32(y, r.data());
  return r;
}

// Row r of `got` [M, cols] equals `alone[r]` (the row computed with M = 1), for every r < M;
// reports the first differing row and column.
void expect_rows_alone(const std::vector<std::vector<float>>& alone, const std::vector<float>& got,
                       int64_t M, int64_t cols, const std::string& what) {
  int64_t bad_rows = 0;
  for (int64_t r = 0; r < M; ++r) {
    const float* a = alone[size_t(r)].data();
    const float* b = got.data() + r * cols;
    if (std::memcmp(a, b, size_t(cols) * 4) == 0) continue;
    int64_t c = 0;
    while (c < cols && std::memcmp(a + c, b + c, 4) == 0) ++c;
    if (bad_rows++ < 4)
      ADD_FAILURE() << what << ": row " << r << " at M=" << M << " differs from the row alone at "
                    << "column " << c << " (" << b[c] << " vs " << a[c] << ")";
  }
  EXPECT_EQ(bad_rows, 0) << what << ": rows of M=" << M << " that differ from the row alone";
}

constexpr int64_t kInvarianceMs[] = {2, 3, 5, 8, 9, 11, 16, 17, 24, 31, 32, 33, 40, 57, 64};

// A decode / verify row's GEMV result must not depend on the other rows of the step: row r
// alone (M = 1) and inside steps of 2..64 rows (every n8-tile count: NT = 1, 2, 4, 8), bit for
// bit, on narrow and wide shapes, for plain outputs, fp32 logits, split parts (linear_multi)
// and the fused gate_up + SiLU (linear_silu_mul).
TEST(CudaOps, GemvRowInvariance) {
  REQUIRE_GPU();
  Pair p;
  struct S {
    int64_t K, N;
    bool f32_out;
  };
  uint32_t seed = 260;
  constexpr int64_t kRowsMax = 64;
  for (S s : {S{4096, 1024, false}, S{16384, 512, false}, S{1024, 77, false},
              S{4096, 2048, true}}) {
    const int64_t K = s.K, N = s.N;
    const DType yt = s.f32_out ? DType::F32 : DType::BF16;
    auto x = p.up(randn(kRowsMax, K, seed++, 1.f));
    auto w = p.up(randn(N, K, seed++, 1.f / 64.f));
    const std::string what = shape(s.f32_out ? "gemv f32-out" : "gemv", {K, N});
    auto run = [&](int64_t r0, int64_t M) {
      return gpu_rows(*p.gpu, M, N, [&](int64_t m) {
        auto y = p.out(m, N, yt);
        p.gpu->linear(x.g.slice_rows(r0, m), w.g, y.g);
        return y.g;
      });
    };
    std::vector<std::vector<float>> alone(kRowsMax);
    for (int64_t r = 0; r < kRowsMax; ++r) alone[size_t(r)] = run(r, 1);
    for (int64_t M : kInvarianceMs) expect_rows_alone(alone, run(0, M), M, N, what);
  }
  // linear_multi parts (boundaries inside 32-row tiles) and linear_silu_mul.
  const int64_t K = 4096, I = 1056;
  const std::vector<int64_t> parts{1000, 77, 531, 440};
  auto x = p.up(randn(kRowsMax, K, seed++, 1.f));
  auto wm = p.up(randn(2048, K, seed++, 1.f / 64.f));
  auto wg = p.up(randn(2 * I, K, seed++, 1.f / 64.f));
  auto multi = [&](int64_t r0, int64_t M) {
    std::vector<Pair::T2> ys;
    std::vector<Tensor*> yg;
    for (int64_t n : parts) ys.push_back(p.out(M, n));
    for (auto& y : ys) yg.push_back(&y.g);
    p.gpu->linear_multi(x.g.slice_rows(r0, M), wm.g, yg);
    std::vector<float> r(size_t(M * 2048));
    int64_t c0 = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      std::vector<float> h(size_t(M * parts[i]));
      p.gpu->download_f32(ys[i].g, h.data());
      for (int64_t m = 0; m < M; ++m)
        std::copy_n(h.begin() + m * parts[i], parts[i], r.begin() + m * 2048 + c0);
      c0 += parts[i];
    }
    return r;
  };
  auto silu = [&](int64_t r0, int64_t M) {
    return gpu_rows(*p.gpu, M, I, [&](int64_t m) {
      auto g = p.out(m, I), u = p.out(m, I);
      p.gpu->linear_silu_mul(x.g.slice_rows(r0, m), wg.g, g.g, u.g);
      return g.g;
    });
  };
  std::vector<std::vector<float>> alone_multi(kRowsMax), alone_silu(kRowsMax);
  for (int64_t r = 0; r < kRowsMax; ++r) {
    alone_multi[size_t(r)] = multi(r, 1);
    alone_silu[size_t(r)] = silu(r, 1);
  }
  for (int64_t M : kInvarianceMs) {
    expect_rows_alone(alone_multi, multi(0, M), M, 2048, "gemv linear_multi [4096, 2048]");
    expect_rows_alone(alone_silu, silu(0, M), M, I, "gemv linear_silu_mul [4096, 2x1056]");
  }
}

// GemmDispatch in steps of short multi-row sequences (speculative verify steps: each sequence
// its last token + drafts), bf16, FP8 and W4A16 weights: 8 sequences x 5 rows (40 rows: one
// GEMV), the same plus a 100-token prompt (a step that prefills: runs of merged short sequences
// and the prompt alone; W4A16: the prompt's rows dequantized + cuBLASLt), and 13 x 5 rows (65
// rows: runs of <= 64). Every sequence's rows equal
// the sequence alone bit for bit, through linear, linear_multi and linear_silu_mul; the steps
// are close to the CPU.
TEST(CudaOps, GemmDispatchVerifySteps) {
  REQUIRE_GPU();
  const int64_t K = 4096, N = 1024, I = 1056;
  const std::vector<int64_t> parts{512, 256, 256};
  std::vector<std::vector<int32_t>> steps = {std::vector<int32_t>(8, 5),
                                             {5, 5, 5, 5, 100, 5, 5, 5, 5, 5, 5, 5},
                                             std::vector<int32_t>(13, 5)};
  uint32_t seed = 1200;
  for (const int fmt : {0, 1, 2}) {  // bf16, FP8, W4A16 weights
    const bool fp8 = fmt == 1, int4 = fmt == 2;
    const char* fmt_name = fp8 ? "fp8 " : int4 ? "int4 " : "bf16 ";
    Pair p;
    auto weight = [&](int64_t rows) {
      const HostMat h = randn(rows, K, seed++, 1.f / 64.f);
      if (int4) {
        const Int4Host q = int4_rtn(h, 128);
        return std::pair<Weight, Weight>{upload_int4_host(*p.cpu, q), upload_int4_host(*p.gpu, q)};
      }
      if (!fp8) {
        auto t = p.up(h);
        return std::pair<Weight, Weight>{Weight(t.c), Weight(t.g)};
      }
      const W2 q = up_fp8(p, h);
      return std::pair<Weight, Weight>{q.c, q.g};
    };
    const auto w = weight(N), wm = weight(1024), wg = weight(2 * I);
    for (const auto& lens : steps) {
      StepMeta m;
      int64_t T = 0;
      for (size_t i = 0; i < lens.size(); ++i) {
        std::vector<int32_t> ids(size_t(lens[i]), 5);
        m.add_seq(ids.data(), lens[i], 100 + int64_t(i), int32_t(i), {}, true, true);
        T += lens[i];
      }
      auto x = p.up(randn(T, K, seed++, 1.f));
      // The three ops on rows [r0, r0 + n) of x, outputs side by side: [n, N + 1024 + I].
      const int64_t C = N + 1024 + I;
      auto ops = [&](int64_t r0, int64_t n, bool cpu_too) {
        auto y = p.out(n, N), g = p.out(n, I), u = p.out(n, I);
        std::vector<Pair::T2> ys;
        for (int64_t c : parts) ys.push_back(p.out(n, c));
        std::vector<Tensor*> yg, yc;
        for (auto& t : ys) yg.push_back(&t.g), yc.push_back(&t.c);
        const Tensor xg = x.g.slice_rows(r0, n);
        p.gpu->linear(xg, w.second, y.g);
        p.gpu->linear_multi(xg, wm.second, yg);
        p.gpu->linear_silu_mul(xg, wg.second, g.g, u.g);
        if (cpu_too) {
          const std::string what = std::string(fmt_name) + "verify step";
          const Tensor xc = x.c.slice_rows(r0, n);
          p.cpu->linear(xc, w.first, y.c);
          p.cpu->linear_silu_mul(xc, wg.first, g.c, u.c);
          expect_close(p.cmp(shape((what + " linear").c_str(), {n, K, N}), y), 4e-3, 1.6e-2);
          expect_close(p.cmp(shape((what + " linear_silu_mul").c_str(), {n, K, I}), g), 4e-3,
                       1.6e-2);
        }
        std::vector<float> r(size_t(n * C));
        auto put = [&](const Tensor& t, int64_t cols, int64_t c0) {
          std::vector<float> h(size_t(n * cols));
          p.gpu->download_f32(t, h.data());
          for (int64_t i = 0; i < n; ++i)
            std::copy_n(h.begin() + i * cols, cols, r.begin() + i * C + c0);
        };
        put(y.g, N, 0);
        int64_t c0 = N;
        for (size_t i = 0; i < parts.size(); ++i) put(ys[i].g, parts[i], c0), c0 += parts[i];
        put(g.g, I, c0);
        return r;
      };
      p.begin(m);
      const std::vector<float> step = ops(0, T, true);
      // The GEMM runs of the step (GemmDispatch::for_each_run): all rows, or past 64 rows one
      // per long sequence and groups of <= 64 rows of short ones. bf16 runs of 17..64 rows of
      // this prompt-free step take the Hopper skinny GEMM, whose rows equal the same rows in
      // any other such run (not the <= 16-row GEMV's bits): their reference is the sequence
      // in a step padded to 20 rows with the sequences after it (or before it).
      constexpr int64_t kRunMax = 64;  // for_each_run's kSkinnyRows in bf16 mode
      std::vector<int64_t> run_rows(lens.size(), T);
      if (T > kRunMax) {
        size_t b = 0;
        int64_t rr = 0;
        auto close = [&](size_t e) {
          for (size_t j = b; j < e; ++j) run_rows[j] = rr;
        };
        for (size_t i = 0; i < lens.size(); ++i) {
          if (lens[i] > kRunMax) {
            close(i);
            run_rows[i] = lens[i];
            b = i + 1;
            rr = 0;
            continue;
          }
          if (rr + lens[i] > kRunMax) {
            close(i);
            b = i;
            rr = 0;
          }
          rr += lens[i];
        }
        close(lens.size());
      }
      const bool skinny = fmt != 2 && sala::cuda::skinny_sm90_available();  // bf16, FP8
      int64_t r0 = 0;
      for (size_t i = 0; i < lens.size(); ++i) {
        int64_t from = r0, rows = lens[i];
        StepMeta alone_meta = rows_meta(lens[i], 100 + int64_t(i));
        if (skinny && run_rows[i] > 16 && lens[i] <= 16) {
          // This sequence plus neighbours of 5 rows (all logits: prompt-free) up to 20 rows.
          alone_meta = StepMeta{};
          from = std::min<int64_t>(r0, T - 20);
          for (int64_t q = from; q < from + 20; q += 5) {
            std::vector<int32_t> ids5(5, 5);
            alone_meta.add_seq(ids5.data(), 5, 100, 0, {}, true, true);
          }
          rows = 20;
          ASSERT_EQ(lens[i], 5) << "padding assumes 5-row calls";
        }
        p.gpu->begin_step(alone_meta);
        const std::vector<float> padded = ops(from, rows, false);
        const std::vector<float> alone(padded.begin() + (r0 - from) * C,
                                       padded.begin() + (r0 - from + lens[i]) * C);
        EXPECT_EQ(0, std::memcmp(alone.data(), step.data() + r0 * C, alone.size() * 4))
            << fmt_name << "step of " << lens.size() << " sequences (" << T
            << " rows): rows [" << r0 << ", " << r0 + lens[i] << ") of sequence " << i
            << " differ from the sequence alone";
        r0 += lens[i];
      }
    }
  }
}

// Bandwidth of the decode / verify-row GEMV on the model's shapes (printed; weights rotated
// over more than the L2), M = 1 .. 64 rows in one launch, and for comparison the same rows as
// launches of <= 16 rows (the dispatch before the GEMV took 64 rows: every launch streams the
// weights again). Asserts nothing about speed.
TEST(CudaOps, GemvSpeed) {
  REQUIRE_GPU();
  auto be = make_cuda_backend({NumericMode::BF16, 0});
  struct S {
    int64_t N, K;
  };
  constexpr int64_t kRows = 64;
  std::printf("\n[ gemv ] %-22s %4s %10s %10s %8s %14s %10s\n", "shape N x K", "M", "us", "GB/s",
              "x M=1", "runs<=16 us", "skinny us");
  void* skinny_ws = nullptr;  // the skinny GEMM's workspace (sm_90 only)
  if (sala::cuda::skinny_sm90_available()) {
    sala::cuda::skinny_sm90_init();
    const size_t bytes = sala::cuda::skinny_sm90_workspace_bytes();
    ASSERT_EQ(cudaMalloc(&skinny_ws, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(skinny_ws, 0, bytes), cudaSuccess);
  }
  for (S s : {S{4096, 4096}, S{12288, 4096}, S{16384, 4096}, S{32768, 4096}, S{4096, 16384},
              S{73448, 4096}}) {
    const int copies = int(std::max<int64_t>(2, (400ll << 20) / (s.N * s.K * 2) + 1));
    std::vector<Tensor> ws;
    HostMat h = randn(s.N, s.K, 900, 0.02f);  // the same values in every copy
    for (int c = 0; c < copies; ++c) {
      TensorView v;
      v.dtype = DType::BF16;
      v.shape = {s.N, s.K};
      v.data = reinterpret_cast<const uint8_t*>(h.bits.data());
      v.nbytes = h.bits.size() * 2;
      ws.push_back(be->upload_weight(v));
    }
    HostMat hx = randn(kRows, s.K, 899, 1.f);
    TensorView vx;
    vx.dtype = DType::BF16;
    vx.shape = {kRows, s.K};
    vx.data = reinterpret_cast<const uint8_t*>(hx.bits.data());
    vx.nbytes = hx.bits.size() * 2;
    Tensor x = be->upload_weight(vx);
    Tensor y = be->alloc(kRows, s.N, DType::BF16);
    double us1 = 0;
    for (int64_t M : {1, 8, 16, 32, 40, 64}) {
      // chunk rows per launch: M (one GEMV), or 16 (the former runs)
      auto time = [&](int64_t chunk) {
        auto call = [&](int i) {
          for (int64_t r0 = 0; r0 < M; r0 += chunk) {
            const int64_t n = std::min(chunk, M - r0);
            Tensor xm = x.slice_rows(r0, n), ym{static_cast<uint16_t*>(y.data) + r0 * s.N,
                                                DType::BF16, n, s.N};
            be->linear(xm, ws[size_t(i % copies)], ym);
          }
        };
        for (int i = 0; i < 3; ++i) call(i);
        be->synchronize();
        const int iters = 60;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) call(i);
        be->synchronize();
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                   .count() /
               iters;
      };
      const double us = time(M);
      if (M == 1) us1 = us;
      const double runs = M > 16 ? time(16) : us;
      // The Hopper wgmma skinny GEMM on the same rows (speculative steps of 17..64 rows).
      double skinny_us = 0;
      if (skinny_ws) {
        sala::cuda::GemvOut o{};
        o.y[0] = y.data, o.end[0] = s.N, o.cols[0] = s.N, o.nparts = 1;
        auto call = [&](int i) {
          sala::cuda::launch_skinny_sm90(static_cast<const __nv_bfloat16*>(x.data), s.K,
                                         static_cast<const __nv_bfloat16*>(ws[size_t(i % copies)].data),
                                         s.N, int(s.K), int(M), o, skinny_ws, 0);
        };
        for (int i = 0; i < 3; ++i) call(i);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const int iters = 60;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) call(i);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        skinny_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                        .count() / iters;
      }
      std::printf("[ gemv ] %8lld x %-12lld %4lld %10.2f %10.0f %8.2f %14.2f %10.2f\n",
                  (long long)s.N, (long long)s.K, (long long)M, us,
                  double(s.N) * double(s.K) * 2 / us / 1e3, us / us1, runs, skinny_us);
    }
  }
  if (skinny_ws) cudaFree(skinny_ws);
}

}  // namespace
}  // namespace sala::test
