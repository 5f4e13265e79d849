// CUDA sparse (minicpm4, InfLLM-v2) layers vs the CPU backend in bf16 emulation (harness:
// cuda_sparse_test_util.h): k/v append into shuffled pages, two-level key compression, dense
// causal attention below dense_len, and above it stage 1 (level-2-normalised scores, SPEC §9.4,
// with the one-shot visibility quirk at L ≡ 15 mod 16 / ≡ 63 mod 64), block pooling and top-k
// (§9.5) and stage 2 (§9.6), over steps that mix one-shot prefills, chunked-prefill
// continuations and decode rows of several sequences.
//
// Per step the selected blocks of every sparse (row, kv head) are captured from both
// backends: ≥ 99 % must be equal (a bf16 near-tie of two block scores may swap one block,
// which changes that row completely), and the outputs must be close on every row whose
// selections are equal. The F32 tests run both backends in fp32 mode: every selection must
// be equal except where the CPU's k-th and (k+1)-th block scores differ by less than 1e-5
// relative (a near-tie, golden README §5; counted and reported), and the outputs must agree
// at the fp32 level. Without a GPU every test GTEST_SKIPs loudly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "cuda_sparse_test_util.h"
#include "cuda_test_util.h"

namespace sala::test {
namespace {

TEST(CudaOps, SparseLayerDensePath) {
  REQUIRE_GPU();
  run_sparse({"released", 16, 1, 16, SparseConfig{}, 64, kDenseSteps});
  run_sparse({"released", 32, 2, 128, SparseConfig{}, 128, kDenseSteps});
}

TEST(CudaOps, SparseLayerInfLLMv2) {
  REQUIRE_GPU();
  run_sparse({"tiny", 16, 1, 16, tiny_sparse(), 32, kTinySteps});
  run_sparse({"tiny", 32, 2, 128, tiny_sparse(), 16, kTinySteps});
}

TEST(CudaOps, SparseLayerDenseAsSparse) {
  REQUIRE_GPU();
  // dense_as_sparse: selection at every length, including rows with no level-2 entry.
  const std::vector<Calls> steps = {
      {{0, 100}, {1, 7}, {2, 130}}, {{0, 1}, {1, 40}, {2, 1}}, {{0, 1}, {1, 1}, {2, 1}}};
  run_sparse({"tiny", 16, 1, 16, tiny_sparse(), 32, steps, 2, true});
}

// The stage-2 kernel computes a decode row's parts one per block, or up to 8 per block (one
// per consumer warp, SparseAttnParams::spb) when the step has rows enough to fill the GPU;
// BackendOptions::attn_min_blocks = 1 forces 8 here. The parts are the same, so every output
// must be too.
TEST(CudaOps, SparseDecodePartsPerBlockBitExact) {
  REQUIRE_GPU();
  for (const SparseCase& c : kPartsCases) {
    SparseCase forced = c;
    forced.attn_min_blocks = 1;
    expect_same_outputs(gpu_outputs(c), gpu_outputs(forced),
                        c.label + " d" + std::to_string(c.d) + ", 1 vs 8 parts per block");
  }
}

// sparse_attention_mul_sigmoid: in decode-only steps the CUDA backend applies the gate in the
// combine kernel; the result must be the two-op default's (Backend::sparse_attention_mul_sigmoid
// on the same CUDA backend) bit for bit, in both modes, and the CPU's within the attention
// bound (run_sparse).
TEST(CudaFused, SparseAttentionMulSigmoid) {
  REQUIRE_GPU();
  for (SparseCase c : kPartsCases)
    for (const NumericMode mode : {NumericMode::BF16, NumericMode::F32}) {
      c.gated = true;
      c.mode = mode;
      const std::string what = c.label + " d" + std::to_string(c.d) +
                               (mode == NumericMode::F32 ? " fp32" : " bf16") + ", fused vs two ops";
      SparseCase two_op = c;
      two_op.gpu_two_op = true;
      expect_same_outputs(gpu_outputs(c), gpu_outputs(two_op), what);
    }
}

// ---- long lengths (issue 7): the kernels' shapes, head_dim 128, 16 query heads per kv head ----

TEST(CudaOps, SparseLayerScaledLong) {
  REQUIRE_GPU();
  SparseCase c{"scaled", 16, 1, 128, scaled_sparse(), 128, scaled_steps(), 1};
  const SparseTally n = run_sparse(c);
  EXPECT_GT(n.topk_rows, 5000) << "the scaled case must exercise real top-k";
}

// Prompt chunks' stage 2 on Hopper (the wgmma kernel): TMA and cp.async producers fill the same
// tiles (rows past a sequence: zeros, or an older sequence's finite keys, which its rows mask
// with probability 0), so every output must be the same bits. Pages of 128 tokens: TMA where
// the device has it. Elsewhere both runs take the same kernel.
TEST(CudaOps, SparseStage2ProducersBitEqual) {
  REQUIRE_GPU();
  const SparseCase c{"scaled", 16, 1, 128, scaled_sparse(), 128, scaled_steps(), 1};
  SparseCase cp = c;
  cp.attn_tma = false;
  expect_same_outputs(gpu_outputs(c), gpu_outputs(cp), "scaled d128, TMA vs cp.async producers");
}

TEST(CudaOps, SparseLayerReleasedLong) {
  REQUIRE_GPU();
  SparseCase c{"released", 32, 2, 128, SparseConfig{}, 64, released_steps(), 1};
  const SparseTally n = run_sparse(c);
  EXPECT_GT(n.topk_rows, 2000) << "the released case must exercise real top-k";
}

// ---- fp32 mode (both backends NumericMode::F32): the same cases, exact selections --------------

SparseCase f32_case(SparseCase c) {
  c.mode = NumericMode::F32;
  return c;
}

TEST(CudaOpsF32, SparseLayerDensePath) {
  REQUIRE_GPU();
  run_sparse(f32_case({"released", 16, 1, 16, SparseConfig{}, 64, kDenseSteps}));
  run_sparse(f32_case({"released", 32, 2, 128, SparseConfig{}, 128, kDenseSteps}));
}

TEST(CudaOpsF32, SparseLayerInfLLMv2) {
  REQUIRE_GPU();
  run_sparse(f32_case({"tiny", 16, 1, 16, tiny_sparse(), 32, kTinySteps}));
  run_sparse(f32_case({"tiny", 32, 2, 128, tiny_sparse(), 16, kTinySteps}));
  // 8 query heads per KV head and head_dim 64: shapes the bf16 tensor-core kernels lack
  run_sparse(f32_case({"tiny", 16, 2, 64, tiny_sparse(), 32, kTinySteps}));
}

TEST(CudaOpsF32, SparseLayerDenseAsSparse) {
  REQUIRE_GPU();
  const std::vector<Calls> steps = {
      {{0, 100}, {1, 7}, {2, 130}}, {{0, 1}, {1, 40}, {2, 1}}, {{0, 1}, {1, 1}, {2, 1}}};
  run_sparse(f32_case({"tiny", 16, 1, 16, tiny_sparse(), 32, steps, 2, true}));
}

TEST(CudaOpsF32, SparseLayerScaledLong) {
  REQUIRE_GPU();
  const SparseTally n =
      run_sparse(f32_case({"scaled", 16, 1, 128, scaled_sparse(), 128, scaled_steps(), 1}));
  EXPECT_GT(n.topk_rows, 5000) << "the scaled case must exercise real top-k";
}

TEST(CudaOpsF32, SparseLayerReleasedLong) {
  REQUIRE_GPU();
  const SparseTally n =
      run_sparse(f32_case({"released", 32, 2, 128, SparseConfig{}, 64, released_steps(), 1}));
  EXPECT_GT(n.topk_rows, 2000) << "the released case must exercise real top-k";
}

}  // namespace
}  // namespace sala::test
