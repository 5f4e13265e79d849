// W8A8 FP8 on the CUDA backend against the CPU oracle (backend/cpu/cpu_fp8.cpp, core/fp8.h):
//   - launch_quantize_rows_fp8 gives core/fp8.h's codes and scales bit for bit (both e4m3
//     conversions: the sm_89+ cvt instruction and the portable sm_80 path), and the two
//     conversions agree on all 2^32 fp32 inputs;
//   - upload_linear(…, FP8_E4M3) stores the CPU backend's codes and scales; upload_fp8 (a
//     pre-quantized checkpoint) gives the same GEMMs;
//   - linear / linear_multi / linear_silu_mul with FP8 weights match CpuBackend in bf16 mode
//     over T = 1 … 4096 rows at the released model's shapes (hidden 4096, intermediate 16384,
//     heads 32 x 128, KV heads 2 x 128);
//   - in a step that prefills, each sequence's rows equal the sequence alone, bit for bit.
// Without a GPU every test GTEST_SKIPs (SALA_REQUIRE_GPU=1: a failure). Failures name the
// shape (T, K, N) and the first differing element.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/step.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "cuda_test_util.h"
#include "fp8_gemm_test_util.h"

namespace sala::test {
namespace {

// ---- the quantization kernel -------------------------------------------------------------

// bf16 bits [rows, ldx] (the first cols of each row used), placed `offset` elements into a
// device buffer, quantized on the GPU by both conversions and on the host by core/fp8.h.
void check_quantize(const std::vector<uint16_t>& bits, int64_t rows, int64_t cols, int64_t ldx,
                    int64_t offset, const std::string& what) {
  ASSERT_EQ(bits.size(), size_t(rows * ldx)) << what;
  std::vector<float> v(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v[size_t(r * cols + c)] = bf16_to_f32(bits[size_t(r * ldx + c)]);
  std::vector<uint8_t> want(v.size());
  std::vector<float> want_s(static_cast<size_t>(rows));
  fp8_quantize_rows(v.data(), rows, cols, want.data(), want_s.data());

  DevBuf dx(size_t(offset + rows * ldx) * 2), dc(v.size()), ds(size_t(rows) * 4);
  auto* x = static_cast<cuda::bf16*>(dx.p) + offset;
  ASSERT_EQ(cudaMemcpy(x, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  for (const bool portable : {false, true}) {
    const std::string name = what + (portable ? " (portable path)" : " (sm_89+ path)");
    ASSERT_EQ(cudaMemset(dc.p, 0xa5, v.size()), cudaSuccess);
    cuda::launch_quantize_rows_fp8(x, rows, cols, ldx, static_cast<uint8_t*>(dc.p),
                                   static_cast<float*>(ds.p), nullptr, portable);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << name;
    std::vector<uint8_t> got(v.size());
    std::vector<float> got_s(static_cast<size_t>(rows));
    ASSERT_EQ(cudaMemcpy(got.data(), dc.p, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(got_s.data(), ds.p, got_s.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    int64_t bad_s = 0, bad = 0;
    for (int64_t r = 0; r < rows; ++r)
      if (std::memcmp(&got_s[size_t(r)], &want_s[size_t(r)], 4) != 0 && bad_s++ < 3)
        ADD_FAILURE() << name << ": scale of row " << r << " is " << got_s[size_t(r)]
                      << ", core/fp8.h gives " << want_s[size_t(r)];
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i] && bad++ < 5) {
        const int64_t r = int64_t(i) / cols, c = int64_t(i) % cols;
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "row %lld col %lld: x = 0x%04x (%g), scale %g: code 0x%02x, core/fp8.h 0x%02x",
                      (long long)r, (long long)c, bits[size_t(r * ldx + c)], v[i],
                      want_s[size_t(r)], got[i], want[i]);
        ADD_FAILURE() << name << ": " << msg;
      }
    EXPECT_EQ(bad, 0) << name << ": codes differ of " << got.size();
    EXPECT_EQ(bad_s, 0) << name << ": scales differ of " << rows;
  }
}

std::vector<uint16_t> to_bits(const std::vector<float>& f) {
  std::vector<uint16_t> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
  return b;
}

// Rows of every bf16 value |v| <= 448 and every NaN, each row led by 448 so that its scale is
// exactly 1: every e4m3 tie (a midpoint has 5 significant bits, a bf16 value), every e4m3
// subnormal and underflow, fp32 subnormals, ±0 and both NaN signs meet the conversion as they
// are. Then zero rows, random rows over 70 decades (bf16 subnormals to 1e30), outlier rows
// and NaN-holding rows. ±inf is left out: a row holding it has scale inf, and inf / inf is the
// host's default NaN, whose sign is the host's (x86: negative; CUDA: positive).
TEST(CudaFp8, QuantizeRowsBitExact) {
  REQUIRE_GPU();
  const int64_t cols = 4096;
  std::vector<uint16_t> all;
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = bf16_to_f32(uint16_t(b));
    if (std::isnan(f) || std::fabs(f) <= 448.f) all.push_back(uint16_t(b));
  }
  std::vector<uint16_t> bits;
  size_t next = 0;
  while (next < all.size()) {
    bits.push_back(0x43e0);  // 448
    for (int64_t c = 1; c < cols; ++c) bits.push_back(next < all.size() ? all[next++] : 0);
  }
  bits.insert(bits.end(), size_t(cols), uint16_t(0x0000));  // +0 row: scale 1, codes 0x00
  bits.insert(bits.end(), size_t(cols), uint16_t(0x8000));  // -0 row: codes 0x80
  const HostMat g = randn(64, cols, 4242, 1.f);
  int64_t rows_rand = 0;
  for (const float scale : {1e-39f, 1e-30f, 1e-3f, 1.f, 3.f, 1e4f, 1e30f})
    for (int64_t r = 0; r < 8; ++r, ++rows_rand) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t c = 0; c < cols; ++c)
        row[size_t(c)] = bf16_to_f32(g.bits[size_t((rows_rand % 64) * cols + c)]) * scale;
      if (r == 1) row[size_t(r * 37 % cols)] = 1e6f * scale;  // one outlier: the rest underflow
      if (r == 2) row[7] = std::nanf(""), row[99] = -std::nanf("");
      const auto b = to_bits(row);
      bits.insert(bits.end(), b.begin(), b.end());
    }
  const int64_t rows = int64_t(bits.size()) / cols;
  check_quantize(bits, rows, cols, cols, 0, "quantize [" + std::to_string(rows) + ", 4096]");

  // Layouts: a width that is no multiple of 8, a strided and misaligned input (scalar loads),
  // an aligned narrow one (vector loads).
  const HostMat a = randn(9, 77, 11, 2.f), b = randn(5, 4104, 12, 0.5f), c = randn(33, 256, 13);
  check_quantize(a.bits, 9, 77, 77, 0, "quantize [9, 77]");
  check_quantize(b.bits, 5, 4096, 4104, 1, "quantize [5, 4096] ldx 4104, 2-byte aligned");
  check_quantize(c.bits, 33, 256, 256, 8, "quantize [33, 256] 16-byte aligned");
  // The widest row held in registers (16384 columns) and one past it (the two-pass kernel).
  const HostMat w = randn(3, 16384, 14, 3.f), v = randn(3, 16392, 15, 3.f);
  check_quantize(w.bits, 3, 16384, 16384, 0, "quantize [3, 16384]");
  check_quantize(v.bits, 3, 16392, 16392, 0, "quantize [3, 16392]");
}

// The sm_89+ conversion (cvt.rn.satfinite.e4m3x2.f32, one value or a pair) equals the portable
// one on every fp32 bit pattern (on a GPU below sm_89 both are the portable one).
TEST(CudaFp8, ConversionPathsAgreeOnAllInputs) {
  REQUIRE_GPU();
  DevBuf out(16);
  auto* o = static_cast<unsigned long long*>(out.p);
  cuda::launch_fp8_e4m3_selfcheck(o, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  unsigned long long h[2] = {0, 0};
  ASSERT_EQ(cudaMemcpy(h, o, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  char first[32];
  std::snprintf(first, sizeof first, "0x%08llx", h[1]);
  EXPECT_EQ(h[0], 0ull) << "e4m3 conversions disagree on " << h[0]
                        << " fp32 inputs; the smallest is " << first << " (core/fp8.h: 0x"
                        << std::hex << int(f32_to_fp8_e4m3(std::bit_cast<float>(uint32_t(h[1]))))
                        << ")";
}

// ---- GEMMs against the CPU ------------------------------------------------------------------

// The GPU copy of an FP8 weight holds the CPU backend's codes and scales.
void expect_same_weight(const W2& w, const std::string& name) {
  std::vector<uint8_t> codes(size_t(w.g.rows * w.g.cols));
  std::vector<float> scales(static_cast<size_t>(w.g.rows));
  ASSERT_EQ(cudaMemcpy(codes.data(), w.g.data, codes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(scales.data(), w.g.scales, scales.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(0, std::memcmp(codes.data(), w.c.data, codes.size())) << name << ": codes differ";
  EXPECT_EQ(0, std::memcmp(scales.data(), w.c.scales, scales.size() * 4))
      << name << ": scales differ";
  EXPECT_EQ(w.g.format, WeightFormat::FP8_E4M3);
  EXPECT_EQ(w.g.nbytes(), w.c.nbytes()) << name;
}

struct LinearShape {
  int64_t T, K, N;
  bool f32_out;
};
// linear() of x [T, K] by an FP8 weight [N, K] on both backends, compared (the weight's codes
// too, at T = 1).
void run_linear(const std::vector<LinearShape>& shapes, uint32_t seed) {
  for (const LinearShape& s : shapes) {
    Pair p;
    const W2 w = up_fp8(p, randn(s.N, s.K, seed++, 1.f / std::sqrt(float(s.K))));
    if (s.T == 1) expect_same_weight(w, shape("fp8 weight", {s.N, s.K}));
    auto x = p.up(randn(s.T, s.K, seed++, 1.f));
    auto y = p.out(s.T, s.N, s.f32_out ? DType::F32 : DType::BF16);
    p.cpu->linear(x.c, w.c, y.c);
    p.gpu->linear(x.g, w.g, y.g);
    auto [cpu, gpu] = p.download(y);
    expect_fp8_close(shape(s.f32_out ? "fp8 linear f32-out" : "fp8 linear", {s.T, s.K, s.N}), gpu,
                     cpu, fast_accum_k(s.T, s.K, s.f32_out));
  }
}

// linear() at the model's projections (o_proj / sparse q [4096, 4096], down_proj
// [4096, 16384], k / v [256, 4096]) over T = 1 … 300 rows, T = 4096 once, and an fp32 output
// (rounded to bf16 values, as logits). Small shapes: CudaFp8.LinearSmallShapes.
TEST(CudaFp8, Linear) {
  REQUIRE_GPU();
  std::vector<LinearShape> shapes;
  const std::vector<std::pair<int64_t, int64_t>> projections{{4096, 4096}, {16384, 4096},
                                                              {4096, 256}};  // (K, N)
  for (int64_t T : {1, 7, 16, 17, 64, 300})
    for (auto [K, N] : projections) shapes.push_back({T, K, N, false});
  shapes.push_back({4096, 4096, 4096, false});
  shapes.push_back({5, 256, 512, true});
  // Runs of > 64 rows into bf16 take the Hopper CUTLASS kernel (cuda_gemm_fp8_sm90.cu): a
  // partial 128-row tile (65, 129), K not a multiple of its 128-wide k-block, N not of its
  // 128 columns, and a wider run.
  shapes.push_back({65, 4096, 4096, false});
  shapes.push_back({129, 48, 520, false});
  shapes.push_back({1000, 4096, 256, false});
  run_linear(shapes, 700);
}


// A compressed-tensors checkpoint's codes and scales (upload_fp8) give the GEMM of quantizing
// at load (upload_linear) bit for bit.
TEST(CudaFp8, UploadFp8MatchesUploadLinear) {
  REQUIRE_GPU();
  Pair p;
  const int64_t T = 33, K = 4096, N = 256;
  const HostMat wm = randn(N, K, 750, 1.f / 64.f);
  const W2 w = up_fp8(p, wm);
  std::vector<float> wf(size_t(N * K));
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = bf16_to_f32(wm.bits[i]);
  std::vector<uint8_t> codes(wf.size());
  std::vector<float> scales(static_cast<size_t>(N));
  fp8_quantize_rows(wf.data(), N, K, codes.data(), scales.data());
  TensorView v;
  v.name = "fp8 checkpoint weight";
  v.dtype = DType::F8_E4M3;
  v.shape = {N, K};
  v.data = codes.data();
  v.nbytes = codes.size();
  const Weight wq = p.gpu->upload_fp8(v, scales);
  auto x = p.up(randn(T, K, 751, 1.f));
  auto y1 = p.out(T, N), y2 = p.out(T, N);
  p.gpu->linear(x.g, w.g, y1.g);
  p.gpu->linear(x.g, wq, y2.g);
  expect_same_bits(*p.gpu, y1.g, *p.gpu, y2.g, "upload_fp8 vs upload_linear [33, 4096, 256]");
}

// linear_multi on the sparse layers' stacked q/k/v/o_gate weight [8704, 4096] (parts 4096, 256,
// 256, 4096): every part close to the CPU, and a part equal to linear() on its row slice bit
// for bit (the same quantization and GEMM).
// linear_multi of x [T, 4096] by the sparse layers' q/k/v/gate stack [8704, 4096] on both
// backends, each part compared; returns x and the parts for further checks.
struct MultiParts {
  Pair::T2 x;
  W2 w;
  std::vector<Pair::T2> ys;
};
MultiParts check_linear_multi(Pair& p, int64_t T, uint32_t& seed, const char* what) {
  const int64_t K = 4096;
  const std::vector<int64_t> parts{4096, 256, 256, 4096};
  MultiParts r{p.up(randn(T, K, seed + 1, 1.f)), up_fp8(p, randn(8704, K, seed, 1.f / 64.f)), {}};
  seed += 2;
  for (int64_t n : parts) r.ys.push_back(p.out(T, n));
  std::vector<Tensor*> yc, yg;
  for (auto& y : r.ys) yc.push_back(&y.c), yg.push_back(&y.g);
  p.cpu->linear_multi(r.x.c, r.w.c, yc);
  p.gpu->linear_multi(r.x.g, r.w.g, yg);
  for (size_t i = 0; i < parts.size(); ++i) {
    auto [cpu, gpu] = p.download(r.ys[i]);
    expect_fp8_close(shape(what, {T, K, int64_t(i), parts[i]}), gpu, cpu,
                     fast_accum_k(T, K, false));
  }
  return r;
}

TEST(CudaFp8, LinearMulti) {
  REQUIRE_GPU();
  uint32_t seed = 800;
  for (int64_t T : {1, 7, 16, 17, 64, 300}) {
    Pair p;
    const MultiParts r = check_linear_multi(p, T, seed, "fp8 linear_multi part");
    auto y1 = p.out(T, 256);
    p.gpu->linear(r.x.g, r.w.g.slice_rows(4096, 256), y1.g);
    expect_same_bits(*p.gpu, r.ys[1].g, *p.gpu, y1.g, shape("fp8 linear_multi vs linear", {T, 4096}));
  }
}

// The MLP's gate_up [2 I, 4096] (I = 16384, and a narrower I = 1056): silu(gate) * up close to
// the CPU (two GEMM outputs within an ulp each, then silu_mul's two roundings: the bf16 GEMM
// tests' bounds; past 64 rows the FastAccum GEMM's error in both, so twice expect_fp8_close's
// rel L2 at K = 4096: the numpy model of fp8_gemm_test_util.h gives 0.0038), and the GPU's
// fused entry equals its two-op default bit for bit.
TEST(CudaFp8, LinearSiluMul) {
  REQUIRE_GPU();
  const int64_t K = 4096;
  uint32_t seed = 900;
  for (int64_t I : {16384, 1056})
    for (int64_t T : {1, 17, 300}) {
      Pair p;
      const W2 w = up_fp8(p, randn(2 * I, K, seed++, 2.f / 64.f));
      auto x = p.up(randn(T, K, seed++, 1.f));
      auto g = p.out(T, I), u = p.out(T, I), g2 = p.out(T, I);
      p.cpu->linear_silu_mul(x.c, w.c, g.c, u.c);
      p.gpu->linear_silu_mul(x.g, w.g, g.g, u.g);
      expect_close(p.cmp(shape("fp8 linear_silu_mul", {T, K, I}), g), T > 64 ? 6e-3 : 4e-3,
                   1.6e-2);
      p.gpu->Backend::linear_silu_mul(x.g, w.g, g2.g, u.g);
      expect_same_bits(*p.gpu, g.g, *p.gpu, g2.g, shape("fp8 fused vs two ops", {T, K, I}));
    }
}

// Decode-only steps of 17..64 rows (one row per sequence) skip the GEMV (cuBLASLt: the fp32
// output and the scaling kernel); close to the CPU at the model's projections and at shapes
// that are no multiple of a GEMM tile.
TEST(CudaFp8, WideDecodeSteps) {
  REQUIRE_GPU();
  uint32_t seed = 1200;
  const std::vector<std::pair<int64_t, int64_t>> projections{
      {4096, 4096}, {4096, 12288}, {16384, 4096}, {4096, 256}, {48, 520}};  // (K, N)
  for (int64_t T : {17, 40, 64})
    for (auto [K, N] : projections) {
      Pair p;
      p.begin_decode_step(T);
      const W2 w = up_fp8(p, randn(N, K, seed++, 1.f / std::sqrt(float(K))));
      auto x = p.up(randn(T, K, seed++, 1.f));
      auto y = p.out(T, N);
      p.cpu->linear(x.c, w.c, y.c);
      p.gpu->linear(x.g, w.g, y.g);
      auto [cpu, gpu] = p.download(y);
      expect_fp8_close(shape("fp8 linear decode step", {T, K, N}), gpu, cpu);
    }
  // Stacked weights: one GEMM over all parts, then split (linear_multi) or silu_mul'ed halves
  // (linear_silu_mul); sparse q/k/v/gate and the MLP's gate_up (I = 16384, and 1056).
  for (int64_t T : {17, 40, 64}) {
    Pair p;
    p.begin_decode_step(T);
    const auto x = check_linear_multi(p, T, seed, "fp8 stacked decode part").x;
    for (int64_t I : {16384, 1056}) {
      const W2 gu = up_fp8(p, randn(2 * I, 4096, seed++, 2.f / 64.f));
      auto g = p.out(T, I), u = p.out(T, I);
      p.cpu->linear_silu_mul(x.c, gu.c, g.c, u.c);
      p.gpu->linear_silu_mul(x.g, gu.g, g.g, u.g);
      expect_close(p.cmp(shape("fp8 stacked decode silu_mul", {T, I}), g), 4e-3, 1.6e-2);
    }
  }
}

// Batch invariance in a step that prefills (GemmDispatch::for_each_run): a 40-token prompt, a
// decode row and a 100-token prompt chunk in one step; each sequence's rows equal the same
// sequence alone, bit for bit, and the step is close to the CPU.
TEST(CudaFp8, PrefillStepBatchInvariance) {
  REQUIRE_GPU();
  Pair p;
  const int64_t K = 4096, N = 4096;
  const W2 w = up_fp8(p, randn(N, K, 950, 1.f / 64.f));
  struct Seq {
    int32_t n;
    int64_t past;
  };
  const std::vector<Seq> seqs{{40, 0}, {1, 0}, {100, 0}};
  StepMeta m;
  int64_t T = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<int32_t> ids(size_t(seqs[i].n), 5);
    m.add_seq(ids.data(), seqs[i].n, seqs[i].past, int32_t(i), {}, false, true);
    T += seqs[i].n;
  }
  auto x = p.up(randn(T, K, 951, 1.f));
  auto y = p.out(T, N);
  p.begin(m);
  p.cpu->linear(x.c, w.c, y.c);
  p.gpu->linear(x.g, w.g, y.g);
  auto [cpu, gpu] = p.download(y);
  expect_fp8_close(shape("fp8 linear prefill step", {T, K, N}), gpu, cpu,
                   fast_accum_k(T, K, false));
  int64_t r0 = 0;
  for (const Seq& s : seqs) {
    StepMeta alone = rows_meta(s.n, s.past);
    p.gpu->begin_step(alone);
    auto ya = p.out(s.n, N);
    p.gpu->linear(x.g.slice_rows(r0, s.n), w.g, ya.g);
    std::vector<float> a(size_t(s.n * N));
    p.gpu->download_f32(ya.g, a.data());
    EXPECT_EQ(0, std::memcmp(a.data(), gpu.data() + r0 * N, a.size() * 4))
        << "rows [" << r0 << ", " << r0 + s.n << ") of the prefill step differ from the "
        << s.n << "-row sequence alone";
    r0 += s.n;
  }
}

// The smallest shapes the FP8 path accepts (K = 16, N = 8 and 16). Last in the file: a shape
// that this cuBLASLt has no FP8 kernel for at all aborts the binary, naming T, K and N.
TEST(CudaFp8, LinearSmallShapes) {
  REQUIRE_GPU();
  run_linear({{3, 16, 8, false}, {1, 32, 16, false}, {20, 16, 16, true}}, 760);
}


}  // namespace
}  // namespace sala::test
