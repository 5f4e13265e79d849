// The engine: one thread that owns scheduling and the model. HTTP threads submit requests
// and read per-request outboxes; they never touch the model or the caches.
//
//   HTTP thread                      engine thread
//   submit(req) ──► inbox ─────────► admit (KV pages + state slot) ─► chunked prefill /
//   handle->next(ev) ◄── outbox ◄──── decode steps mixed in one forward ─► sample ─► emit
//   handle->cancel() ─────────────►  abort at the next step boundary, free pages + slot
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/scheduler.h"    // SchedulePolicy
#include "grammar/grammar.h"     // CompiledGrammar (structured output)
#include "model/minicpm_sala.h"  // Model, ModelLimits, ModelConfig

namespace sala {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (argmax, ties to the lowest id)
  float top_p = 1.0f;
  int32_t top_k = -1;  // -1 or 0: off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // HF/SGLang semantics: divides positive logits
  float frequency_penalty = 0.0f;   // OpenAI semantics, over generated tokens
  float presence_penalty = 0.0f;
  std::optional<uint64_t> seed;     // same seed + same request → same output
  int32_t max_new_tokens = 128;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS ids
  // Stop tokens (EOS unless ignore_eos, and stop_token_ids) cannot be sampled before this
  // many tokens were generated (vLLM's min_tokens, SGLang's min_new_tokens).
  int32_t min_new_tokens = 0;
  // Added to the token's logit before sampling (OpenAI's logit_bias, in [-100, 100]).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// Log-probabilities a request wants, of the raw model distribution: log_softmax of the
// logits before temperature, penalties and top-k/p (vLLM's default "raw_logprobs").
struct LogprobOptions {
  bool output = false;        // one TokenLogprob per generated token
  int32_t top_n = 0;          // alternatives per token, 0..kMaxTopLogprobs
  int64_t prompt_start = -1;  // prompt positions [prompt_start, prompt_len) too; -1: none
};

// The log-probability of one token and the top_n most likely ones at its position.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;  // NaN for prompt position 0 (nothing precedes it)
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // already tokenized (BOS included if wanted)
  SamplingParams sampling;      // max_new_tokens 0 only with prompt logprobs (scoring)
  LogprobOptions logprobs;
  // Structured output: every generated token is one the grammar allows (compiled on the HTTP
  // thread by grammar::GrammarCompiler for this model's vocabulary); generation ends when
  // the output is a complete sentence that cannot go on (FinishReason::GrammarComplete).
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

// GrammarComplete: the grammar allows nothing but a stop token next (not sampled, not counted).
enum class FinishReason { None, Length, StopToken, Aborted, Error, GrammarComplete };

// One event per engine step that produced something for this request. When the reader is
// slower than the engine, the engine appends new tokens to the last unread event instead of
// queueing another one (so `tokens` may hold several tokens). A matched EOS / stop token is
// NOT in `tokens` (it is in matched_stop_token) but is counted in completion_tokens, as
// SGLang counts it. After the final event (finished == true) has been read, next() returns
// a copy of it (with no tokens) at once.
struct TokenEvent {
  std::vector<int32_t> tokens;  // new tokens since the previous event (may be empty at end)
  // With LogprobOptions::output: one per token of `tokens`, then, in the final event of a
  // request ended by a stop token, that token's (it is counted and scored, not shown).
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> prompt_logprobs;  // new prompt positions, in order, from prompt_start
  bool finished = false;
  FinishReason reason = FinishReason::None;
  int32_t matched_stop_token = -1;  // for FinishReason::StopToken
  std::string error;                // for FinishReason::Error
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;    // cumulative
};

class RequestHandle {
 public:
  virtual ~RequestHandle() = default;
  // Blocks until the next event or the timeout; false on timeout.
  virtual bool next(TokenEvent& ev, std::chrono::milliseconds timeout) = 0;
  // Abort (client went away, or a stop string matched in the detokenizer). Idempotent.
  virtual void cancel() = 0;
  virtual uint64_t id() const = 0;
};

struct EngineOptions {
  int32_t max_running_requests = 64;
  int32_t chunked_prefill_size = 8192;  // max prompt tokens of one request per step
  int32_t max_step_tokens = 8192;       // all rows of one forward
  int32_t max_queued_requests = 1024;   // beyond: submit throws QueueFull (HTTP 429)
  int32_t max_context_len = 0;          // 0: model's max_position_embeddings
  bool dense_as_sparse = false;
  SchedulePolicy schedule_policy = SchedulePolicy::Fair;  // see scheduler.h
  // Speculative decoding of plain requests (speculative.h): n-gram drafts, or a draft model's
  // (speculative.draft_model: make_engine's draft_model, engine/draft_model.h); plan_limits
  // gives it a snapshot state slot per request and 1 + num_draft_tokens logit rows per request.
  SpeculativeOptions speculative;
  // Sampled (non-greedy) steps sample on the backend (Backend::sample_rows: only ids leave the
  // device); false: the logits rows are downloaded and sampled by the host Sampler. Steps with
  // a sampled speculative verify call always sample on the host (Sampler::sample_draft).
  bool device_sampling = true;
};

// Engine steps of one kind: wall seconds from scheduling to the last token event, and the
// part of them inside Model::forward (the backend's work, including its wait for the GPU).
struct StepKindStats {
  int64_t steps = 0;
  double seconds = 0, forward_seconds = 0;
  void add(double step_s, double forward_s) {
    ++steps;
    seconds += step_s;
    forward_seconds += forward_s;
  }
};

struct EngineStats {
  int64_t running = 0, queued = 0;
  int64_t kv_pages_total = 0, kv_pages_used = 0;
  int64_t state_slots_total = 0, state_slots_used = 0;
  int64_t requests_total = 0, requests_finished = 0, requests_aborted = 0, preemptions = 0;
  int64_t prompt_tokens_total = 0, generated_tokens_total = 0;
  int64_t steps = 0;
  int64_t step_tokens_total = 0;  // rows of all forwards (prefill + recompute + decode)
  // Speculative decoding: verify calls, drafted tokens, accepted drafts (bonus tokens not
  // counted); tokens per verify call = accepted / verifies + 1.
  int64_t spec_verify_calls = 0, spec_drafted_tokens = 0, spec_accepted_tokens = 0;
  // Verify calls that rejected a draft (the target's state restored from its snapshot), and
  // rollbacks of the draft model's own state (STANDALONE: a fed draft rejected).
  int64_t spec_rollbacks = 0, spec_draft_rollbacks = 0;
  int64_t spec_draft_pages_used = 0, spec_draft_slots_used = 0;  // the draft model's caches
  // Steps by their rows: prompt chunks only, decode rows only (one-token and verify calls), or
  // both (a chunk beside running requests' decodes: what --chunked-prefill-size bounds).
  StepKindStats prefill_steps, mixed_steps, decode_steps;
};

// Static facts for /get_server_info and request validation in the HTTP layer.
struct EngineInfo {
  EngineOptions options;        // as resolved (clamped to the model's limits)
  int32_t max_context_len = 0;  // prompt + generated tokens of one request
  int32_t vocab_size = 0;
  int32_t page_size = 0, num_pages = 0, num_slots = 0;
  int64_t max_total_tokens = 0;  // num_pages * page_size
  std::vector<int32_t> eos_token_ids;
};

class QueueFull : public std::runtime_error {
 public:
  QueueFull() : std::runtime_error("the request queue is full") {}
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Thread-safe. Throws sala::Error for a request that can never run (prompt too long for
  // the context or the KV pool), QueueFull when the queue is full.
  virtual std::shared_ptr<RequestHandle> submit(GenerationRequest req) = 0;
  virtual EngineStats stats() const = 0;
  virtual bool alive() const = 0;
  virtual void shutdown() = 0;  // finishes nothing; aborts all; joins the thread
  virtual EngineInfo info() const { return {}; }
};

// The model's KV pool and state slots are sized by the caller (ModelLimits) before this.
// The engine clamps max_running_requests to the state slots and the model's logit rows,
// max_step_tokens to the model's; it raises max_step_tokens (within the model's limit), or
// else lowers chunked_prefill_size, so that a whole prefill chunk fits beside one decode row
// per running request (chunk boundaries are fixed per request: see scheduler.h).
// draft_model: STANDALONE speculation's draft model (opts.speculative.draft_model), sized by
// plan_draft_limits, on a backend of its own of the same kind; null otherwise.
std::unique_ptr<Engine> make_engine(std::unique_ptr<Model> model, const EngineOptions& opts,
                                    std::unique_ptr<Model> draft_model = nullptr);

// Cache sizing for the CLI, before the Model is built: page_size = sparse block_size,
// num_slots = max_running_requests (twice that with speculation: a snapshot slot each),
// max_step_tokens = max(opts.max_step_tokens, chunked_prefill_size + max_running_requests ·
// (1 + num_draft_tokens)), max_logit_rows = max_running_requests · (1 + num_draft_tokens),
// keep_verify_rows = that, at most 512, with speculation (Model::rollback_state). num_pages: from max_total_tokens when > 0 (SGLang's
// --max-total-tokens, taken as given), else from memory_budget_bytes (after the state slots),
// but never fewer than one request of max_context_len needs. draft: STANDALONE's draft model,
// whose caches (plan_draft_limits) come out of the same budget: its state slots first, then
// each target page is paid for with the draft KV of as many tokens.
ModelLimits plan_limits(const ModelConfig& cfg, const EngineOptions& opts,
                        size_t memory_budget_bytes, int64_t max_total_tokens = 0,
                        size_t kv_element_bytes = 4, const ModelConfig* draft = nullptr);
// The state slots requests may hold (the upper half holds speculative snapshots), and the
// engine's options fitted to the model's limits: running requests, step tokens and the prefill
// chunk clamped so a whole chunk fits beside a verify call of every running request (what
// make_engine runs; pool_sizing.cpp). SALA_CHECK on options no limits can satisfy.
int32_t request_state_slots(const EngineOptions& o, const ModelLimits& lim);
EngineOptions fit_engine_options(const EngineOptions& opts, const ModelConfig& cfg,
                                 const ModelLimits& lim);
// The draft model's limits beside the target's `target` (plan_limits): a state slot and a
// snapshot slot per running request; KV pages for the target's tokens plus, per running
// request, the drafts it computes ahead of the target (num_draft_tokens) and a partial page;
// steps of the target's rows plus the catch-up rows of every running request (1 +
// num_draft_tokens), one logit row per running request.
ModelLimits plan_draft_limits(const ModelConfig& draft, const EngineOptions& opts,
                              const ModelLimits& target);
// Bytes of one KV page (K, V and both compressed-key levels of every sparse layer; elements of
// element_bytes: 4 on the CPU, 2 (bf16) on the GPU) and
// of one lightning-state slot (fp32 on every backend).
size_t kv_bytes_per_page(const ModelConfig& cfg, int32_t page_size, size_t element_bytes = 4);
size_t state_bytes_per_slot(const ModelConfig& cfg);

}  // namespace sala
