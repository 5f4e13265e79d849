// sala bench offline --model-path DIR [--device cpu|cuda]: model-level throughput without
// the server: decode steps at batch 1/8/64 (128-token prompts, greedy, 512 new tokens) and
// prefill (4K-token prompts, batch 1 and 8), each as a ratio to the floors of
// ../shared/PERF.md (bytes of the weights as stored / 4.30 TB/s for decode; 2·params FLOPs / 790
// TFLOP/s for prefill). Decode steps include the greedy pick (argmax_rows on the backend,
// as the engine's greedy steps do).
// Long contexts (issue 7), only when asked for:
//   --long-prefill L1,L2,..: one prompt of L tokens, prefilled as the server does (chunks of
//     --chunk tokens), vs (linear + attention FLOPs) / 790 TFLOP/s;
//   --long-decode-contexts C1,..: B sequences (--long-decode-batches) prefilled to C tokens,
//     then --long-decode-steps greedy steps of all B, vs (weights + per-sequence KV, compressed
//     keys and lightning state bytes) / 4.30 TB/s.
// --decode-grammar json|SCHEMA.json (--grammar-tokenizer DIR): after each decode row, its steps
//   plain and with every sequence under the grammar (cli/bench_grammar.h), and their ratio.
// --json FILE: every row of the table also as a JSON array (kind-specific keys plus the
// common name / batch / context / unit / value / floor / ratio, see Bench::add_common_keys).
// requires: sala_model sala_engine sala_server
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/bench_floors.h"
#include "cli/bench_grammar.h"
#include "cli/bench_mixed.h"
#include "cli/bench_offline.h"
#include "cli/bench_rows.h"
#include "cli/bench_sampling.h"
#include "cli/command.h"
#include "backend/cache_layout.h"
#include "core/check.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "engine/engine.h"  // kv_bytes_per_page
#include "engine/request_check.h"
#include "model/minicpm_sala.h"
#include "model/tensor_parallel.h"

