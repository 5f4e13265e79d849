// FP8 activation codes written by the kernel that makes the activation (issue 17, item 5): the
// RMSNorm kernels and the SiLU product write the per-token e4m3 codes and scales of their bf16
// output when an FP8 projection reads it next, and that projection launches no quantize
// kernel. The contract is the composition it replaces, bit for bit (part of the test_cuda_ops
// binary; CudaBackend's side: test_cuda_fp8_hint.cpp):
//   NormCodesBitExact     launch_rmsnorm_fp8 (plain, fused residual, output gate; the warp,
//                         block and 16-byte-vector kernels; rows 1..64 and 300; widths
//                         48..16384; codes 8-byte aligned or not; the gate in place) == the
//                         norm kernel then launch_quantize_rows_fp8: out, h, codes and scales
//                         bit for bit; codes and scales also == core/fp8.h's fp8_quantize_rows
//                         of out (the CPU oracle); with Fp8Act::skip_out (out may stay
//                         unstored) h, codes and scales likewise
//   SiluMulCodesBitExact  launch_silu_mul_fp8 == launch_silu_mul then launch_quantize_rows_fp8,
//                         and core/fp8.h's codes, likewise (the row-in-registers kernels at
//                         widths 16384 and 1024, the read-back one at 1000 and 1001)
//   SiluMulHalvesBitExact the stacked gate_up GEMM's SiLU product (x [rows, 2 I] halves):
//                         launch_silu_mul_halves == launch_silu_mul on the halves apart, and
//                         launch_silu_mul_halves_fp8 == that then launch_quantize_rows_fp8
//   SplitColsExact        launch_split_cols == the parts' columns copied on the host (16-byte
//                         and single-element paths, 1..64 rows)
//   Speed                 per projection of a decode step: norm + quantize + FP8 GEMV against
//                         the fused norm + GEMV, and the GEMV alone (prints only)
// Without a GPU every test GTEST_SKIPs (cuda_test_util.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "core/fp8.h"
#include "cuda_fp8_fused_util.h"
#include "cuda_test_util.h"

