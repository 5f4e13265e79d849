// test_cuda_sparse's FP8 KV cache cases (issue 17): the cases of test_cuda_sparse.cpp with both
// backends on FP8 caches.
//
// The CPU oracle (cpu_kv_store.h) and the GPU write the same codes (append and compress are
// bit-exact: the compressed keys are pooled from the dequantized cached keys, in token order,
// rounded to bf16, then coded with the K scale) and read the same values; the GPU feeds code
// values to the tensor cores and applies the scales to scores and outputs, so the bounds
// are the bf16 ones. Scales: the default 1, checkpoint-like small ones, and one that makes
// e4m3 saturate on ~2 % of the keys (|x| / 0.005 > 448).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/kv_cache_dtype.h"
#include "cuda_sparse_test_util.h"
#include "cuda_test_util.h"

namespace sala::test {
namespace {

SparseCase kv8(SparseCase c, KvCacheDtype kv, KvScales sc) {
  c.kv = kv;
  c.kv_scale = sc;
  return c;
}
constexpr KvCacheDtype kE4m3 = KvCacheDtype::FP8_E4M3, kE5m2 = KvCacheDtype::FP8_E5M2;

TEST(CudaKvFp8, SparseLayerDensePath) {
  REQUIRE_GPU();
  for (auto [kv, sc] : {std::pair{kE4m3, KvScales{0.05f, 0.02f}}, std::pair{kE5m2, KvScales{}}}) {
    // flash prefill (d 128), stage-2 dense rows (16 heads per KV head) and, at 8 heads per
    // KV head, attention_kernel; decode rows split over parts
    run_sparse(kv8({"released", 16, 1, 16, SparseConfig{}, 64, kDenseSteps}, kv, sc));
    run_sparse(kv8({"released", 32, 2, 128, SparseConfig{}, 128, kDenseSteps}, kv, sc));
    run_sparse(kv8({"released", 16, 2, 64, SparseConfig{}, 64, kDenseSteps}, kv, sc));
  }
}

TEST(CudaKvFp8, SparseLayerInfLLMv2) {
  REQUIRE_GPU();
  for (auto [kv, sc] : {std::pair{kE4m3, KvScales{0.05f, 0.02f}}, std::pair{kE4m3, KvScales{}},
                        std::pair{kE4m3, KvScales{0.005f, 0.005f}}, std::pair{kE5m2, KvScales{}},
                        std::pair{kE5m2, KvScales{0.03f, 0.7f}}}) {
    run_sparse(kv8({"tiny", 16, 1, 16, tiny_sparse(), 32, kTinySteps}, kv, sc));
    run_sparse(kv8({"tiny", 32, 2, 128, tiny_sparse(), 16, kTinySteps}, kv, sc));
  }
}

TEST(CudaKvFp8, SparseLayerDenseAsSparse) {
  REQUIRE_GPU();
  const std::vector<Calls> steps = {
      {{0, 100}, {1, 7}, {2, 130}}, {{0, 1}, {1, 40}, {2, 1}}, {{0, 1}, {1, 1}, {2, 1}}};
  for (KvCacheDtype kv : {kE4m3, kE5m2})
    run_sparse(kv8({"tiny", 16, 1, 16, tiny_sparse(), 32, steps, 2, true}, kv, {0.05f, 0.02f}));
}

// The decode parts are the same for 1 or 8 parts per stage-2 block over FP8 caches too.
TEST(CudaKvFp8, SparseDecodePartsPerBlockBitExact) {
  REQUIRE_GPU();
  for (const SparseCase& c0 : kPartsCases) {
    const SparseCase c = kv8(c0, kE4m3, {0.05f, 0.02f});
    SparseCase forced = c;
    forced.attn_min_blocks = 1;
    expect_same_outputs(gpu_outputs(c), gpu_outputs(forced),
                        "fp8 " + c.label + " d" + std::to_string(c.d) + ", 1 vs 8 parts per block");
  }
}

// FP8 caches on Hopper: stage 2 of prompt chunks over the bf16 shadow of their pages
// (BackendOptions::fp8_kv_shadow_tokens) reads the code values the wgmma kernel converts
// itself from the codes: the same bits, with a shadow for every step (-1) and with a smaller
// one (scaled: 4,096 tokens, which some steps' chunks outgrow, so those read the codes;
// released: 8,320 tokens, one 8K chunk at a time). Pages of 64 / 128 tokens: TMA where the
// device has it (sm_90: the shadow must have run); elsewhere the runs take the same kernel.
TEST(CudaKvFp8, Stage2ShadowBitEqual) {
  REQUIRE_GPU();
  const bool sm90 = cuda::sparse_attn_sm90_supported(128, 16);
  for (auto [kv, sc] : {std::pair{kE4m3, KvScales{0.05f, 0.02f}},
                        std::pair{kE5m2, KvScales{0.03f, 0.7f}}}) {
    for (auto [c0, small_tokens] :
         {std::pair{SparseCase{"scaled", 16, 1, 128, scaled_sparse(), 128, scaled_steps(), 1},
                    int64_t(4096)},
          std::pair{SparseCase{"released", 32, 2, 128, SparseConfig{}, 64, released_steps(), 1},
                    int64_t(8320)}}) {
      SparseCase c = kv8(c0, kv, sc);
      c.gpu_only = true;
      SparseCase codes = c, small = c;
      codes.kv_shadow_tokens = 0;
      small.kv_shadow_tokens = small_tokens;
      const std::string what = std::string(kv_cache_dtype_name(kv)) + " " + c.label;
      std::vector<std::vector<float>> ref, full_outs, small_outs;
      EXPECT_EQ(run_sparse(codes, &ref).kv_shadow_layers, 0) << what;
      const int64_t full = run_sparse(c, &full_outs).kv_shadow_layers;
      const int64_t part = run_sparse(small, &small_outs).kv_shadow_layers;
      expect_same_outputs(full_outs, ref, what + ": shadow vs codes");
      expect_same_outputs(small_outs, ref, what + ": smaller shadow vs codes");
      std::printf("[ shadow ] %s: %lld / %lld layers read the full / smaller shadow\n",
                  what.c_str(), (long long)full, (long long)part);
      if (sm90) {
        EXPECT_GT(full, 0) << what << ": the shadow never ran";
        EXPECT_GT(part, 0) << what << ": the smaller shadow never ran";
        if (c.label == "scaled") {
          EXPECT_LT(part, full) << what << ": no step outgrew the smaller shadow";
        }
      }
    }
  }
}

TEST(CudaKvFp8, SparseLayerScaledLong) {
  REQUIRE_GPU();
  for (KvCacheDtype kv : {kE4m3, kE5m2}) {
    const SparseTally n = run_sparse(
        kv8({"scaled", 16, 1, 128, scaled_sparse(), 128, scaled_steps(), 1}, kv, {0.05f, 0.02f}));
    EXPECT_GT(n.topk_rows, 5000) << "the scaled case must exercise real top-k";
  }
}

TEST(CudaKvFp8, SparseLayerReleasedLong) {
  REQUIRE_GPU();
  const SparseTally n = run_sparse(
      kv8({"released", 32, 2, 128, SparseConfig{}, 64, released_steps(), 1}, kE4m3, {0.05f, 0.02f}));
  EXPECT_GT(n.topk_rows, 2000) << "the released case must exercise real top-k";
}

}  // namespace
}  // namespace sala::test
