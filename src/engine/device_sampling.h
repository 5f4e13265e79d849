// A step's sampled rows on the backend (Backend::sample_rows): per row the request's
// parameters, its logit edits (logit_bias, the min_tokens stop-token mask: adjust_logits'
// changes), its penalty table and one draw from its own random stream (SamplerState::uniform,
// the draw the host Sampler would make), so a seeded request gives the same tokens on every run,
// in any batch, and on the CPU and GPU wherever their fp32 sums pick the same candidate. Only
// the chosen ids cross to the host; the logits stay raw for logprobs.
//
// Penalty tables live in the backend, one per state slot. A table is (re)loaded from the
// request's prompt and generated tokens whenever the slot's table is not this request's at
// this many generated tokens (a new request, a preempted one back on another slot, or tokens
// sampled on the host meanwhile: speculative verify steps); the kernel counts each token it
// samples, so a running request uploads nothing after its first sampled step.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/sampling.h"
#include "engine/engine.h"
#include "engine/sampler.h"

namespace sala {

class DeviceSampling {
 public:
  void clear() {
    rows_.clear();
    params_.clear();
    edits_.clear();
  }
  bool empty() const { return rows_.empty(); }
  // Logit row `row` samples for request `id`: tokens[0, prompt_len) its prompt, the next
  // `generated` its generated tokens (tokens may hold more: drafts); `slot` its state slot.
  // Draws from st's stream unless the row is greedy.
  void add(int32_t row, uint64_t id, const SamplingParams& p, SamplerState& st,
           const std::vector<int32_t>& tokens, int32_t prompt_len, int32_t generated,
           int32_t slot, const std::vector<int32_t>& eos_ids, int32_t vocab, Backend& be);
  // Runs the rows on logits [R, V] (the model's workspace); tokens_by_row[row] = the token.
  void run(Backend& be, const Tensor& logits, std::vector<int32_t>& tokens_by_row);

 private:
  std::vector<int32_t> rows_;
  std::vector<RowSampling> params_;
  std::vector<LogitEdit> edits_;
  std::vector<int32_t> ids_;
  std::unordered_map<int32_t, int32_t> last_edit_;  // add()'s scratch: id -> its latest edit
  // slot -> (request id, generated tokens its table holds)
  std::unordered_map<int32_t, std::pair<uint64_t, int64_t>> owner_;
};

}  // namespace sala
