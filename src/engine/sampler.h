// CPU sampling from one fp32 logits row. Greedy (temperature <= 0 or top_k == 1) is the
// argmax with ties to the lowest id. Otherwise: penalties, temperature, top-k, top-p, min-p
// (SGLang's order), then one draw from the request's own RNG, so the same seed gives the
// same tokens. The arithmetic is backend/sampling.h's (weigh_candidates, draw_candidate), which
// Backend::sample_rows runs on the device's logits (engine/device_sampling.h) with draws taken
// from the same stream (SamplerState::uniform).
#pragma once
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "backend/sampling.h"
#include "engine/engine.h"

namespace sala {

// Per-request sampling state, created at submit; never reset by preemption (a recomputed
// request continues its random stream where it stopped).
class SamplerState {
 public:
  SamplerState() = default;
  // vocab: logits row width. Allocates the penalty tables only when a penalty is active.
  void init(const SamplingParams& p, const std::vector<int32_t>& prompt, int32_t vocab);
  // Records a generated token (frequency / presence / repetition penalties).
  void observe(int32_t token);
  // True when sampling is the plain argmax of the raw logits (no penalty, bias or stop-token
  // mask changes them).
  bool plain_greedy(const SamplingParams& p) const {
    return plain(p) && (p.temperature <= 0.0f || p.top_k == 1);
  }
  // True when the distribution of a row depends only on the row and p's temperature / top-k /
  // top-p / min-p (no penalty, bias or stop-token mask): what speculation may verify.
  bool plain(const SamplingParams& p) const {
    return !penalties_ && p.logit_bias.empty() && p.min_new_tokens == 0;
  }
  uint64_t seed() const { return seed_; }
  bool penalties() const { return penalties_; }
  // The next draw of the request's stream, uniform in [0, 1) with 53 bits (the draw sample()
  // makes; portable across standard libraries).
  double uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

 private:
  friend class Sampler;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  bool penalties_ = false;
  std::vector<int32_t> out_count_;  // [vocab] generated occurrences
  std::vector<uint8_t> in_prompt_;  // [vocab]
  std::vector<int32_t> touched_;    // distinct ids with in_prompt_ or out_count_ set
};

// The request's own changes to a logits row before sampling: logit_bias is added, and while
// fewer than min_new_tokens tokens were generated the stop tokens (eos_ids unless
// ignore_eos, and stop_token_ids) get -inf, so they cannot end the sequence early (vLLM's
// min_tokens: a mask, not a rejected sample).
void adjust_logits(float* logits, int32_t vocab, const SamplingParams& p, int32_t generated,
                   const std::vector<int32_t>& eos_ids);

class Sampler {
 public:
  // Samples one token from `logits` [vocab]; the row is modified in place (penalties,
  // temperature). Scratch buffers are kept between calls.
  int32_t sample(float* logits, int32_t vocab, const SamplingParams& p, SamplerState& st);
  // Speculative sampling of a drafted token. q: the proposal distribution the draft was drawn
  // from, [vocab] probabilities (a draft model's, from sample_proposal), or null for a one-hot
  // proposal at the draft (n-gram). Accepts the draft with probability min(1, p(draft) /
  // q(draft)) under the row's distribution p (one uniform draw), else returns a token drawn
  // from the residual max(0, p - q), renormalised (a second draw); for a one-hot q that is p
  // with the draft removed. The returned token is distributed exactly as sample()'s.
  // Greedy parameters: the argmax, accepted iff equal (q unused).
  int32_t sample_draft(float* logits, int32_t vocab, const SamplingParams& p, SamplerState& st,
                       int32_t draft, bool& accepted, const float* q = nullptr);
  // A draft model's proposal: samples one token as sample() does and writes the distribution
  // it was drawn from into q [vocab] (0 outside the candidates, summing to 1), the q that
  // sample_draft then verifies it with. Greedy parameters (or no finite logit): the argmax,
  // with q one-hot at it.
  int32_t sample_proposal(float* logits, int32_t vocab, const SamplingParams& p,
                          SamplerState& st, float* q);

 private:
  // The row's candidates cand_[0, n) and their weights probs_ (unnormalised, summing to sum)
  // after penalties, temperature, top-k, top-p and min-p; -1 when sampling is the argmax.
  int64_t weigh(float* logits, int32_t vocab, const SamplingParams& p, SamplerState& st,
                double& sum);
  // One draw from the weights of weigh() (the request's stream).
  int32_t draw(size_t n, double sum, SamplerState& st);

  SampleScratch s_;  // candidates and weights of the latest weigh()
};

}  // namespace sala
