// `sala bench offline`'s shared parts (cmd_bench_offline.cpp): its options, what the
// benchmarks of one run share (Bench), and the long-context rows (bench_long.cpp:
// --long-prefill, --long-decode-contexts).
#pragma once
#include <algorithm>
#include <chrono>
#include <fstream>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cache_layout.h"
#include "cli/bench_floors.h"
#include "cli/bench_rows.h"
#include "core/config.h"
#include "model/minicpm_sala.h"

namespace sala::cli {

// The options (CLI flags, registered in cmd_bench_offline.cpp).
struct BenchOfflineArgs {
  std::string model, device = "cpu", out_json;
  std::vector<int> decode_batches{1, 8, 64}, prefill_batches{1, 8};
  int decode_in = 128, decode_out = 512, prefill_in = 4096, threads = 0;
  int tp_size = 1;  // tensor-parallel ranks (model/tensor_parallel.h)
  bool tp_gather_o_norm = false;  // ModelLimits::tp_gather_o_norm (an A/B)
  bool tp_peer_comm = false;      // ModelLimits::tp_peer_comm (an A/B)
  bool bf16 = false;
  bool disable_cuda_graph = false;
  bool long_only = false;  // --long-only: no decode / prefill rows, only the long-context runs
  std::string quantization;  // "" | fp8 (BackendOptions::fp8_weights) | w4a16 (int4_group_size)
  int64_t profile_ops = 0;  // BackendOptions::profile_ops
  std::string kv_cache_dtype = "auto";  // BackendOptions::kv_cache_dtype
  int64_t fp8_kv_shadow_tokens = sala::BackendOptions{}.fp8_kv_shadow_tokens;
  bool int4_prefill_gemm = sala::BackendOptions{}.int4_prefill_gemm;
  std::vector<int64_t> long_prefill, long_decode_contexts;  // empty: not run
  std::vector<int> long_decode_batches{1, 8};
  int chunk = 2048;  // the server's --chunked-prefill-size (its default)
  int long_prefill_beside = 0;  // decoding sequences beside each long prefill (bench_mixed.h)
  int long_decode_steps = 64;
  std::vector<int> verify_draft;  // each K: also time verify steps of 1 + K rows per sequence
  std::string decode_grammar;     // "" | json | a JSON-schema file (cli/bench_grammar.h)
  std::string grammar_tokenizer;  // the grammar's vocabulary (default: the model directory)
  std::string decode_sampling;  // "": greedy only; else also sampled steps (bench_sampling.h)
};

using BenchClock = std::chrono::steady_clock;
inline double since(BenchClock::time_point t) {
  return std::chrono::duration<double>(BenchClock::now() - t).count();
}

template <class T>
T max_of(const std::vector<T>& v) {
  return v.empty() ? T(0) : *std::max_element(v.begin(), v.end());
}

inline int32_t pages_for(int64_t tokens, int32_t page_size) {
  return int32_t(sala::cache_layout::pages_for(tokens, page_size));
}

// Pages [b·n, (b+1)·n) of the pool: sequence b of a benchmark that gives each sequence n pages.
inline std::vector<int32_t> seq_pages(int b, int32_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) p[size_t(i)] = b * n + i;
  return p;
}

// What the benchmarks of one run share: the model, the prompt tokens, the floors' parameter
// counts and the results so far.
struct Bench {
  Bench(const BenchOfflineArgs& args, const sala::ModelConfig& config, sala::Model& m)
      : a(args), cfg(config), model(m), page_size(m.limits().caches.page_size) {}
  const BenchOfflineArgs& a;
  const sala::ModelConfig& cfg;
  sala::Model& model;
  int32_t page_size;
  std::vector<int32_t> prompt;  // [longest prompt or context]: fixed pseudo-random ids, BOS first
  double linear_params = 0;     // every 2-D weight but the embedding (lm_head included)
  double head_params = 0;       // lm_head (vocab × hidden)
  double body_params = 0;       // linear_params without lm_head: what every prefill token needs
  double linear_bytes = 0;      // bytes of the linear weights as stored: what a decode step reads
  double peak_flops = kPeakFlops;  // of the projections' format: bf16, or FP8 with fp8 weights
  // Tensor parallelism: every floor is one rank's share (its weights, heads and FLOPs; the
  // ranks run side by side), so it is divided by this; communication is not counted.
  double ranks = 1;
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::string> table;

  // The JSON is rewritten after each result: a run stopped by a later, longer case keeps these.
  void add(nlohmann::json row, std::string line) {
    add_common_keys(row, a.decode_in);
    results.push_back(std::move(row));
    table.push_back(std::move(line));
    if (!a.out_json.empty()) std::ofstream(a.out_json) << results.dump(2) << "\n";
  }
};

// Prefills prompt[0, len) into state slot `slot` and `pages` the way the server does: chunks
// ending at multiples of --chunk and at len, each a call with past_len = its offset; only the
// last asks for a logit row. Returns the greedy next token (argmax on the backend).
int32_t chunked_prefill(Bench& b, int64_t len, int slot, const std::vector<int32_t>& pages,
                        const std::string& label);
// Prefill of one long prompt per --long-prefill length, batch 1, timed as a whole.
void bench_long_prefill(Bench& b);
// Greedy decode of B sequences at each --long-decode-contexts C, for each
// --long-decode-batches B: the median step of --long-decode-steps.
void bench_long_decode(Bench& b);

}  // namespace sala::cli
