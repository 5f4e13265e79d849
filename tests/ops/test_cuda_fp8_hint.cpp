// CudaBackend's `next` hint (issue 17, item 5): a norm (rmsnorm, add_scaled_rmsnorm,
// rmsnorm_mul_sigmoid) or linear_silu_mul told which projection reads its output next writes
// that projection's FP8 input codes itself, and the projection's GEMM launches no quantize
// kernel. The contract is the run without the hint, bit for bit (part of the test_cuda_ops
// binary; the kernels: test_cuda_fp8_fused.cpp):
//   BackendHint  norm(next = W) then W's GEMM (linear, linear_multi of 4 parts,
//                linear_silu_mul) == norm without the hint then the GEMM: h and every output
//                bit for bit (out too where no codes were prepared; with codes the norm may
//                leave out unstored), in decode-only steps (GEMV <= 16 rows, cuBLASLt 17..64,
//                100), one-sequence steps (GEMV up to 64 rows, a prefill GEMM at 100) and
//                steps prefilling two sequences, K 4096 / 4112 / 512 (each norm kernel). That
//                the prepared codes were used where they should be: out zeroed behind the
//                backend's back after the norm changes nothing (the GEMM's rows are one run);
//                and not where they should not: two sequences of 50 rows (two runs: all-zero
//                outputs then, and another FP8 GEMM in between changes nothing), a bf16 next
//   SiluMulHint  linear_silu_mul(next = down) then down's GEMM, likewise (codes from the SiLU
//                product where linear_silu_mul is Backend's composition: > 64 rows in one run)
//   LinearAddNormSums  FP8 linear_add_rmsnorm == linear then add_scaled_rmsnorm, bit for bit,
//                in the steps whose norm kernel scales the GEMM's fp32 sums and in others
//   BrokenHintAborts  prepared codes (out unstored) and then a GEMM on another input: the
//                dispatch aborts naming both, rather than multiply unstored values
// Without a GPU every test GTEST_SKIPs (cuda_test_util.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "cuda_fp8_fused_util.h"
#include "cuda_test_util.h"

