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
#include <string>
#include <vector>

namespace sala {

class Model;

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
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // already tokenized (BOS included if wanted)
  SamplingParams sampling;
};

enum class FinishReason { None, Length, StopToken, Aborted, Error };

// One event per engine step that produced something for this request.
struct TokenEvent {
  std::vector<int32_t> tokens;  // new tokens since the previous event (may be empty at end)
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
};

struct EngineStats {
  int64_t running = 0, queued = 0;
  int64_t kv_pages_total = 0, kv_pages_used = 0;
  int64_t state_slots_total = 0, state_slots_used = 0;
  int64_t requests_total = 0, requests_finished = 0, requests_aborted = 0, preemptions = 0;
  int64_t prompt_tokens_total = 0, generated_tokens_total = 0;
  int64_t steps = 0;
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
};

// The model's KV pool and state slots are sized by the caller (ModelLimits) before this.
std::unique_ptr<Engine> make_engine(std::unique_ptr<Model> model, const EngineOptions& opts);

}  // namespace sala
