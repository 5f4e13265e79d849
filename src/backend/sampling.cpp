#include "backend/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"

namespace sala {

int32_t argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;  // strict: ties keep the lowest id
  return best;
}

std::vector<int32_t> penalty_table(int32_t vocab, const int32_t* prompt, int64_t n_prompt,
                                   const int32_t* generated, int64_t n_generated) {
  std::vector<int32_t> t(size_t(vocab), 0);
  for (int64_t i = 0; i < n_prompt; ++i)
    if (prompt[i] >= 0 && prompt[i] < vocab) t[size_t(prompt[i])] |= kPenaltyInPrompt;
  for (int64_t i = 0; i < n_generated; ++i)
    if (generated[i] >= 0 && generated[i] < vocab &&
        (t[size_t(generated[i])] & kPenaltyCountMask) < kPenaltyCountMask)
      ++t[size_t(generated[i])];
  return t;
}

void apply_edits_and_penalties(float* logits, int32_t vocab, const RowSampling& rs,
                               const LogitEdit* edits, const int32_t* penalty) {
  // logit_bias first, in order, then the min_tokens mask (engine adjust_logits' order).
  const int32_t e0 = rs.edit_begin, e1 = rs.edit_begin + rs.edit_count;
  for (int32_t e = e0; e < e1; ++e) {
    const LogitEdit& ed = edits[e];
    SALA_CHECK(ed.id >= 0 && ed.id < vocab, "logit edit of id {} (vocabulary {})", ed.id, vocab);
    if (!ed.mask) logits[ed.id] += ed.bias;
  }
  for (int32_t e = e0; e < e1; ++e)
    if (edits[e].mask) logits[edits[e].id] = -INFINITY;
  if (!penalty) return;
  for (int32_t i = 0; i < vocab; ++i)
    if (penalty[i] != 0)
      logits[i] = penalized(logits[i], penalty[i], rs.repetition_penalty, rs.frequency_penalty,
                            rs.presence_penalty);
}

int64_t weigh_candidates(const float* logits, int32_t vocab, float temperature, int32_t top_k,
                         float top_p, float min_p, SampleScratch& s, double& sum) {
  SALA_CHECK(vocab > 0);
  if (temperature <= 0.0f || top_k == 1) return -1;
  // Candidates, sorted by logit (descending, ties to the lower id) when top-k / top-p need
  // an order; otherwise all ids in id order.
  const float inv_t = 1.0f / temperature;
  const bool use_k = top_k > 0 && top_k < vocab;
  const bool use_p = top_p > 0.0f && top_p < 1.0f;
  auto& cand = s.cand;
  auto& probs = s.probs;
  cand.resize(size_t(vocab));
  for (int32_t i = 0; i < vocab; ++i) cand[size_t(i)] = {logits[i], i};
  auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t n = size_t(vocab);
  if (use_k) {
    n = size_t(top_k);
    std::nth_element(cand.begin(), cand.begin() + std::ptrdiff_t(n) - 1, cand.end(), by_logit);
    std::sort(cand.begin(), cand.begin() + std::ptrdiff_t(n), by_logit);
  } else if (use_p) {
    std::sort(cand.begin(), cand.end(), by_logit);
  }
  float mx = -INFINITY;
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, cand[i].first);
  probs.resize(n);
  sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float e = std::exp((cand[i].first - mx) * inv_t);  // -inf logits give 0
    probs[i] = e;
    sum += e;
  }
  if (!(sum > 0)) return -1;  // all -inf / NaN: fall back to greedy
  if (use_p) {  // smallest prefix whose mass reaches top_p (at least one token)
    double acc = 0;
    size_t keep = 0;
    while (keep < n) {
      acc += probs[keep++];
      if (acc >= double(top_p) * sum) break;
    }
    n = keep;
  }
  if (min_p > 0.0f) {  // relative to the most likely token, whose weight is 1
    const float thr = min_p;
    for (size_t i = 0; i < n; ++i)
      if (probs[i] < thr && !(cand[i].first == mx)) probs[i] = 0;
  }
  sum = 0;
  for (size_t i = 0; i < n; ++i) sum += probs[i];
  return int64_t(n);
}

int32_t draw_candidate(const SampleScratch& s, size_t n, double target) {
  double acc = 0;
  size_t last = 0;
  for (size_t i = 0; i < n; ++i) {
    if (s.probs[i] <= 0) continue;
    last = i;
    acc += s.probs[i];
    if (target < acc) return s.cand[i].second;
  }
  return s.cand[last].second;
}

void HostSampler::load_penalties(int32_t slot, int32_t vocab, const int32_t* prompt,
                                 int64_t n_prompt, const int32_t* generated, int64_t n_generated) {
  SALA_CHECK(slot >= 0 && vocab > 0);
  tables_[slot] = penalty_table(vocab, prompt, n_prompt, generated, n_generated);
}

int32_t HostSampler::sample_row(const float* raw, int32_t vocab, const RowSampling& rs,
                                const LogitEdit* edits, int32_t* penalty) {
  row_.assign(raw, raw + vocab);  // the raw row stays for logprobs (the raw distribution)
  apply_edits_and_penalties(row_.data(), vocab, rs, edits, penalty);
  double sum = 0;
  const int64_t n = weigh_candidates(row_.data(), vocab, rs.temperature, rs.top_k, rs.top_p,
                                     rs.min_p, scratch_, sum);
  const int32_t tok = n < 0 ? argmax(row_.data(), vocab) : draw_candidate(scratch_, size_t(n), rs.u * sum);
  if (penalty && (penalty[tok] & kPenaltyCountMask) < kPenaltyCountMask) ++penalty[tok];
  return tok;
}

void HostSampler::sample_rows(const float* logits, int32_t vocab, const int32_t* rows, int64_t n,
                              const RowSampling* params, const LogitEdit* edits, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const RowSampling& rs = params[i];
    SALA_CHECK(rs.u >= 0.0 && rs.u < 1.0, "draw {} outside [0, 1)", rs.u);
    int32_t* penalty = nullptr;
    if (rs.penalty_slot >= 0) {
      auto it = tables_.find(rs.penalty_slot);
      SALA_CHECK(it != tables_.end() && it->second.size() == size_t(vocab),
                 "penalty slot {} was not loaded", rs.penalty_slot);
      penalty = it->second.data();
    }
    out[i] = sample_row(logits + int64_t(rows[i]) * vocab, vocab, rs, edits, penalty);
  }
}

}  // namespace sala