namespace sala::test {
namespace {

enum class Consumer { kLinear, kMulti, kSiluMul };

// The steps the tests run T rows in: T decode rows (T sequences), one sequence's T prompt rows,
// or two sequences' prompts (T / 2 and T - T / 2 rows), which GemmDispatch multiplies as one
// run each when there are more than 64 rows.
enum class StepKind { kDecode, kOneSeq, kTwoSeqs };

StepMeta step_meta(StepKind kind, int64_t T) {
  StepMeta m;
  const std::vector<int32_t> ids(size_t(T), 5);
  if (kind == StepKind::kDecode) {
    for (int64_t i = 0; i < T; ++i) m.add_seq(ids.data(), 1, 0, int32_t(i), {}, false, true);
  } else if (kind == StepKind::kOneSeq) {
    m = rows_meta(int(T));
  } else {
    m.add_seq(ids.data(), int(T / 2), 0, 0, {}, false, false);
    m.add_seq(ids.data(), int(T - T / 2), 0, 1, {}, false, false);
  }
  return m;
}

const char* kind_name(StepKind kind) {
  if (kind == StepKind::kDecode) return " decode";
  return kind == StepKind::kOneSeq ? " one seq" : " two seqs";
}

// One backend, its weights, and a norm + GEMM run on fresh inputs.
struct HintRig {
  std::unique_ptr<Backend> be = make_cuda_backend({NumericMode::BF16, 0});
  int64_t K;
  uint32_t seed;
  Tensor wn;
  Weight w_lin, w_multi, w_gu, w_bf16;
  std::vector<int64_t> parts;  // linear_multi's parts (the sparse layer's q/k/v/o_gate shape)
  int64_t I = 1024;            // linear_silu_mul's half
  HintRig(int64_t k, uint32_t s) : K(k), seed(s) {
    const HostMat n = randn(1, K, seed++, 0.2f, 1.f);
    wn = upload_checkpoint(*be, DType::BF16, 1, K, n.bits.data());
    parts = {1024, 128, 128, 1024};
    w_lin = fp8(1000, K);
    w_multi = fp8(2304, K);
    w_gu = fp8(2 * I, K);
    const HostMat b = randn(512, K, seed++, 1.f / 64.f);
    w_bf16 = upload_checkpoint(*be, DType::BF16, 512, K, b.bits.data());
  }
  Weight fp8(int64_t N, int64_t k) {
    const HostMat m = randn(N, k, seed++, 1.f / 64.f);
    TensorView v;
    v.name = "fp8 fused test weight";
    v.dtype = DType::BF16;
    v.shape = {N, k};
    v.data = reinterpret_cast<const uint8_t*>(m.bits.data());
    v.nbytes = m.bits.size() * 2;
    return be->upload_linear(v, WeightFormat::FP8_E4M3);
  }
  const Weight& weight(Consumer c) const {
    return c == Consumer::kLinear ? w_lin : c == Consumer::kMulti ? w_multi : w_gu;
  }
  // One run's norm input x, residual h, the norm's output as written (out) and the GEMM's
  // outputs ys; the same inputs for every run of one in_seed.
  struct Run {
    Tensor x, h, out;
    std::vector<Tensor> ys;
  };
  // Runs producer `pr` into out (hinted with `next` or not), then `zero_x`: out zeroed behind
  // the backend's back (a prepared GEMM must not notice), `between`: another FP8 GEMM on other
  // data first; then the consumer's GEMM on out with weight `w` (bf16 only for kLinear).
  Run run(int64_t T, uint32_t in_seed, Producer pr, Consumer c, const Weight& w,
          const Weight* next, bool zero_x, bool between) {
    auto up = [&](uint32_t s, float sc) {
      const HostMat m = randn(T, K, s, sc);
      return upload_checkpoint(*be, DType::BF16, T, K, m.bits.data());
    };
    Run r{up(in_seed, 2.f), up(in_seed + 1, 1.f), be->alloc(T, K, DType::BF16), {}};
    const Tensor gate = up(in_seed + 2, 2.f), a = up(in_seed + 3, 1.f);
    const float eps = 1e-6f;
    switch (pr) {
      case Producer::kRmsnorm: be->rmsnorm(r.x, wn, eps, r.out, next); break;
      case Producer::kResidual: be->add_scaled_rmsnorm(r.h, a, 0.37f, wn, eps, r.out, next); break;
      case Producer::kGate: be->rmsnorm_mul_sigmoid(r.x, wn, eps, gate, r.out, next); break;
    }
    Tensor keep = be->alloc(T, K, DType::BF16);  // out as the norm wrote it
    // The backend's stream is non-blocking: plain cudaMemcpy / cudaMemset (the legacy stream)
    // are ordered with its kernels by synchronizing the device around them.
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(keep.data, r.out.data, r.out.nbytes(), cudaMemcpyDeviceToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    if (between) {
      Tensor y = be->alloc(T, w_lin.rows, DType::BF16);
      be->linear(a, w_lin, y);
    }
    if (zero_x) {
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaMemset(r.out.data, 0, r.out.nbytes()));
      CUDA_OK(cudaDeviceSynchronize());
    }
    switch (c) {
      case Consumer::kLinear:
        r.ys.push_back(be->alloc(T, w.rows, DType::BF16));
        be->linear(r.out, w, r.ys[0]);
        break;
      case Consumer::kMulti: {
        std::vector<Tensor*> yp;
        for (int64_t n : parts) r.ys.push_back(be->alloc(T, n, DType::BF16));
        for (Tensor& y : r.ys) yp.push_back(&y);
        be->linear_multi(r.out, w, yp);
        break;
      }
      case Consumer::kSiluMul: {
        r.ys.push_back(be->alloc(T, I, DType::BF16));
        Tensor u = be->alloc(T, I, DType::BF16);
        be->linear_silu_mul(r.out, w, r.ys[0], u);
        break;
      }
    }
    r.out = keep;
    return r;
  }
};

// out_too: the runs stored out (no codes prepared, or no hint).
void expect_runs_equal(Backend& be, const HintRig::Run& a, const HintRig::Run& b,
                       const std::string& what, bool out_too) {
  if (out_too) expect_same_bits(be, a.out, be, b.out, what + " out");
  expect_same_bits(be, a.h, be, b.h, what + " h");
  expect_same_bits(be, a.x, be, b.x, what + " x");
  ASSERT_EQ(a.ys.size(), b.ys.size()) << what;
  for (size_t i = 0; i < a.ys.size(); ++i)
    expect_same_bits(be, a.ys[i], be, b.ys[i], what + " y" + std::to_string(i));
}

TEST(CudaFp8Fused, BackendHint) {
  REQUIRE_GPU();
  uint32_t seed = 1900;
  // K: the 16-byte-vector norm kernel (4096), the block kernel (4112), the warp kernel (512).
  for (int64_t K : {4096, 4112, 512}) {
    HintRig rig(K, seed += 50);
    Backend& be = *rig.be;
    for (StepKind kind : {StepKind::kDecode, StepKind::kOneSeq, StepKind::kTwoSeqs})
      for (int64_t T : {1, 5, 16, 17, 40, 64, 100}) {
        if (K != 4096 && T != 1 && T != 17 && T != 64) continue;
        if (kind == StepKind::kTwoSeqs && T < 2) continue;
        const StepMeta meta = step_meta(kind, T);  // the backend keeps its address
        be.begin_step(meta);
        // Codes are prepared (and the quantize kernel skipped) for FP8 GEMMs whose rows are
        // one run: all but steps prefilling two sequences of > 64 rows in all.
        const bool fused = kind != StepKind::kTwoSeqs || T <= cuda::kGemvMaxRows;
        for (Producer pr : {Producer::kRmsnorm, Producer::kResidual, Producer::kGate})
          for (Consumer c : {Consumer::kLinear, Consumer::kMulti, Consumer::kSiluMul}) {
            const std::string name = std::string(producer_name(pr)) + " -> " +
                                     std::to_string(int(c)) + shape(kind_name(kind), {T, K});
            const Weight& w = rig.weight(c);
            const uint32_t s = seed += 4;
            const HintRig::Run plain = rig.run(T, s, pr, c, w, nullptr, false, false);
            const HintRig::Run hinted = rig.run(T, s, pr, c, w, &w, false, false);
            expect_runs_equal(be, hinted, plain, name + " hinted vs plain", !fused);
            // The prepared codes are what the GEMM used: zeroing out after the norm changes
            // nothing where they were prepared, and everything (all-zero outputs) elsewhere.
            const HintRig::Run zeroed = rig.run(T, s, pr, c, w, &w, true, false);
            if (fused) {
              expect_runs_equal(be, zeroed, plain, name + " prepared codes used", false);
            } else {
              std::vector<float> y(size_t(zeroed.ys[0].numel()));
              be.download_f32(zeroed.ys[0], y.data());
              EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 0.f; }))
                  << name << ": two runs quantize their input themselves";
              // No codes prepared: another GEMM between the norm and x's GEMM is harmless.
              const HintRig::Run other = rig.run(T, s, pr, c, w, &w, false, true);
              expect_runs_equal(be, other, plain, name + " GEMM in between", true);
            }
            if (c == Consumer::kLinear) {  // a bf16 next: no codes, the bf16 GEMM as before
              const HintRig::Run b0 = rig.run(T, s, pr, c, rig.w_bf16, nullptr, false, false);
              const HintRig::Run b1 = rig.run(T, s, pr, c, rig.w_bf16, &rig.w_bf16, false, false);
              expect_runs_equal(be, b1, b0, name + " bf16 next", true);
            }
          }
      }
  }
}

