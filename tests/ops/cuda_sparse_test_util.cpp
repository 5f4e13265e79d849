// The sparse-layer harness (cuda_sparse_test_util.h): run_sparse and the shared step lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "backend/cuda/cuda_kernels.h"
#include "cuda_test_util.h"
#include "backend/step.h"
#include "cuda_sparse_test_util.h"

namespace sala::test {
namespace {

// fp32 mode: the CPU's k-th and (k+1)-th highest block scores (k = total_topk) are distinct
// and within 1e-5 relative, so an fp32 implementation may rank them the other way.
bool near_tie(std::vector<float> s, int k) {
  if (int(s.size()) <= k) return false;
  std::sort(s.begin(), s.end(), std::greater<float>());
  const double a = s[size_t(k - 1)], b = s[size_t(k)];
  return std::isfinite(a) && std::isfinite(b) && a != b &&
         std::abs(a - b) <= 1e-5 * std::max(std::abs(a), std::abs(b));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

SparseTally run_sparse(const SparseCase& c, std::vector<std::vector<float>>* gpu_outs) {
  const int nh = c.nh, kvh = c.kvh, d = c.d, G = nh / kvh;
  // Pages for the longest sequence of the steps.
  std::map<int, int64_t> final_len;
  for (const Calls& calls : c.steps)
    for (auto [si, n] : calls) final_len[si] += n;
  int64_t max_len = 1;
  for (auto [si, len] : final_len) max_len = std::max(max_len, len);
  const bool f32 = c.mode == NumericMode::F32;
  BackendOptions gpu_opts;
  gpu_opts.attn_min_blocks = c.attn_min_blocks;
  gpu_opts.sparse_attn_tma = c.attn_tma;
  gpu_opts.fp8_kv_shadow_tokens = c.kv_shadow_tokens;
  gpu_opts.kv_cache_dtype = c.kv;
  const ModelConfig lc = layer_config(nh, kvh, d, 4, 16, c.sp);
  LayerHarness H(lc, c.page_size, max_len, final_len.rbegin()->first + 1, c.mode, gpu_opts,
                 std::vector<KvScales>(size_t(lc.num_sparse_layers()), c.kv_scale));
  const std::string kv_tag =
      kv_is_fp8(c.kv) ? std::string(kv_cache_dtype_name(c.kv)) + " k" +
                            std::to_string(c.kv_scale.k) + " v" + std::to_string(c.kv_scale.v) + " "
                      : "";
  const std::string tag = kv_tag + std::string(f32 ? "fp32 " : "") + c.label + " nh" + std::to_string(nh) +
                          " kvh" + std::to_string(kvh) + " d" + std::to_string(d) +
                          (c.dense_as_sparse ? " das" : "");
  const int K = c.sp.total_topk();
  SparseTally n;
  double cpu_s = 0, gpu_s = 0;
  const auto t_start = std::chrono::steady_clock::now();
  for (const Calls& calls : c.steps) {
    std::vector<int64_t> past;
    for (auto [si, k] : calls) past.push_back(H.seqs[size_t(si)].len);
    StepMeta m = H.step(calls, c.dense_as_sparse);
    const int64_t T = m.num_tokens();
    for (int si = 0; si < c.layers; ++si) {
      // [T, nh*d], [T, kvh*d]: bf16 values, or fp32 values in fp32 mode
      auto rnd = [&](int64_t cols) {
        return f32 ? H.p.up(randn_f32(T, cols, H.seed++)) : H.p.up(randn(T, cols, H.seed++));
      };
      auto q = rnd(int64_t(nh) * d);
      auto k = rnd(int64_t(kvh) * d);
      auto v = rnd(int64_t(kvh) * d);
      auto gate = rnd(c.gated ? int64_t(nh) * d : 1);
      auto o = H.p.out(T, int64_t(nh) * d);
      BlockCapture cc, cg;
      cc.want_scores = f32;
      auto t0 = std::chrono::steady_clock::now();
      m.capture = &cc;
      if (!c.gpu_only) {
        H.p.cpu->begin_step(m);
        if (c.gated)
          H.p.cpu->sparse_attention_mul_sigmoid(si, q.c, k.c, v.c, gate.c, o.c);
        else
          H.p.cpu->sparse_attention(si, q.c, k.c, v.c, o.c);
      }
      cpu_s += seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      m.capture = &cg;
      H.p.gpu->begin_step(m);
      if (c.gated && c.gpu_two_op)
        H.p.gpu->Backend::sparse_attention_mul_sigmoid(si, q.g, k.g, v.g, gate.g, o.g);
      else if (c.gated)
        H.p.gpu->sparse_attention_mul_sigmoid(si, q.g, k.g, v.g, gate.g, o.g);
      else
        H.p.gpu->sparse_attention(si, q.g, k.g, v.g, o.g);
      H.p.gpu->synchronize();
      gpu_s += seconds_since(t0);
      n.kv_shadow_layers += cg.kv_shadow_layers;
      auto [oc, og] = H.p.download(o);
      if (gpu_outs) gpu_outs->push_back(og);
      if (c.gpu_only) continue;
      // Selections: [kv head][row] = ascending blocks; empty for dense rows.
      const auto& a = cc.selections.at(size_t(si));
      const auto& b = cg.selections.at(size_t(si));
      int64_t masked = 0;
      for (int g = 0; g < kvh; ++g)
        for (int64_t r = 0; r < T; ++r) {
          const auto& sa = a[size_t(g)][size_t(r)];
          const auto& sb = b[size_t(g)][size_t(r)];
          if (sa.empty() && sb.empty()) continue;
          ++n.sel_rows;
          n.topk_rows += int64_t(sa.size()) < m.positions[size_t(r)] / c.sp.block_size + 1;
          if (sa == sb) {
            ++n.sel_equal;
            continue;
          }
          if (f32) {
            // fp32: only a near-tie may select differently.
            const bool tie = near_tie(cc.block_scores.at(size_t(si))[size_t(g)][size_t(r)], K);
            n.near_ties += tie;
            EXPECT_TRUE(tie) << tag << " " << calls_str(calls, past) << ": row " << r
                             << " kv head " << g << " selects other blocks than the CPU";
          }
          // A different block changes the row's attention completely: leave the group's
          // heads of this row out of the output comparison (zero in both).
          ++masked;
          const size_t at = size_t(r * nh + int64_t(g) * G) * size_t(d);
          std::fill(oc.begin() + int64_t(at), oc.begin() + int64_t(at) + G * d, 0.f);
          std::fill(og.begin() + int64_t(at), og.begin() + int64_t(at) + G * d, 0.f);
        }
      n.masked_rows += masked;
      const std::string name = "sparse " + tag + " " + calls_str(calls, past) +
                               (masked ? " (" + std::to_string(masked) + " masked)" : "");
      if (f32)
        expect_close(compare(name, og, oc), kF32RelL2, kF32RelMax);
      else
        expect_close(compare(name, og, oc), 4e-3, 1.6e-2);
    }
  }
  std::printf(
      "[ sparse ] %s: %lld of %lld (row, kv head) selections equal, %lld with a real "
      "top-k, %lld left out of the output check (%lld fp32 near-ties); cpu %.1f s, gpu %.1f s, "
      "all %.1f s\n",
      tag.c_str(), (long long)n.sel_equal, (long long)n.sel_rows, (long long)n.topk_rows,
      (long long)n.masked_rows, (long long)n.near_ties, cpu_s, gpu_s, seconds_since(t_start));
  EXPECT_GE(double(n.sel_equal), 0.99 * double(n.sel_rows)) << tag;
  return n;
}

// Released sparse config: everything below dense_len 8192 is dense causal attention.
const std::vector<Calls> kDenseSteps = {
      {{0, 100}, {1, 1}, {2, 37}, {3, 600}},
      {{0, 1}, {1, 70}, {2, 64}, {3, 1}},  // decode + chunked-prefill continuation
      {{0, 1}, {1, 1}, {2, 1}, {3, 1}},    // decode (split-K path)
      {{3, 1}},                            // one long decode
      {{1, 300}, {3, 1}},
};

// The tiny-sparse config (block 16, kernel 8/4, window 64, topk 8, dense_len 256).
const std::vector<Calls> kTinySteps = {
      // one-shot prefills: sparse, quirk lengths (319: level 1 and 2; 307: level 1), dense
      {{0, 300}, {1, 319}, {2, 200}, {3, 383}, {4, 256}},
      // decode, chunk on a quirk prefix, chunk crossing dense_len, decode, chunk after 256
      {{0, 1}, {1, 63}, {2, 60}, {3, 1}, {4, 63}},
      {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}},
      {{2, 1}, {0, 1}},
      {{5, 250}},
      {{5, 1}, {0, 1}},
      {{5, 1}, {5 - 5, 1}},
      {{5, 1}},
      {{5, 1}},
      {{5, 1}},
      {{5, 1}},  // crosses L = 256 while decoding
      {{5, 1}},
      {{5, 307}},  // non-first multi-token call
};

std::vector<std::vector<float>> gpu_outputs(const SparseCase& c) {
  std::vector<std::vector<float>> outs;
  run_sparse(c, &outs);
  return outs;
}

void expect_same_outputs(const std::vector<std::vector<float>>& a,
                         const std::vector<std::vector<float>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int64_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << a.size()
                       << " (step, layer) outputs differ";
}

const SparseCase kPartsCases[3] = {{"released", 32, 2, 128, SparseConfig{}, 128, kDenseSteps},
                                  {"tiny", 16, 1, 16, tiny_sparse(), 32, kTinySteps},
                                  {"tiny", 32, 2, 128, tiny_sparse(), 16, kTinySteps}};

// The released block and compression geometry (block 64, kernel 32/16, level 2 128/64, init
// 1) with a small window, top-k and dense_len, so that real top-k happens at a few thousand
// tokens: 4 local blocks + the query's own + block 0 forced, 20 selected in all, so a row
// at position ≥ 1280 (block ≥ 20) of a sequence of ≥ 1024 tokens leaves blocks out.
SparseConfig scaled_sparse() {
  SparseConfig sp;
  sp.window_size = 256;
  sp.topk = 16;
  sp.dense_len = 1024;
  return sp;
}

const std::vector<Calls>& scaled_steps() {
  // Sequences 0..7 (final lengths 1026, 1102, 1106, 3072, 1028, 2112, 4197, 6038): one-shot
  // first calls at L = dense_len and at the quirk lengths (1103, 5999 ≡ 15 mod 16: level 1;
  // 2047, 4095 ≡ 63 mod 64: both levels), the same residues reached by non-first chunks
  // (3071, 2111: the absolute rule, no quirk), a chunk that crosses dense_len (1000 → 1100),
  // a sequence decoded across dense_len (1020 → 1028: dense up to 1023, sparse from 1024),
  // decode rows alone (split-K attention) and batched with long prefills.
  static const std::vector<Calls> steps = {
      {{0, 1024}, {1, 1100}, {2, 1103}, {3, 2047}, {4, 1020}, {5, 1000}},
      {{4, 1}, {0, 1}, {1, 1}, {2, 1}, {3, 1}, {5, 100}},  // 1021; chunk 1000 → 1100 crosses
      {{4, 1}},                                            // 1022, alone
      {{4, 1}, {3, 1023}},                                 // 1023; chunk 2048 → 3071
      {{4, 1}},                                            // 1024: the first sparse decode
      {{4, 1}, {2, 1}, {5, 1011}},                         // 1025; chunk 1100 → 2111
      {{6, 4095}},                                         // one-shot ≡ 63 mod 64, ~4K
      {{4, 1}, {6, 1}, {3, 1}, {0, 1}},                    // 1026, batched sparse decode
      {{4, 1}},                                            // 1027
      {{4, 1}, {7, 5999}},                                 // 1028 beside a one-shot ≡ 15 mod 16
      {{7, 1}, {6, 1}, {5, 1}, {1, 1}, {2, 1}},            // decode at 6000 / 4097 / 2112 / ...
      {{7, 1}},                                            // 6001 alone
      {{6, 100}, {7, 37}},                                 // two sparse continuations, one step
  };
  return steps;
}

const std::vector<Calls>& released_steps() {
  // The released rules (SparseConfig{}: block 64, 32 local + 64 top-k = 96 blocks, dense_len
  // 8192) at the released heads, one layer (the CPU oracle dominates: ≈ 1.1 TFLOP here).
  // Sequence 0: prefilled in chunks of 2048 to 8190 (dense), decoded across dense_len (8191
  // dense; 8192 the first sparse call: stage 1 over the compressed keys built since token 0),
  // a 61-token chunk to 8255 ≡ 63 mod 64 (non-first: the absolute rule), then the decode that
  // completes block 128 and emits a level-1 and a level-2 entry (8256). Sequence 1: a one-shot
  // first call of 8207 ≡ 15 mod 16 tokens (the level-1 quirk) beside a decode row, then decode.
  static const std::vector<Calls> steps = {
      {{0, 2048}}, {{0, 2048}}, {{0, 2048}}, {{0, 2046}},  // 8190, dense (flash on the GPU)
      {{0, 1}},                                            // 8191: dense, split-K
      {{0, 1}},                                            // 8192: first sparse decode
      {{0, 1}},                                            // 8193
      {{0, 1}, {1, 8207}},                                 // 8194 + one-shot 8207
      {{0, 61}, {1, 1}},                                   // 8255; 8208
      {{0, 1}, {1, 1}},                                    // 8256; 8209
  };
  return steps;
}

}  // namespace sala::test
