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

int32_t argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;  // strict: ties keep the lowest id
  return best;
}

int64_t Sampler::weigh(float* logits, int32_t vocab, const SamplingParams& p, SamplerState& st,
                       double& sum) {
  SALA_CHECK(vocab > 0);
  if (st.penalties_) {
    // Repetition (HF): prompt + generated tokens, divides positive logits, multiplies
    // negative ones. Frequency / presence (OpenAI): generated tokens only.
    for (int32_t t : st.touched_) {
      float& l = logits[t];
      const int32_t c = st.out_count_[size_t(t)];
      if (p.repetition_penalty != 1.0f)
        l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
      if (c > 0) l -= p.frequency_penalty * float(c) + p.presence_penalty;
    }
  }
  if (p.temperature <= 0.0f || p.top_k == 1) return -1;

  // Candidates, sorted by logit (descending, ties to the lower id) when top-k / top-p need
  // an order; otherwise all ids in id order.
  const float inv_t = 1.0f / p.temperature;
  const bool use_k = p.top_k > 0 && p.top_k < vocab;
  const bool use_p = p.top_p > 0.0f && p.top_p < 1.0f;
  cand_.resize(size_t(vocab));
  for (int32_t i = 0; i < vocab; ++i) cand_[size_t(i)] = {logits[i], i};
  auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t n = size_t(vocab);
  if (use_k) {
    n = size_t(p.top_k);
    std::nth_element(cand_.begin(), cand_.begin() + std::ptrdiff_t(n) - 1, cand_.end(), by_logit);
    std::sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(n), by_logit);
  } else if (use_p) {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  float mx = -INFINITY;
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, cand_[i].first);
  probs_.resize(n);
  sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float e = std::exp((cand_[i].first - mx) * inv_t);  // -inf logits give 0
    probs_[i] = e;
    sum += e;
  }
  if (!(sum > 0)) return -1;  // all -inf / NaN: fall back to greedy
  if (use_p) {  // smallest prefix whose mass reaches top_p (at least one token)
    double acc = 0;
    size_t keep = 0;
    while (keep < n) {
      acc += probs_[keep++];
      if (acc >= double(p.top_p) * sum) break;
    }
    n = keep;
  }
  if (p.min_p > 0.0f) {  // relative to the most likely token, whose weight is 1
    const float thr = p.min_p;
    for (size_t i = 0; i < n; ++i)
      if (probs_[i] < thr && !(cand_[i].first == mx)) probs_[i] = 0;
  }
  sum = 0;
  for (size_t i = 0; i < n; ++i) sum += probs_[i];
  return int64_t(n);
}

int32_t Sampler::draw(size_t n, double sum, SamplerState& st) {
  // One 53-bit uniform draw from the request's stream (portable across standard libraries).
  const double u = double(st.rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  size_t last = 0;
  for (size_t i = 0; i < n; ++i) {
    if (probs_[i] <= 0) continue;
    last = i;
    acc += probs_[i];
    if (u < acc) return cand_[i].second;
  }
  return cand_[last].second;
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
    if (cand_[i].second == draft) at = i;
  const double pd = at < size_t(n) ? double(probs_[at]) : 0.0;  // unnormalised: p(draft)·sum
  // Accept iff u < p(draft) / q(draft), u uniform in [0, 1): u · sum · q(draft) < pd.
  const double qd = q ? double(q[draft]) : 1.0;
  const double u = double(st.rng_() >> 11) * 0x1.0p-53 * sum;
  accepted = u * qd < pd;
  if (accepted) return draft;
  if (!q) {
    // Rejected: the residual max(0, p - q) with q one-hot at the draft is p without it. Its
    // mass is positive: u < sum, so pd < sum.
    if (at < size_t(n)) {
      sum -= pd;
      probs_[at] = 0;
    }
    return draw(size_t(n), sum, st);
  }
  // Rejected: the residual max(0, p - q) over the candidates (p is 0 elsewhere, so is the
  // residual). Its mass is positive whenever a rejection is possible (p != q); in a rounding
  // case with none left the token comes from p itself (weighed again: probs_ now holds r;
  // speculation verifies plain rows only, so no penalty is applied twice).
  double rsum = 0;
  for (size_t i = 0; i < size_t(n); ++i) {
    const double r = double(probs_[i]) / sum - double(q[cand_[i].second]);
    probs_[i] = r > 0 ? float(r) : 0.0f;
    rsum += probs_[i];
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
    probs_[i] = float(double(probs_[i]) / sum);
    q[cand_[i].second] = probs_[i];
    qsum += probs_[i];
  }
  return draw(size_t(n), qsum, st);
}

}  // namespace sala