// linear_silu_mul(next = down) then down's GEMM on g == the same without the hint, bit for bit.
// g's codes come from the SiLU product where linear_silu_mul is Backend's composition on FP8
// weights and g's rows are one run (here 100 rows of decode or of one sequence), and from the
// SiLU product of the stacked GEMM's halves in decode-only steps of 17..64 rows: there g
// zeroed before down's GEMM changes nothing. The GEMV's silu_pair epilogue (<= 16 rows, and
// steps up to 64 rows that are not decode-only) and two sequences of 50 rows (two runs) leave
// the quantization to down's GEMM, so g zeroed before it gives zeros (no stale codes are used).
TEST(CudaFp8Fused, SiluMulHint) {
  REQUIRE_GPU();
  const int64_t K = 4096;
  for (int64_t I : {1024, 1056}) {
    HintRig rig(K, 2100 + uint32_t(I));
    rig.I = I;
    rig.w_gu = rig.fp8(2 * I, K);
    const Weight w_down = rig.fp8(512, I);
    Backend& be = *rig.be;
    uint32_t seed = 2200;
    for (StepKind kind : {StepKind::kDecode, StepKind::kOneSeq, StepKind::kTwoSeqs})
      for (int64_t T : {1, 16, 17, 40, 64, 100}) {
        if (kind == StepKind::kTwoSeqs && T < 2) continue;
        const StepMeta meta = step_meta(kind, T);  // the backend keeps its address
        be.begin_step(meta);
        const HostMat hx = randn(T, K, seed++, 1.f), ha = randn(T, K, seed++, 1.f);
        // g and y = g · downᵀ after linear_silu_mul with or without the hint; zero_g: g zeroed
        // behind the backend's back before down's GEMM; between: another FP8 GEMM first.
        auto run = [&](bool hint, bool zero_g, bool between) {
          const Tensor x = upload_checkpoint(be, DType::BF16, T, K, hx.bits.data());
          Tensor g = be.alloc(T, I, DType::BF16), u = be.alloc(T, I, DType::BF16),
                 keep = be.alloc(T, I, DType::BF16), y = be.alloc(T, 512, DType::BF16);
          be.linear_silu_mul(x, rig.w_gu, g, u, hint ? &w_down : nullptr);
          CUDA_OK(cudaDeviceSynchronize());  // see HintRig::run
          CUDA_OK(cudaMemcpy(keep.data, g.data, g.nbytes(), cudaMemcpyDeviceToDevice));
          CUDA_OK(cudaDeviceSynchronize());
          if (between) {
            const Tensor a = upload_checkpoint(be, DType::BF16, T, K, ha.bits.data());
            Tensor y2 = be.alloc(T, rig.w_lin.rows, DType::BF16);
            be.linear(a, rig.w_lin, y2);
          }
          if (zero_g) {
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemset(g.data, 0, g.nbytes()));
            CUDA_OK(cudaDeviceSynchronize());
          }
          be.linear(g, w_down, y);
          return std::make_pair(keep, y);
        };
        const std::string name = std::string("silu hint") + shape(kind_name(kind), {T, K, I});
        // g's codes from the SiLU product: Backend's composition (more than 64 rows) with
        // the rows as one run, or the stacked GEMM's halves; g may then be left unstored.
        const bool stacked = kind == StepKind::kDecode && T > 16 && T <= cuda::kGemvMaxRows;
        const bool silu_codes =
            (T > cuda::kGemvMaxRows && kind != StepKind::kTwoSeqs) || stacked;
        const auto plain = run(false, false, false), hinted = run(true, false, false);
        if (!silu_codes) expect_same_bits(be, hinted.first, be, plain.first, name + " g");
        expect_same_bits(be, hinted.second, be, plain.second, name + " y");
        const auto zeroed = run(true, true, false);
        if (silu_codes) {
          expect_same_bits(be, zeroed.second, be, plain.second, name + " prepared codes used");
        } else {
          std::vector<float> y(size_t(zeroed.second.numel()));
          be.download_f32(zeroed.second, y.data());
          EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 0.f; }))
              << name << ": down's GEMM quantizes g itself here";
          const auto other = run(true, false, true);  // no codes: a GEMM between is harmless
          expect_same_bits(be, other.second, be, plain.second, name + " GEMM in between");
        }
      }
  }
}