namespace sala::test {
namespace {

using cuda::bf16;

// x [rows, cols] (the norm input; h for the residual), a and gate [rows, cols], w [cols]:
// N(0, 4) rows; row 3 zero (x and a: out is 0, scale 1), row 5 with outliers, row 6 one-hot
// (out has one non-zero: its code saturates at 448).
struct NormIn {
  HostMat x, a, gate, w;
  NormIn(int64_t rows, int64_t cols, uint32_t seed)
      : x(randn(rows, cols, seed, 2.f)), a(randn(rows, cols, seed + 1, 1.f)),
        gate(randn(rows, cols, seed + 2, 2.f)), w(randn(1, cols, seed + 3, 0.2f, 1.f)) {
    auto row = [&](HostMat& m, int64_t r) { return m.bits.data() + r * cols; };
    if (rows > 3) {
      std::fill_n(row(x, 3), cols, uint16_t(0));
      std::fill_n(row(a, 3), cols, uint16_t(0));
    }
    if (rows > 5)
      for (int64_t c = 5; c < cols; c += 97) row(x, 5)[c] = uint16_t(row(x, 5)[c] + (7u << 7));
    if (rows > 6) {
      std::fill_n(row(x, 6), cols, uint16_t(0));
      std::fill_n(row(a, 6), cols, uint16_t(0));
      row(x, 6)[cols / 3] = 0x4040;  // 3.0
    }
  }
};

// One norm launch on fresh device copies of the inputs: the unfused kernel (then
// launch_quantize_rows_fp8) or launch_rmsnorm_fp8; out, h (= x after the residual), codes and
// scales come back as bytes. codes_off: bytes from a 256-aligned start (1: unaligned).
struct NormRun {
  std::vector<uint8_t> out, h, codes, scales;
};
NormRun run_norm(const NormIn& in, Producer pr, bool fused, bool in_place, int codes_off,
                 bool skip_out = false) {
  const int64_t rows = in.x.rows, cols = in.x.cols;
  const size_t act = size_t(rows * cols) * 2;
  Dev x(act, in.x.bits.data()), a(act, in.a.bits.data()), g(act, in.gate.bits.data()),
      w(size_t(cols) * 2, in.w.bits.data()), o(act), codes(size_t(rows * cols) + 256),
      sc(size_t(rows) * 4);
  CUDA_OK(cudaMemset(o.p, 0xff, act));
  CUDA_OK(cudaMemset(codes.p, 0xa5, codes.n));
  bf16* out = in_place ? x.as<bf16>() : o.as<bf16>();
  const float eps = 1e-6f, alpha = 0.37f;
  const bf16* ap = pr == Producer::kResidual ? a.as<const bf16>() : nullptr;
  const bf16* gp = pr == Producer::kGate ? g.as<const bf16>() : nullptr;
  uint8_t* cp = codes.as<uint8_t>(size_t(codes_off));
  if (fused) {
    cuda::launch_rmsnorm_fp8(x.as<bf16>(), ap, alpha, w.as<bf16>(), gp, int(cols), rows, eps, out,
                             {cp, sc.as<float>(), skip_out}, 0);
  } else {
    if (gp)
      cuda::launch_rmsnorm_mul_sigmoid<bf16>(x.as<bf16>(), w.as<bf16>(), gp, int(cols), rows, eps,
                                             out, 0);
    else
      cuda::launch_rmsnorm<bf16>(x.as<bf16>(), ap, alpha, w.as<bf16>(), int(cols), rows, eps, out,
                                 0);
    cuda::launch_quantize_rows_fp8(out, rows, cols, cols, cp, sc.as<float>(), 0);
  }
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  const Dev& od = in_place ? x : o;
  return {od.get(act), x.get(act), codes.get(size_t(rows * cols), size_t(codes_off)),
          sc.get(size_t(rows) * 4)};
}

// The CPU oracle: core/fp8.h's fp8_quantize_rows of the bf16 values out [rows, cols] gives
// got's codes and scales, bit for bit.
void expect_oracle_codes(const std::string& name, const std::vector<uint8_t>& out, int64_t rows,
                         int64_t cols, const NormRun& got) {
  std::vector<float> v(size_t(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, out.data() + 2 * i, 2);
    v[i] = bf16_value(b);
  }
  std::vector<uint8_t> want(v.size());
  std::vector<float> want_s(static_cast<size_t>(rows));
  fp8_quantize_rows(v.data(), rows, cols, want.data(), want_s.data());
  const int64_t d = first_diff(want, got.codes);
  EXPECT_EQ(d, -1) << name << ": codes differ from core/fp8.h's first at row " << d / cols
                   << " col " << d % cols;
  EXPECT_EQ(0, std::memcmp(want_s.data(), got.scales.data(), want_s.size() * 4))
      << name << ": scales differ from core/fp8.h's";
}

TEST(CudaFp8Fused, NormCodesBitExact) {
  REQUIRE_GPU();
  std::vector<int64_t> all_rows;
  for (int64_t r = 1; r <= 17; ++r) all_rows.push_back(r);
  for (int64_t r : {24, 31, 32, 33, 40, 47, 48, 57, 63, 64, 300}) all_rows.push_back(r);
  // Widths: warp kernel (<= 512), block kernel (1032, 4112, 12288, 16384: not 8 · threads or
  // above 8192), 16-byte-vector kernel (4096, 8192).
  uint32_t seed = 1700;
  for (int64_t cols : {48, 512, 1032, 4096, 4112, 8192, 12288, 16384}) {
    const std::vector<int64_t> rows_list =
        cols == 4096 ? all_rows : std::vector<int64_t>{1, 2, 7, 16, 17, 33, 64};
    for (int64_t rows : rows_list) {
      const NormIn in(rows, cols, seed += 4);
      for (Producer pr : {Producer::kRmsnorm, Producer::kResidual, Producer::kGate})
        for (int variant = 0; variant < 5; ++variant) {
          // 0: out apart, codes aligned; 1: codes at an odd address; 2: in place (the gate, as
          // the lightning layer calls it); 3: skip_out; 4: skip_out in place
          if (variant == 1 && !(cols == 4096 || cols == 8192 || cols == 48)) continue;
          if ((variant == 2 || variant == 4) && pr != Producer::kGate) continue;
          const bool in_place = variant == 2 || variant == 4, skip = variant >= 3;
          const int off = variant == 1 ? 1 : 0;
          const std::string name = std::string(producer_name(pr)) + " fp8 codes" +
                                   shape("", {rows, cols, variant});
          const NormRun ref = run_norm(in, pr, false, in_place, off);
          const NormRun got = run_norm(in, pr, true, in_place, off, skip);
          if (!skip) {
            EXPECT_EQ(first_diff(ref.out, got.out), -1) << name << ": bf16 output differs";
          }
          if (!(skip && in_place)) {  // else h is out, which skip_out may leave unstored
            EXPECT_EQ(first_diff(ref.h, got.h), -1) << name << ": h (residual) differs";
          }
          const int64_t ds = first_diff(ref.scales, got.scales);
          EXPECT_EQ(ds, -1) << name << ": scales differ first at row " << ds / 4;
          if (const int64_t i = first_diff(ref.codes, got.codes); i >= 0)
            ADD_FAILURE() << name << ": codes differ first at row " << i / cols << " col "
                          << i % cols << " (0x" << std::hex << int(got.codes[size_t(i)])
                          << " vs 0x" << int(ref.codes[size_t(i)]) << ")";
          expect_oracle_codes(name, ref.out, rows, cols, got);
        }
    }
  }
}

// launch_silu_mul_fp8 == launch_silu_mul then launch_quantize_rows_fp8 (out, codes, scales bit
// for bit) and core/fp8.h's codes of out: the MLP's width (16384), narrower and odd widths
// (the 8-wide and the scalar path), out apart from g or in place, codes aligned or not.
TEST(CudaFp8Fused, SiluMulCodesBitExact) {
  REQUIRE_GPU();
  uint32_t seed = 1800;
  for (int64_t cols : {16384, 1024, 1000, 1001})
    for (int64_t rows : {1, 2, 9, 16, 17, 33, 40, 64, 300}) {
      if (cols != 16384 && rows == 300) continue;
      const HostMat hg = randn(rows, cols, seed++, 3.f), hu = randn(rows, cols, seed++, 1.f);
      const size_t act = size_t(rows * cols) * 2;
      // apart; in place; codes at an odd address; skip_out; skip_out in place
      for (int variant = 0; variant < 5; ++variant) {
        const bool in_place = variant == 1 || variant == 4, skip = variant >= 3;
        const size_t off = variant == 2 ? 1 : 0;
        NormRun r[2];
        for (int fused = 0; fused < 2; ++fused) {
          Dev g(act, hg.bits.data()), u(act, hu.bits.data()), o(act),
              codes(size_t(rows * cols) + 256), sc(size_t(rows) * 4);
          bf16* out = in_place ? g.as<bf16>() : o.as<bf16>();
          uint8_t* cp = codes.as<uint8_t>(off);
          if (fused) {
            cuda::launch_silu_mul_fp8(g.as<bf16>(), u.as<bf16>(), out, rows, cols,
                                      {cp, sc.as<float>(), skip}, 0);
          } else {
            cuda::launch_silu_mul<bf16>(g.as<bf16>(), u.as<bf16>(), out, rows * cols, 0);
            cuda::launch_quantize_rows_fp8(out, rows, cols, cols, cp, sc.as<float>(), 0);
          }
          CUDA_OK(cudaGetLastError());
          CUDA_OK(cudaDeviceSynchronize());
          r[fused] = {(in_place ? g : o).get(act), {}, codes.get(size_t(rows * cols), off),
                      sc.get(size_t(rows) * 4)};
        }
        const std::string name = "silu_mul fp8 codes" + shape("", {rows, cols, variant});
        if (!skip) {
          EXPECT_EQ(first_diff(r[0].out, r[1].out), -1) << name << ": bf16 output differs";
        }
        EXPECT_EQ(first_diff(r[0].scales, r[1].scales), -1) << name << ": scales differ";
        const int64_t dc = first_diff(r[0].codes, r[1].codes);
        EXPECT_EQ(dc, -1) << name << ": codes differ first at row " << dc / cols << " col "
                          << dc % cols;
        expect_oracle_codes(name, r[0].out, rows, cols, r[1]);
      }
    }
}

// x [rows, 2 I]: launch_silu_mul_halves == launch_silu_mul over the halves copied apart (bit for
// bit); launch_silu_mul_halves_fp8 == that output then launch_quantize_rows_fp8 (out unless
// skip_out, codes at an aligned or odd address, scales), and core/fp8.h's codes.
TEST(CudaFp8Fused, SiluMulHalvesBitExact) {
  REQUIRE_GPU();
  uint32_t seed = 1900;
  for (int64_t I : {16384, 1024, 1000, 1001})
    for (int64_t rows : {1, 17, 40, 64}) {
      const HostMat hx = randn(rows, 2 * I, seed++, 3.f);
      HostMat hg = randn(rows, I, 0), hu = randn(rows, I, 0);
      for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* xr = hx.bits.data() + r * 2 * I;
        std::copy(xr, xr + I, hg.bits.begin() + r * I);
        std::copy(xr + I, xr + 2 * I, hu.bits.begin() + r * I);
      }
      const size_t act = size_t(rows * I) * 2, n = size_t(rows * I);
      Dev x(2 * act, hx.bits.data()), g(act, hg.bits.data()), u(act, hu.bits.data()), ref(act),
          out(act), codes(n + 256), sc(size_t(rows) * 4);
      cuda::launch_silu_mul<bf16>(g.as<bf16>(), u.as<bf16>(), ref.as<bf16>(), rows * I, 0);
      cuda::launch_quantize_rows_fp8(ref.as<bf16>(), rows, I, I, codes.as<uint8_t>(),
                                     sc.as<float>(), 0);
      CUDA_OK(cudaDeviceSynchronize());
      NormRun want{ref.get(act), {}, codes.get(n), sc.get(size_t(rows) * 4)};
      const std::string name = "silu_mul halves" + shape("", {rows, I});
      cuda::launch_silu_mul_halves(x.as<bf16>(), rows, I, out.as<bf16>(), 0);
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(first_diff(out.get(act), want.out), -1) << name << ": bf16 output differs";
      for (int variant = 0; variant < 3; ++variant) {  // plain; codes at an odd address; skip_out
        const size_t off = variant == 1 ? 1 : 0;
        const bool skip = variant == 2;
        CUDA_OK(cudaMemset(out.p, 0, act));
        CUDA_OK(cudaMemset(codes.p, 0xa5, codes.n));
        cuda::launch_silu_mul_halves_fp8(x.as<bf16>(), rows, I, out.as<bf16>(),
                                         {codes.as<uint8_t>(off), sc.as<float>(), skip}, 0);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        const NormRun got{out.get(act), {}, codes.get(n, off), sc.get(size_t(rows) * 4)};
        const std::string v = name + " fp8 variant " + std::to_string(variant);
        if (!skip) {
          EXPECT_EQ(first_diff(got.out, want.out), -1) << v << ": bf16 output differs";
        }
        EXPECT_EQ(first_diff(got.scales, want.scales), -1) << v << ": scales differ";
        EXPECT_EQ(first_diff(got.codes, want.codes), -1) << v << ": codes differ";
        expect_oracle_codes(v, want.out, rows, I, got);
      }
    }
}

// launch_split_cols: columns [end[p-1], end[p]) of x [T, N] land in part p [T, width] as the
// host copies them; widths of multiples of 8 (16-byte path) and odd ones (element path).
TEST(CudaFp8Fused, SplitColsExact) {
  REQUIRE_GPU();
  uint32_t seed = 1950;
  const std::vector<std::vector<int64_t>> layouts = {
      {4096, 4096, 4096, 4096}, {4096, 256, 256, 4096}, {2048, 2048}, {1000, 24, 7}};
  for (const auto& widths : layouts)
    for (int64_t T : {1, 17, 64}) {
      int64_t N = 0;
      for (int64_t w : widths) N += w;
      const HostMat hx = randn(T, N, seed++);
      Dev x(size_t(T * N) * 2, hx.bits.data());
      std::vector<std::unique_ptr<Dev>> parts;
      cuda::GemvOut o{};
      o.nparts = int(widths.size());
      int64_t end = 0;
      for (size_t p = 0; p < widths.size(); ++p) {
        parts.push_back(std::make_unique<Dev>(size_t(T * widths[p]) * 2));
        CUDA_OK(cudaMemset(parts.back()->p, 0xff, parts.back()->n));
        end += widths[p];
        o.y[p] = parts.back()->p, o.end[p] = end, o.cols[p] = widths[p];
      }
      cuda::launch_split_cols(x.as<bf16>(), T, N, o, 0);
      CUDA_OK(cudaGetLastError());
      CUDA_OK(cudaDeviceSynchronize());
      int64_t c0 = 0;
      for (size_t p = 0; p < widths.size(); ++p) {
        std::vector<uint8_t> want(size_t(T * widths[p]) * 2);
        for (int64_t t = 0; t < T; ++t)
          std::memcpy(want.data() + size_t(t * widths[p]) * 2, hx.bits.data() + t * N + c0,
                      size_t(widths[p]) * 2);
        EXPECT_EQ(first_diff(parts[p]->get(want.size()), want), -1)
            << "split_cols" << shape("", {T, N}) << " part " << p;
        c0 += widths[p];
      }
    }
}

// ---- speed ----------------------------------------------------------------------------------

// One projection of a decode step at M rows: the producing norm, then either
// launch_quantize_rows_fp8 + the FP8 GEMV (today's composition without the hint) or the
// fused norm + the GEMV; the GEMV alone for reference. Weights rotated over more than the L2.
TEST(CudaFp8Fused, Speed) {
  REQUIRE_GPU();
  struct Proj {
    const char* name;
    int64_t N, K;
    Producer pr;
    bool silu;
  };
  const Proj projs[] = {
      {"lightning qkvz", 16384, 4096, Producer::kResidual, false},
      {"sparse qkvg", 8704, 4096, Producer::kResidual, false},
      {"gate_up+silu", 32768, 4096, Producer::kResidual, true},
      {"lightning o_proj", 4096, 4096, Producer::kGate, false},
  };
  std::printf("\n[ fp8 fused ] %-18s %4s %12s %12s %12s %9s\n", "projection", "M", "gemv us",
              "norm+q+gemv", "fused+gemv", "saved us");
  const int64_t kMaxK = 4096, kRows = cuda::kGemvMaxRows;
  const HostMat hx = randn(kRows, kMaxK, 1990, 1.f), hw = randn(1, kMaxK, 1991, 0.2f, 1.f);
  for (const Proj& p : projs) {
    const int64_t bytes = p.N * p.K;
    const int copies = int(std::max<int64_t>(2, (400ll << 20) / bytes + 1));
    Dev w(size_t(bytes) * size_t(copies)), s(size_t(p.N) * 4), y(size_t(kRows * p.N) * 2);
    Dev h(size_t(kRows * p.K) * 2, hx.bits.data()), a(size_t(kRows * p.K) * 2, hx.bits.data()),
        wn(size_t(p.K) * 2, hw.bits.data()), out(size_t(kRows * p.K) * 2),
        xq(size_t(kRows * p.K)), sx(size_t(kRows) * 4);
    CUDA_OK(cudaMemset(w.p, 0x34, w.n));  // 0.75
    std::vector<float> sw(size_t(p.N), 1e-3f);
    CUDA_OK(cudaMemcpy(s.p, sw.data(), sw.size() * 4, cudaMemcpyHostToDevice));
    cuda::GemvOut o{};
    o.y[0] = y.p, o.end[0] = p.N, o.cols[0] = p.silu ? p.N / 2 : p.N;
    o.nparts = 1, o.silu_pair = p.silu;
    // The residual adds 0.01 · a to h at every launch (h stays finite over the iterations).
    const bf16* ap = p.pr == Producer::kResidual ? a.as<const bf16>() : nullptr;
    const bf16* gp = p.pr == Producer::kGate ? a.as<const bf16>() : nullptr;
    for (int M : {1, 8, 16, 32, 64}) {
      auto norm = [&] {
        if (gp)
          cuda::launch_rmsnorm_mul_sigmoid<bf16>(h.as<bf16>(), wn.as<bf16>(), gp, int(p.K), M,
                                                 1e-6f, out.as<bf16>(), 0);
        else
          cuda::launch_rmsnorm<bf16>(h.as<bf16>(), ap, 0.01f, wn.as<bf16>(), int(p.K), M, 1e-6f,
                                     out.as<bf16>(), 0);
      };
      auto gemv = [&](int i) {
        cuda::launch_gemv_fp8(xq.as<uint8_t>(), p.K, sx.as<float>(),
                              w.as<uint8_t>(size_t(i % copies) * size_t(bytes)), s.as<float>(),
                              p.N, int(p.K), M, o, 0);
      };
      double us[3];
      for (int mode = 0; mode < 3; ++mode) {  // gemv alone, norm + quantize + gemv, fused + gemv
        auto step = [&](int i) {
          if (mode == 1) {
            norm();
            cuda::launch_quantize_rows_fp8(out.as<bf16>(), M, p.K, p.K, xq.as<uint8_t>(),
                                           sx.as<float>(), 0);
          } else if (mode == 2) {
            cuda::launch_rmsnorm_fp8(h.as<bf16>(), ap, 0.01f, wn.as<bf16>(), gp, int(p.K), M,
                                     1e-6f, out.as<bf16>(), {xq.as<uint8_t>(), sx.as<float>()},
                                     0);
          }
          gemv(i);
        };
        norm();
        cuda::launch_quantize_rows_fp8(out.as<bf16>(), M, p.K, p.K, xq.as<uint8_t>(),
                                       sx.as<float>(), 0);
        for (int i = 0; i < 3; ++i) step(i);
        CUDA_OK(cudaDeviceSynchronize());
        const int iters = 100;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) step(i);
        CUDA_OK(cudaDeviceSynchronize());
        us[mode] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                       .count() / iters;
      }
      std::printf("[ fp8 fused ] %-18s %4d %12.2f %12.2f %12.2f %9.2f\n", p.name, M, us[0], us[1],
                  us[2], us[1] - us[2]);
    }
  }
}

}  // namespace
}  // namespace sala::test