namespace {

using namespace sala::cli;  // the floors (bench_floors.h), DecodeGrammar

using Args = BenchOfflineArgs;
using Clock = BenchClock;

int32_t argmax(const float* row, int64_t V) {
  return int32_t(std::max_element(row, row + V) - row);
}

// Tokens per sequence of the short decode and prefill runs.
int64_t short_context(const Args& a) {
  return std::max(a.decode_in + a.decode_out, a.prefill_in) + 1;
}

// Speculative verify steps (issue 21) after the decode run of batch B: each sequence
// contributes its last token and K (one of --verify-draft-tokens) drafted ones (1 + K rows,
// logits of every row, greedy on the device), its lightning state before the step kept in its
// snapshot slot (b + max batch, Model::snapshot_state), as the engine's speculator does. Step
// s writes positions [decode_in + s, decode_in + s + K]: one accepted token per step, the
// rest rewritten by the next (the engine's rollback), so the context stays that of the decode
// run. The ratio to the decode step is issue 21's target (<= 1.15x at B=1, <= 1.3x at B=8).
void bench_verify(Bench& b, int B, int K, int32_t pages_per_seq, const std::vector<int32_t>& next,
                  double decode_ms) {
  const int rows = 1 + K;
  const int steps = std::min(b.a.decode_out - rows, 128);
  if (steps <= 0) sala::fail("--verify-draft-tokens {} needs --decode-output > {}", K, rows);
  const int snapshot_base = b.model.limits().caches.num_slots / 2;
  std::vector<int32_t> ids(size_t(B) * size_t(rows)), out;
  for (int s = 0; s < B; ++s)
    for (int r = 0; r < rows; ++r) ids[size_t(s * rows + r)] = next[size_t(s)];
  std::vector<float> logits;
  std::vector<double> step_ms;
  for (int i = 0; i < steps + 2; ++i) {  // the first two are warm-up
    sala::StepMeta m;
    for (int s = 0; s < B; ++s)
      m.add_seq(&ids[size_t(s * rows)], rows, b.a.decode_in + i, s,
                seq_pages(s, pages_per_seq), true, false);
    const auto t0 = Clock::now();
    for (int s = 0; s < B; ++s) b.model.snapshot_state(s, snapshot_base + s);
    b.model.forward(m, logits, nullptr, &out);
    if (i >= 2) step_ms.push_back(since(t0) * 1e3);
    ids = out;  // the step's greedy tokens: realistic ids for the next
  }
  std::sort(step_ms.begin(), step_ms.end());
  const double med = step_ms[step_ms.size() / 2];
  b.add({{"kind", "verify"}, {"batch", B}, {"draft_tokens", K}, {"ms_per_step", med},
         {"decode_ms", decode_ms}, {"ratio_to_decode", med / decode_ms}},
        fmt::format("verify  B={:<3} K={} {:>7.3f} ms/step = {:.3f}x the decode step",
                    B, K, med, med / decode_ms));
}

// The decode run of batch B twice more (re-prefilled, same prompts and positions): plain, then
// with every sequence under the grammar; the median steps' ratio.
void bench_decode_grammar(Bench& b, const DecodeGrammar& g, int B, int32_t pages_per_seq) {
  const auto r = g.compare(b.model, B, b.a.decode_out, b.prompt, b.a.decode_in,
                           [&](int s) { return seq_pages(s, pages_per_seq); });
  const double ratio = r.grammar_ms / r.plain_ms;
  b.add({{"kind", "decode_grammar"}, {"batch", B}, {"grammar", g.label()}, {"vocabulary", g.vocabulary()},
         {"ms_per_step", r.grammar_ms}, {"decode_ms", r.plain_ms}, {"ratio_to_decode", ratio},
         {"completed", r.constrained.completed}, {"outputs", r.constrained.outputs},
         {"unfinished", r.constrained.unfinished}},
        fmt::format("grammar B={:<3} {:>9.3f} ms/step = {:.3f}x the plain step of {:.3f} ms ({}; {} outputs "
                    "completed)", B, r.grammar_ms, ratio, r.plain_ms, g.label(), r.constrained.completed));
}

// The model's limits for this run: step rows, logit rows, state slots and KV pages for the
// largest benchmark asked for (each numbers its pages from 0, see seq_pages); the long runs
// count only when requested.
sala::ModelLimits plan_limits(const Args& a, const sala::ModelConfig& cfg) {
  const bool long_runs = !a.long_prefill.empty() || !a.long_decode_contexts.empty();
  const int max_b = std::max(max_of(a.decode_batches), max_of(a.prefill_batches));
  const int max_long_b = a.long_decode_contexts.empty() ? 0 : max_of(a.long_decode_batches);
  sala::ModelLimits lim;
  lim.max_step_tokens =
      std::max({a.prefill_in, a.decode_in, max_b, max_long_b, long_runs ? a.chunk : 0});
  // >= 1: a long prefill's last step wants its logit row (--long-only has no batches)
  lim.max_logit_rows = std::max({max_b * (1 + max_of(a.verify_draft)), max_long_b, 1});
  lim.max_step_tokens = std::max(lim.max_step_tokens, lim.max_logit_rows);
  lim.caches.page_size = cfg.sparse.block_size;
  const int32_t page = lim.caches.page_size;
  const int64_t long_decode_len = max_of(a.long_decode_contexts) + a.long_decode_steps;
  lim.caches.num_pages = std::max({pages_for(short_context(a), page) * max_b,
                                   pages_for(max_of(a.long_prefill), page),
                                   max_long_b * pages_for(long_decode_len, page)});
  // Verify steps snapshot each sequence's state into slot b + max_b, as the engine does.
  lim.caches.num_slots = std::max({max_b * (a.verify_draft.empty() ? 1 : 2), max_long_b, 1});
  if (a.long_prefill_beside > 0 && !a.long_prefill.empty())
    plan_mixed_prefill(lim, max_of(a.long_prefill), a.chunk, a.long_prefill_beside, a.decode_in);
  return lim;
}

int run(const Args& a) {
  sala::ModelConfig cfg = sala::load_model_config(a.model);
  sala::Checkpoint ckpt(a.model);
  const bool long_decode = !a.long_decode_contexts.empty();
  std::optional<sala::SamplingParams> sampling;  // before the model loads: fail fast
  if (!a.decode_sampling.empty()) sampling = sala::cli::parse_decode_sampling(a.decode_sampling);
  if (a.chunk <= 0 || a.long_decode_steps <= 0 || (long_decode && a.long_decode_batches.empty()))
    sala::fail("--chunk, --long-decode-steps and --long-decode-batches must be positive");
  for (int k : a.verify_draft)
    if (k <= 0) sala::fail("--verify-draft-tokens: {} is not positive", k);
  if (a.long_only && a.long_prefill.empty() && a.long_decode_contexts.empty())
    sala::fail("--long-only needs --long-prefill or --long-decode-contexts: nothing to run");
  for (int b : a.decode_batches)
    if (b <= 0) sala::fail("--decode-batches: batch {} is not positive", b);
  for (int b : a.prefill_batches)
    if (b <= 0) sala::fail("--prefill-batches: batch {} is not positive", b);
  if (a.decode_in <= 0 || a.decode_out <= 0 || a.prefill_in <= 0)
    sala::fail("--decode-input, --decode-output and --prefill-input must be positive (got {}, {}, "
               "{})", a.decode_in, a.decode_out, a.prefill_in);
  for (int64_t len : a.long_prefill)
    if (len <= 0) sala::fail("--long-prefill: length {} is not positive", len);
  for (int64_t len : a.long_decode_contexts)
    if (len <= 0) sala::fail("--long-decode-contexts: context {} is not positive", len);
  for (int b : a.long_decode_batches)
    if (b <= 0) sala::fail("--long-decode-batches: batch {} is not positive", b);
  const int64_t long_decode_len = long_decode ? max_of(a.long_decode_contexts) + a.long_decode_steps : 0;
  const int64_t max_long_ctx = std::max(max_of(a.long_prefill), long_decode_len);
  sala::check_model_context(cfg, max_long_ctx, "the long-context runs' length");

  std::unique_ptr<DecodeGrammar> grammar;
  if (!a.decode_grammar.empty()) {
    grammar = std::make_unique<DecodeGrammar>(
        a.decode_grammar, a.grammar_tokenizer.empty() ? a.model : a.grammar_tokenizer, cfg);
    fmt::print("decode grammar: {} over {}\n", grammar->label(), grammar->vocabulary());
  }
  sala::ModelLimits lim = plan_limits(a, cfg);
  lim.tp_gather_o_norm = a.tp_gather_o_norm;
  lim.tp_peer_comm = a.tp_peer_comm;
  // The GPU path is bf16 by contract; the CPU reference is fp32 unless --bf16 asks for emulation.
  const bool bf16 = a.bf16 || a.device == "cuda";
  sala::BackendOptions bo{bf16 ? sala::NumericMode::BF16 : sala::NumericMode::F32, a.threads};
  bo.cuda_graphs = !a.disable_cuda_graph;
  bo.profile_ops = a.profile_ops;
  if (a.quantization == "fp8")
    bo.fp8_weights = true;
  else if (a.quantization == "w4a16")
    bo.int4_group_size = 128;  // RTN at load, group 128 (core/int4.h), as `sala serve`
  else if (!a.quantization.empty())
    sala::fail("--quantization '{}' is not supported (fp8, w4a16, or none)", a.quantization);
  bo.kv_cache_dtype = sala::parse_kv_cache_dtype(a.kv_cache_dtype);
  bo.fp8_kv_shadow_tokens = a.fp8_kv_shadow_tokens;
  bo.int4_prefill_gemm = a.int4_prefill_gemm;
  std::unique_ptr<sala::Backend> be = sala::make_backend(a.device, bo);
  {  // what the caches take, as init_caches allocates them: K, V and both compressed levels
    const double kv = double(lim.caches.num_pages) *
                      double(sala::kv_bytes_per_page(cfg, lim.caches.page_size, be->kv_element_bytes()));
    const double ld = cfg.lightning_head_dim;
    const double states =
        double(lim.caches.num_slots) * cfg.num_lightning_layers() * cfg.lightning_nh * ld * ld * 4;
    fmt::print("caches: {} pages of {} tokens ({:.2f} GiB), {} state slots ({:.2f} GiB); "
               "{} rows per step\n", lim.caches.num_pages, lim.caches.page_size, kv / (1 << 30),
               lim.caches.num_slots, states / (1 << 30), lim.max_step_tokens);
  }
  fmt::print("loading {} on {} ...\n", a.model, be->name());
  auto t_load = Clock::now();
  sala::Model model(cfg, std::move(be), ckpt, lim, sala::make_tp_peers(a.device, bo, a.tp_size));
  fmt::print("loaded in {:.1f} s\n", since(t_load));

  Bench bench(a, cfg, model);
  // Floors (../shared/PERF.md): bytes read per decode step = every linear weight + lm_head, in
  // the format the backend stores them (the weights say); FLOPs count parameters, each weight
  // as its dense [out, in]: a W4A16 module's weight_packed [out, in / 8] words hold out · in;
  // quantized modules' weight_scale tensors are not parameters.
  for (auto& [name, t] : ckpt.all()) {
    if (name == "model.embed_tokens.weight" || t->shape.size() != 2) continue;
    if (name.ends_with(".weight"))
      bench.linear_params += double(t->numel());
    else if (name.ends_with(".weight_packed"))
      bench.linear_params += 8.0 * double(t->numel());
  }
  const double linear_params = bench.linear_params;
  // With tensor parallelism, model.weights() is rank 0's shard: one rank's bytes per step.
  bench.linear_bytes = double(model.weights().linear_bytes());
  bench.ranks = model.tp_size();
  const double decode_floor_ms = bench.linear_bytes / kPeakBytes * 1e3;
  // Prefill: the projections at their format's peak (attention is not counted here; the long
  // prefill rows add it at the bf16 peak).
  const sala::WeightFormat body_format = model.weights().layers.at(0).down_proj.format;
  if (body_format == sala::WeightFormat::FP8_E4M3) bench.peak_flops = kPeakFlopsFp8;
  const double prefill_ceiling_tok_s = bench.ranks * bench.peak_flops / (2 * linear_params);
  const int64_t V = cfg.vocab_size;
  // A prefill needs lm_head for its one logit row only; every token goes through the rest.
  bench.head_params = double(V) * cfg.hidden_size;
  bench.body_params = linear_params - (ckpt.all().count("lm_head.weight") ? bench.head_params : 0);

  std::vector<int32_t>& prompt = bench.prompt;
  prompt.resize(static_cast<size_t>(  // + B: the grammar runs start sequence b's prompt at id b + 1
      std::max<int64_t>({a.decode_in + max_of(a.decode_batches), a.prefill_in, max_long_ctx})));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(3 + (i * 7919) % size_t(V - 12));
  prompt[0] = cfg.bos_token_id;
  std::vector<float> logits;
  const int32_t pages_per_seq = pages_for(short_context(a), lim.caches.page_size);

  for (int B : a.decode_batches) {
    std::vector<int32_t> next(static_cast<size_t>(B));
    // --decode-sampling: every step is run again at the same positions with sampled rows (the
    // repeat rewrites the same KV slots; its lightning update only perturbs the numbers).
    std::unique_ptr<sala::cli::BenchSampling> sampled;
    if (sampling)
      sampled = std::make_unique<sala::cli::BenchSampling>(*sampling, B, prompt, a.decode_in, V);
    std::vector<double> sampled_ms;
    for (int b = 0; b < B; ++b) {  // prefill each sequence alone
      sala::StepMeta m;
      m.add_seq(prompt.data(), a.decode_in, 0, b, seq_pages(b, pages_per_seq), false, true);
      model.forward(m, logits);
      next[size_t(b)] = argmax(logits.data(), V);
    }
    std::vector<double> step_ms;
    for (int s = 0; s < a.decode_out; ++s) {
      sala::StepMeta m;
      for (int b = 0; b < B; ++b)
        m.add_seq(&next[size_t(b)], 1, a.decode_in + s, b, seq_pages(b, pages_per_seq), false, true);
      const auto t0 = Clock::now();
      model.forward(m, logits, nullptr, &next);  // greedy on the device, as the engine does
      step_ms.push_back(since(t0) * 1e3);
      if (sampled) sampled_ms.push_back(sampled->step(model, m));
      if ((s + 1) % 64 == 0 || s + 1 == a.decode_out)
        fmt::print(stderr, "\rdecode batch {:>2}: step {}/{}", B, s + 1, a.decode_out);
    }
    fmt::print(stderr, "\n");
    std::sort(step_ms.begin(), step_ms.end());
    const double med = step_ms[step_ms.size() / 2];
    const double floor_ratio = decode_floor_ms / med;
    bench.add({{"kind", "decode"}, {"batch", B}, {"ms_per_step", med}, {"tok_s", B * 1e3 / med},
               {"floor_ms", decode_floor_ms}, {"fraction_of_floor", floor_ratio}},
              fmt::format("decode  B={:<3} {:>9.3f} ms/step {:>10.1f} tok/s   floor {:.3f} ms -> {:5.1f}% of floor",
                          B, med, B * 1e3 / med, decode_floor_ms, 100 * floor_ratio));
    if (sampled) {
      std::sort(sampled_ms.begin(), sampled_ms.end());
      const double smed = sampled_ms[sampled_ms.size() / 2];
      bench.add({{"kind", "decode_sampling"}, {"batch", B}, {"sampling", a.decode_sampling},
                 {"ms_per_step", smed}, {"greedy_ms", med}, {"ratio_to_greedy", smed / med}},
                fmt::format("sampled B={:<3} {:>9.3f} ms/step = {:.3f}x the greedy step ({})", B,
                            smed, smed / med, a.decode_sampling));
    }
    for (int k : a.verify_draft) bench_verify(bench, B, k, pages_per_seq, next, med);
    if (grammar) bench_decode_grammar(bench, *grammar, B, pages_per_seq);
  }
  for (int B : a.prefill_batches) {
    sala::StepMeta warm;
    warm.add_seq(prompt.data(), std::min(a.prefill_in, 256), 0, 0, seq_pages(0, pages_per_seq), false, true);
    model.forward(warm, logits);
    const auto t0 = Clock::now();
    for (int b = 0; b < B; ++b) {  // one sequence per forward: a 4K chunk is a full step
      sala::StepMeta m;
      m.add_seq(prompt.data(), a.prefill_in, 0, b, seq_pages(b, pages_per_seq), false, true);
      model.forward(m, logits);
      fmt::print(stderr, "\rprefill batch {}: {}/{}", B, b + 1, B);
    }
    fmt::print(stderr, "\n");
    const double sec = since(t0);
    const double tok_s = double(B) * a.prefill_in / sec;
    bench.add({{"kind", "prefill"}, {"batch", B}, {"input_len", a.prefill_in}, {"seconds", sec},
               {"tok_s", tok_s}, {"ceiling_tok_s", prefill_ceiling_tok_s}},
              fmt::format("prefill B={:<3} {:>9.1f} ms total {:>10.1f} tok/s   {} peak {:.0f} tok/s -> {:5.1f}%",
                          B, sec * 1e3, tok_s, sala::weight_format_name(body_format),
                          prefill_ceiling_tok_s, 100 * tok_s / prefill_ceiling_tok_s));
  }
  bench_long_prefill(bench);
  bench_long_decode(bench);
  fmt::print("\n{} ({}; {:.3f} B linear params, {:.3f} GB as {}{})\n", a.model,
             model.backend().name(), linear_params / 1e9, bench.linear_bytes / 1e9,
             sala::weight_format_name(model.weights().layers.at(0).down_proj.format),
             model.tp_size() > 1
                 ? fmt::format(" per rank; TP={}: floors are one rank's share", model.tp_size())
                 : "");
  for (auto& l : bench.table) fmt::print("{}\n", l);
  if (!a.out_json.empty()) std::ofstream(a.out_json) << bench.results.dump(2) << "\n";
  return 0;
}

sala::cli::Registrar reg("bench offline", "Model-level decode/prefill throughput vs the PERF.md floors",
                         [](CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_option("--model-path", a->model, "model directory")->required();
  app.add_option("--device", a->device, "cpu or cuda");
  app.add_option("--decode-batches", a->decode_batches, "decode batch sizes")->delimiter(',');
  app.add_flag("--long-only", a->long_only,
               "only the long-context runs (no decode / prefill rows): e.g. a profiler's launch "
               "counts start at the long prompt's first step");
  app.add_option("--prefill-batches", a->prefill_batches, "prefill batch sizes")->delimiter(',');
  app.add_option("--decode-input", a->decode_in, "decode prompt length");
  app.add_option("--decode-output", a->decode_out, "decode steps");
  app.add_option("--prefill-input", a->prefill_in, "prefill prompt length");
  app.add_option("--long-prefill", a->long_prefill,
                 "long prompt lengths, prefilled at batch 1 in --chunk steps (default: none)")
      ->delimiter(',');
  app.add_option("--chunk", a->chunk,
                 "tokens per prefill step of the long runs (the server's --chunked-prefill-size)")
      ->capture_default_str();
  app.add_option("--long-prefill-beside", a->long_prefill_beside,
                 "also time each long prefill with N sequences of --decode-input tokens decoding "
                 "beside it (one row each per chunk step, as the server's mixed steps)")
      ->check(CLI::Range(0, 256));
  app.add_option("--long-decode-contexts", a->long_decode_contexts,
                 "contexts of the long decode runs (default: none)")->delimiter(',');
  app.add_option("--long-decode-batches", a->long_decode_batches,
                 "batch sizes of the long decode runs")->delimiter(',')->capture_default_str();
  app.add_option("--long-decode-steps", a->long_decode_steps,
                 "timed decode steps per long decode run")->capture_default_str();
  app.add_option("--verify-draft-tokens", a->verify_draft,
                 "also time speculative verify steps of 1 + K rows per sequence after each decode run (a list of K)")->delimiter(',');
  app.add_option("--decode-grammar", a->decode_grammar, "json | SCHEMA.json: each decode run again, "
                 "every sequence under this grammar (greedy under the mask), vs the plain step");
  app.add_option("--grammar-tokenizer", a->grammar_tokenizer, "the grammar's vocabulary (default: "
                 "--model-path; a random checkpoint has none: e.g. models/sala-tiny-chat)");
  app.add_option("--decode-sampling", a->decode_sampling,
                 "also time each decode step with sampled rows, e.g. temperature=0.7,top_p=0.9,"
                 "repetition_penalty=1.1,seed=1 (keys: temperature top_k top_p min_p "
                 "repetition_penalty frequency_penalty presence_penalty seed); prints the ratio "
                 "to the greedy step of the same run");
  app.add_option("--threads", a->threads, "CPU threads (0 = all)");
  app.add_option("--tp-size", a->tp_size,
                 "tensor-parallel ranks (CUDA: one GPU each); floors are one rank's share")
      ->check(CLI::Range(1, 8));
  app.add_flag("--tp-gather-o-norm", a->tp_gather_o_norm,
               "TP: the lightning o_norm by all-gathering the heads, not the split norm (A/B)");
  app.add_flag("--tp-peer-comm", a->tp_peer_comm,
               "TP over GPUs: the peer-access communicator instead of NCCL (A/B)");
  app.add_flag("--bf16", a->bf16, "CPU: emulate bf16 rounding");
  app.add_option("--quantization", a->quantization,
                 "fp8: W8A8 e4m3 projections quantized at load (BackendOptions::fp8_weights); "
                 "w4a16: int4 projections, group 128, RTN at load (BackendOptions::int4_group_size)");
  app.add_flag("--disable-cuda-graph", a->disable_cuda_graph, "CUDA: run decode steps without CUDA graphs");
  app.add_option("--profile-ops", a->profile_ops,
                 "CUDA: GPU time per op at exit, over the steps of >= N rows (N < 0: <= -N rows; "
                 "steps recorded as graphs are not timed)");
  app.add_option("--kv-cache-dtype", a->kv_cache_dtype,
                 "auto | fp8_e4m3 | fp8_e5m2 (sparse layers' KV cache and compressed keys; CUDA: bf16 mode)")
      ->capture_default_str();
  app.add_option("--fp8-kv-shadow-tokens", a->fp8_kv_shadow_tokens,
                 "CUDA, FP8 KV cache: tokens of the bf16 shadow that Hopper's stage 2 of prompt "
                 "chunks reads (-1: the longest sequence; 0: none, stage 2 reads the codes)")
      ->capture_default_str();
  app.add_option("--int4-prefill-gemm", a->int4_prefill_gemm,
                 "CUDA, Hopper, int4 weights: prompt runs through the mixed-input GEMM over a "
                 "second copy of the codes (false: dequantize per forward + cuBLASLt)")
      ->capture_default_str();
  app.add_option("--json,--out-json", a->out_json, "also write every table row to FILE as JSON");
  return [a] {
    if (a->long_only) a->decode_batches.clear(), a->prefill_batches.clear();
    return run(*a);
  };
});

}  // namespace
