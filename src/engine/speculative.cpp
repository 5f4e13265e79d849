#include "engine/speculative.h"

#include <algorithm>

#include "backend/backend.h"
#include "core/check.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/minicpm_sala.h"

namespace sala {

std::vector<int32_t> ngram_draft(const std::vector<int32_t>& tokens, int32_t k,
                                 int32_t ngram_min, int32_t ngram_max, NgramMatch* match) {
  if (match) *match = {};
  const int64_t L = int64_t(tokens.size());
  if (k <= 0 || L < 2 || ngram_min < 1 || ngram_max < ngram_min) return {};
  // One backward scan over the earlier positions j whose token equals the last one; the
  // match length there is how far tokens[.. j] and tokens[.. L - 1] agree backwards (at most
  // ngram_max). The first (latest) j of the longest match wins. at_least[n]: the positions
  // whose match is >= n long, i.e. the earlier occurrences of the suffix's n-gram. O(L) per
  // call plus ngram_max per candidate.
  const int32_t last = tokens[size_t(L - 1)];
  int64_t best_j = -1, best_len = 0;
  std::vector<int64_t> at_least(size_t(ngram_max) + 1, 0);
  for (int64_t j = L - 2; j >= 0; --j) {
    if (tokens[size_t(j)] != last) continue;
    int64_t m = 1;
    while (m < ngram_max && j - m >= 0 && tokens[size_t(j - m)] == tokens[size_t(L - 1 - m)]) ++m;
    for (int64_t n = 1; n <= m; ++n) ++at_least[size_t(n)];
    if (m > best_len) {
      best_len = m;
      best_j = j;
    }
  }
  if (best_len < ngram_min) return {};
  if (match) *match = {int32_t(best_len), at_least[size_t(best_len)] == 1};
  const int64_t from = best_j + 1, to = std::min<int64_t>(L, from + k);
  return {tokens.begin() + from, tokens.begin() + to};
}

int32_t verify_rows(const int32_t* drafts, int32_t d, const int32_t* argmax_rows, float* logits,
                    int32_t vocab, Sampler& sampler, const SamplingParams& p, SamplerState& st,
                    std::vector<int32_t>& emit, const float* q) {
  emit.clear();
  for (int32_t i = 0; i <= d; ++i) {
    float* row = logits + size_t(i) * size_t(vocab);
    if (i == d) {
      emit.push_back(argmax_rows ? argmax_rows[i] : sampler.sample(row, vocab, p, st));
      return d;
    }
    bool accepted = false;
    int32_t tok;
    if (argmax_rows) {
      tok = argmax_rows[i];
      accepted = tok == drafts[i];
    } else {
      tok = sampler.sample_draft(row, vocab, p, st, drafts[i], accepted,
                                 q ? q + size_t(i) * size_t(vocab) : nullptr);
    }
    emit.push_back(tok);
    if (!accepted) return i;
  }
  return d;
}

int32_t call_logit_rows(const ScheduledSeq& it) {
  if (!it.sample) return 0;
  const Sequence& s = *it.seq;
  const bool every_row = s.spec.drafts > 0 || (s.spec.recompute && s.num_computed > 0 &&
                                                it.num_tokens <= Model::kGraphMaxCallRows);
  return every_row ? it.num_tokens : 1;
}

void adapt_draft_len(SpecState& s, int32_t drafted, int32_t accepted, int32_t max_drafts) {
  if (drafted <= 0) return;
  s.draft_len = accepted == drafted ? std::min(max_drafts, s.draft_len + 1)
                                    : std::max(1, accepted + 1);
  s.misses = accepted == 0 ? s.misses + 1 : 0;
  s.pause = s.misses >= 2 ? std::min(kMaxDraftPause, 1 << std::min(s.misses - 2, 6)) : 0;
}

void NgramDrafter::propose(const std::vector<DraftAsk>& asks,
                           std::vector<std::vector<int32_t>>& out) {
  out.resize(asks.size());
  for (size_t i = 0; i < asks.size(); ++i) {
    const Sequence& s = *asks[i].seq;
    PerRequest& r = request(s);
    score(r, s.tokens);
    std::vector<int32_t>& d = out[i];
    NgramMatch match;
    d = r.index.draft(s.tokens, asks[i].k, NgramIndex::kDefaultBudget, &match);
    if (d.empty()) continue;
    r.shadow = d;
    r.shadow_at = int64_t(s.tokens.size());
    r.shadow_match = match;
    if (min_accept_ <= 0) continue;
    // P_j, the chance that the first j drafts all pass: the product of the rates of drafts
    // 1..j, draft i's under the match it extends (min(n + i - 1, ngram_max) tokens once the
    // drafts before it passed). j drafts while P_j >= min_accept, and none unless the call's
    // expected gain, sum of P_j, pays for a verify call instead of a decode step.
    const SamplingParams* sp = asks[i].policy.sampling;
    const bool seeded = sp && sp->seed && sp->temperature > 0.0f && sp->top_k != 1;
    double all = 1, gain = 0;
    size_t j = 0;
    for (; j < d.size(); ++j) {
      all *= request_accept_rate(s, chained(match, int32_t(j)), seeded);
      if (all < min_accept_) break;
      gain += all;
    }
    d.resize(gain >= kVerifyCallCost ? j : 0);
  }
}

NgramMatch NgramDrafter::chained(NgramMatch m, int32_t i) const {
  return {std::min(m.len + i, max_), m.unique};
}

void NgramDrafter::score(PerRequest& r, const std::vector<int32_t>& tokens) {
  if (r.shadow.empty()) return;
  const int64_t produced = std::max<int64_t>(0, int64_t(tokens.size()) - r.shadow_at);
  const size_t compared = size_t(std::min<int64_t>(produced, int64_t(r.shadow.size())));
  size_t matched = 0;
  while (matched < compared && tokens[size_t(r.shadow_at) + matched] == r.shadow[matched])
    ++matched;
  // Drafts up to and including the first that fails are tested (a verify call stops there),
  // each under its own chained match.
  const size_t tested = matched < compared ? matched + 1 : matched;
  for (size_t i = 0; i < tested; ++i) {
    Counts& m = counts(chained(r.shadow_match, int32_t(i)));
    m.tested += 1;
    m.accepted += i < matched ? 1 : 0;
    if (m.tested > kMatchWindow) {
      m.tested *= 0.5;
      m.accepted *= 0.5;
    }
  }
  r.counts.tested += double(tested);
  r.counts.accepted += double(matched);
  r.shadow.clear();
}

NgramDrafter::Counts& NgramDrafter::counts(NgramMatch m) {
  return by_match_[size_t(m.len) * 2 + (m.unique ? 1 : 0)];
}

double NgramDrafter::accept_rate(NgramMatch m) const {
  SALA_CHECK(m.len >= 1 && m.len <= max_, "match length {} outside 1..{}", m.len, max_);
  const Counts& c = by_match_[size_t(m.len) * 2 + (m.unique ? 1 : 0)];
  return (c.accepted + kPriorAccepted) / (c.tested + kPriorTested);
}

double NgramDrafter::request_accept_rate(const Sequence& s, NgramMatch m, bool own_only) const {
  const double p = own_only ? kPriorAccepted / kPriorTested : accept_rate(m);
  auto it = requests_.find(s.id);
  if (it == requests_.end()) return p;
  const Counts& c = it->second.counts;
  return (c.accepted + kRequestPrior * p) / (c.tested + kRequestPrior);
}

// Verified or not, drafts are scored by the tokens the request produces (score()).
void NgramDrafter::settle(const Sequence&, int32_t, int32_t, bool) {}

void NgramDrafter::planned(const SchedulePlan& plan, const DraftPolicyFn& policy) {
  for (const ScheduledSeq& it : plan.items) {
    const Sequence& s = *it.seq;
    // Prefill chunks only (a verify call's tokens hold its drafts); the chunk's n-grams.
    if (it.num_tokens <= 1 || s.spec.drafts > 0 || !policy(s).eligible) continue;
    request(s).index.extend(s.tokens, s.num_computed + it.num_tokens);
  }
}

NgramDrafter::PerRequest& NgramDrafter::request(const Sequence& s) {
  return requests_.try_emplace(s.id, NgramIndex(min_, max_)).first->second;
}

const NgramIndex* NgramDrafter::index(const Sequence& s) const {
  auto it = requests_.find(s.id);
  return it == requests_.end() ? nullptr : &it->second.index;
}

void NgramDrafter::release(const Sequence& s) {
  auto it = requests_.find(s.id);
  if (it == requests_.end()) return;
  score(it->second, s.tokens);  // the last lookup's drafts against the request's last tokens
  requests_.erase(it);
}

Speculator::Speculator(const SpeculativeOptions& opts, int32_t snapshot_offset,
                       std::unique_ptr<Drafter> drafter, DraftPolicyFn policy)
    : opts_(opts), snapshot_offset_(opts.enabled() ? snapshot_offset : 0),
      drafter_(drafter ? std::move(drafter)
                       : std::make_unique<NgramDrafter>(opts.ngram_min, opts.ngram_max,
                                                       opts.ngram_min_accept)),
      policy_(std::move(policy)) {}

void Speculator::draft(const std::vector<Sequence*>& running, const Scheduler& sch) {
  SALA_CHECK(step_seqs_.empty(), "drafts of the previous step were not dropped");
  if (!enabled()) return;
  asks_.clear();
  for (Sequence* s : running) {
    if (s->pending() <= 1) s->spec.recompute = false;  // rolled-back rows computed again
    if (s->pending() != 1 || s->slot < 0) continue;  // prefilling, or a recompute pending
    const DraftPolicy pol = policy_(*s);
    if (!pol.eligible) continue;
    if (s->spec.pause > 0) {  // after verify calls that accepted nothing (SpecState::pause)
      --s->spec.pause;
      continue;
    }
    if (s->spec.draft_len == 0) s->spec.draft_len = opts_.num_draft_tokens;
    int32_t k = std::min(s->spec.draft_len, pol.cap);
    if (k <= 0) continue;
    // A call never crosses a chunk boundary (dense_len - 1 among them: the dense / sparse
    // choice is per call): drafts past the boundary wait for a later step. The boundary of a
    // call with k more tokens, measured with placeholders (the last token repeated).
    const size_t base = s->tokens.size();
    s->tokens.insert(s->tokens.end(), size_t(k), s->tokens.back());
    k = int32_t(std::min<int64_t>(k, sch.call_end(*s) - int64_t(base)));
    s->tokens.resize(base);
    if (k > 0) asks_.push_back({s, k, pol});
  }
  if (asks_.empty()) return;
  drafter_->propose(asks_, proposed_);
  for (size_t i = 0; i < asks_.size(); ++i) {
    Sequence* s = asks_[i].seq;
    const std::vector<int32_t>& d = proposed_[i];
    SALA_CHECK(int32_t(d.size()) <= asks_[i].k, "{} drafts for {} asked", d.size(), asks_[i].k);
    if (d.empty()) continue;
    s->spec.base = int64_t(s->tokens.size());
    s->tokens.insert(s->tokens.end(), d.begin(), d.end());
    s->spec.drafts = int32_t(d.size());
    step_seqs_.push_back(s);
  }
}

void Speculator::planned(const SchedulePlan& plan, Model& model) {
  for (const ScheduledSeq& it : plan.items)
    if (it.seq->spec.drafts > 0 && it.sample)
      model.snapshot_state(it.seq->slot, it.seq->slot + snapshot_offset_);  // every TP rank
  if (enabled()) drafter_->planned(plan, policy_);
}

void Speculator::forget(const Sequence* s) {
  std::erase(step_seqs_, s);
  if (enabled()) drafter_->release(*s);
}

void Speculator::settle(Sequence& s, int32_t a, Model& model) {
  const int32_t d = s.spec.drafts;
  const int64_t base = s.spec.base;  // tokens before the drafts; base - 1 was pending
  SALA_CHECK(d > 0 && a >= 0 && a <= d && int64_t(s.tokens.size()) == base + d &&
                 s.num_computed == base + d,
             "sequence {}: {} of {} drafts accepted, {} tokens, {} computed, base {}", s.id, a, d,
             s.tokens.size(), s.num_computed, base);
  s.tokens.resize(size_t(base));
  if (a == d) {
    s.num_computed = base + d;  // every row computed is a kept token
  } else if (model.rollback_state(s.slot, s.slot + snapshot_offset_, a + 1)) {
    // The state after the last token and the accepted drafts, from the snapshot and the
    // call's own k, v rows: those rows stay computed, the bonus token is pending.
    s.num_computed = base + a;
    ++rollbacks_;
  } else {
    // The state saw rejected rows: back to the snapshot, and the last token plus the
    // accepted drafts are computed again in the next call.
    model.copy_state_slot(s.slot + snapshot_offset_, s.slot);
    s.num_computed = base - 1;
    s.spec.recompute = true;
    ++rollbacks_;
  }
  s.spec.drafts = 0;
  drafter_->settle(s, d, a, true);
  adapt_draft_len(s.spec, d, a, opts_.num_draft_tokens);
  drafted_ += d;
  accepted_ += a;
  ++verifies_;
}

void Speculator::end_step() {
  for (Sequence* s : step_seqs_) {
    if (s->spec.drafts == 0) continue;  // resolved
    s->tokens.resize(size_t(s->spec.base));
    drafter_->settle(*s, s->spec.drafts, 0, false);
    s->spec.drafts = 0;
  }
  step_seqs_.clear();
}

}  // namespace sala
