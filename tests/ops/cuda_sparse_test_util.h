// The sparse-layer harness of test_cuda_sparse (test_cuda_sparse.cpp: bf16 and fp32 caches;
// test_cuda_sparse_fp8.cpp: FP8 caches): run_sparse runs a case's steps through the CPU
// backend and the CUDA backend and compares them (described at run_sparse), and the step lists
// and sparse rules the cases share.
#pragma once
#include <string>
#include <vector>

#include "backend/step.h"
#include "core/config.h"
#include "cuda_test_util.h"

namespace sala::test {

// One sparse-layer case: heads, sparse rules, page size and the steps (calls in row order).
struct SparseCase {
  std::string label;
  int nh = 16, kvh = 1, d = 16;
  SparseConfig sp;
  int page_size = 64;
  std::vector<Calls> steps;
  int layers = 2;  // sparse layers run per step, each with its own cache (1 halves the CPU cost)
  bool dense_as_sparse = false;
  NumericMode mode = NumericMode::BF16;
  bool gated = false;  // sparse_attention_mul_sigmoid with a random gate (the model's call)
  bool gpu_two_op = false;  // gated: the GPU runs Backend's default (attention, then the gate)
  int attn_min_blocks = 0;  // the GPU backend's BackendOptions::attn_min_blocks
  bool attn_tma = true;     // the GPU backend's BackendOptions::sparse_attn_tma
  int64_t kv_shadow_tokens = -1;  // the GPU backend's BackendOptions::fp8_kv_shadow_tokens
  bool gpu_only = false;  // run the GPU backend alone (bit-equality tests of two GPU runs)
  // Both backends' KV cache dtype and (FP8) every sparse layer's K / V scales.
  KvCacheDtype kv = KvCacheDtype::Auto;
  KvScales kv_scale{};
};

struct SparseTally {
  int64_t sel_rows = 0, sel_equal = 0;  // sparse (row, kv head) items; equal selections
  int64_t topk_rows = 0;                // of those, rows whose selection left out a past block
  int64_t masked_rows = 0;              // (row, kv head) items left out of the output check
  int64_t near_ties = 0;                // fp32: rows whose k-th / (k+1)-th scores nearly tie
  int64_t kv_shadow_layers = 0;         // GPU: layers whose stage 2 read the FP8 KV shadow
};

// Runs every step through both backends (both must see every call, so that their caches
// stay equal) with fresh random q, k, v per layer, and compares outputs and selections.
// gpu_outs: gets the GPU output of every (step, layer), before any masking.
SparseTally run_sparse(const SparseCase& c, std::vector<std::vector<float>>* gpu_outs = nullptr);
// The GPU outputs of every (step, layer) of case c.
std::vector<std::vector<float>> gpu_outputs(const SparseCase& c);
void expect_same_outputs(const std::vector<std::vector<float>>& a,
                         const std::vector<std::vector<float>>& b, const std::string& what);

// Released sparse config: everything below dense_len 8192 is dense causal attention.
extern const std::vector<Calls> kDenseSteps;
// The tiny-sparse config (block 16, kernel 8/4, window 64, topk 8, dense_len 256).
extern const std::vector<Calls> kTinySteps;
// Decode-parts cases (dense released, tiny at d 16 and 128).
extern const SparseCase kPartsCases[3];
// The released block and compression geometry with a small window, top-k and dense_len (real
// top-k at a few thousand tokens), and its steps; the released rules' steps (8K tokens).
SparseConfig scaled_sparse();
const std::vector<Calls>& scaled_steps();
const std::vector<Calls>& released_steps();

}  // namespace sala::test