// linear_add_rmsnorm with FP8 weights (o_proj: K = 4096, down: K = 16384; n = 4096) ==
// Backend's composition (linear, then add_scaled_rmsnorm) bit for bit: y, h, x, and out when
// no codes are prepared; with the `next` hint, the next FP8 GEMM's output on out. Decode-only
// steps of 17..64 rows scale cuBLASLt's fp32 sums inside the norm kernel
// (launch_add_rmsnorm_sums); 1 and 16 rows take the GEMV's norm tail, one sequence's rows the
// GEMV (<= 64) or CUTLASS (100), whose y the norm reads as before.
TEST(CudaFp8Fused, LinearAddNormSums) {
  REQUIRE_GPU();
  HintRig rig(4096, 2500);
  Backend& be = *rig.be;
  uint32_t seed = 2600;
  for (int64_t K : {4096, 16384}) {
    const Weight w = rig.fp8(4096, K);
    for (StepKind kind : {StepKind::kDecode, StepKind::kOneSeq})
      for (int64_t T : {1, 16, 17, 40, 64, 100}) {
        const StepMeta meta = step_meta(kind, T);  // the backend keeps its address
        be.begin_step(meta);
        const HostMat hx = randn(T, K, seed++, 1.f), hh = randn(T, 4096, seed++, 1.f);
        for (const bool hinted : {false, true}) {
          auto run = [&](bool fused) {
            HintRig::Run r{upload_checkpoint(be, DType::BF16, T, K, hx.bits.data()),
                           upload_checkpoint(be, DType::BF16, T, 4096, hh.bits.data()),
                           be.alloc(T, 4096, DType::BF16),
                           {}};
            r.ys.push_back(be.alloc(T, 4096, DType::BF16));        // y
            r.ys.push_back(be.alloc(T, rig.w_lin.rows, DType::BF16));  // out · w_linᵀ
            const Weight* next = hinted ? &rig.w_lin : nullptr;
            if (fused)
              be.linear_add_rmsnorm(r.x, w, r.ys[0], r.h, 0.37f, rig.wn, 1e-6f, r.out, next);
            else
              be.Backend::linear_add_rmsnorm(r.x, w, r.ys[0], r.h, 0.37f, rig.wn, 1e-6f, r.out,
                                             next);
            be.linear(r.out, rig.w_lin, r.ys[1]);
            return r;
          };
          const std::string name = std::string("linear_add_rmsnorm") +
                                   (hinted ? " hinted" : "") + shape(kind_name(kind), {T, K});
          expect_runs_equal(be, run(true), run(false), name, !hinted);
        }
      }
  }
}

// A broken `next` hint: the norm prepared x's codes (and left x unstored), then an FP8 GEMM
// reads another input first. The dispatch aborts naming both inputs.
TEST(CudaFp8FusedDeathTest, BrokenHintAborts) {
  REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts CUDA afresh
  EXPECT_DEATH(
      {
        HintRig rig(4096, 2400);
        const StepMeta meta = step_meta(StepKind::kOneSeq, 100);
        rig.be->begin_step(meta);
        rig.run(100, 2410, Producer::kRmsnorm, Consumer::kLinear, rig.w_lin, &rig.w_lin, false,
                true);
      },
      "FP8 codes prepared for an input \\[100,4096\\]");
}

}  // namespace
}  // namespace sala::test
