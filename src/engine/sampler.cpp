#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace sala {

void SamplerState::init(const SamplingParams& p, const std::vector<int32_t>& prompt,
                        int32_t vocab) {
  seed_ = p.seed ? *p.seed : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  rng_.seed(seed_);
  penalties_ = p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f ||
               p.presence_penalty != 0.0f;
  if (!penalties_) return;
  out_count_.assign(size_t(vocab), 0);
  in_prompt_.assign(size_t(vocab), 0);
  for (int32_t t : prompt) {
    if (t < 0 || t >= vocab) continue;
    if (!in_prompt_[size_t(t)]) touched_.push_back(t);
    in_prompt_[size_t(t)] = 1;
  }
}

void SamplerState::observe(int32_t token) {
  if (!penalties_ || token < 0 || size_t(token) >= out_count_.size()) return;
  if (!in_prompt_[size_t(token)] && out_count_[size_t(token)] == 0) touched_.push_back(token);
  ++out_count_[size_t(token)];
}

void adjust_logits(float* logits, int32_t vocab, const SamplingParams& p, int32_t generated,
                   const std::vector<int32_t>& eos_ids) {
  for (const auto& [id, bias] : p.logit_bias)
    if (id >= 0 && id < vocab) logits[id] += bias;
  if (generated >= p.min_new_tokens) return;
  auto mask = [&](int32_t id) {
    if (id >= 0 && id < vocab) logits[id] = -INFINITY;
  };
  if (!p.ignore_eos)
    for (int32_t id : eos_ids) mask(id);
  for (int32_t id : p.stop_token_ids) mask(id);
}

int64_t Sampler::weigh(float* logits, int32_t vocab, const SamplingParams& p, SamplerState& st,
                       double& sum) {
  SALA_CHECK(vocab > 0);
  if (st.penalties_) {
    // backend/sampling.h's rule, over the ids the prompt or the output touched.
    for (int32_t t : st.touched_) {
      const int32_t entry = (st.in_prompt_[size_t(t)] ? kPenaltyInPrompt : 0) |
                            std::min(st.out_count_[size_t(t)], kPenaltyCountMask);
      logits[t] = penalized(logits[t], entry, p.repetition_penalty, p.frequency_penalty,
                            p.presence_penalty);
    }
  }
  return weigh_candidates(logits, vocab, p.temperature, p.top_k, p.top_p, p.min_p, s_, sum);
}

int32_t Sampler::draw(size_t n, double sum, SamplerState& st) {
  return draw_candidate(s_, n, st.uniform() * sum);
}

int32_t Sampler::sample(float* logits, int32_t vocab, const SamplingParams& p,
                        SamplerState& st) {
  double sum = 0;
  const int64_t n = weigh(logits, vocab, p, st, sum);
  return n < 0 ? argmax(logits, vocab) : draw(size_t(n), sum, st);
}

int32_t Sampler::sample_draft(float* logits, int32_t vocab, const SamplingParams& p,
                              SamplerState& st, int32_t draft, bool& accepted, const float* q) {
  double sum = 0;
  const int64_t n = weigh(logits, vocab, p, st, sum);
  if (n < 0) {
    const int32_t t = argmax(logits, vocab);
    accepted = t == draft;
    return t;
  }
  size_t at = size_t(n);  // the draft's candidate, if it has one
  for (size_t i = 0; i < size_t(n); ++i)
    if (s_.cand[i].second == draft) at = i;
  const double pd = at < size_t(n) ? double(s_.probs[at]) : 0.0;  // unnormalised: p(draft)·sum
  // Accept iff u < p(draft) / q(draft), u uniform in [0, 1): u · sum · q(draft) < pd.
  const double qd = q ? double(q[draft]) : 1.0;
  const double u = st.uniform() * sum;
  accepted = u * qd < pd;
  if (accepted) return draft;
  if (!q) {
    // Rejected: the residual max(0, p - q) with q one-hot at the draft is p without it. Its
    // mass is positive: u < sum, so pd < sum.
    if (at < size_t(n)) {
      sum -= pd;
      s_.probs[at] = 0;
    }
    return draw(size_t(n), sum, st);
  }
  // Rejected: the residual max(0, p - q) over the candidates (p is 0 elsewhere, so is the
  // residual). Its mass is positive whenever a rejection is possible (p != q); in a rounding
  // case with none left the token comes from p itself (weighed again: probs_ now holds r;
  // speculation verifies plain rows only, so no penalty is applied twice).
  double rsum = 0;
  for (size_t i = 0; i < size_t(n); ++i) {
    const double r = double(s_.probs[i]) / sum - double(q[s_.cand[i].second]);
    s_.probs[i] = r > 0 ? float(r) : 0.0f;
    rsum += s_.probs[i];
  }
  if (rsum > 0) return draw(size_t(n), rsum, st);
  const int64_t m = weigh(logits, vocab, p, st, sum);
  return m < 0 ? argmax(logits, vocab) : draw(size_t(m), sum, st);
}

int32_t Sampler::sample_proposal(float* logits, int32_t vocab, const SamplingParams& p,
                                 SamplerState& st, float* q) {
  double sum = 0;
  const int64_t n = weigh(logits, vocab, p, st, sum);
  std::fill(q, q + vocab, 0.0f);
  if (n < 0) {
    const int32_t t = argmax(logits, vocab);
    q[t] = 1.0f;
    return t;
  }
  // q as float, then the draw over exactly those values: the token comes from the q that
  // sample_draft will divide by.
  double qsum = 0;
  for (size_t i = 0; i < size_t(n); ++i) {
    s_.probs[i] = float(double(s_.probs[i]) / sum);
    q[s_.cand[i].second] = s_.probs[i];
    qsum += s_.probs[i];
  }
  return draw(size_t(n), qsum, st);
}

}  // namespace sala
