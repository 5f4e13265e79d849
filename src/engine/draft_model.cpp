#include "engine/draft_model.h"

#include <algorithm>

#include "core/check.h"
#include "core/error.h"
#include "engine/scheduler.h"

namespace sala {
namespace {

bool greedy(const DraftPolicy& pol) {
  return pol.sampling->temperature <= 0.0f || pol.sampling->top_k == 1;
}

}  // namespace

DraftModelDrafter::DraftModelDrafter(std::unique_ptr<Model> model, bool dense_as_sparse)
    : model_(std::move(model)), dense_as_sparse_(dense_as_sparse),
      vocab_(model_->config().vocab_size),
      blocks_(model_->limits().caches.num_pages, model_->limits().caches.page_size),
      states_(model_->limits().caches.num_slots / 2),
      snapshot_offset_(model_->limits().caches.num_slots / 2) {
  SALA_CHECK(snapshot_offset_ > 0 && model_->limits().max_logit_rows > 0,
             "draft model limits: {} state slots, {} logit rows",
             model_->limits().caches.num_slots, model_->limits().max_logit_rows);
}

DraftModelDrafter::Seq* DraftModelDrafter::acquire(const Sequence& s, const DraftPolicy& pol) {
  auto it = seqs_.find(s.id);
  if (it != seqs_.end()) return &it->second;
  const int32_t slot = states_.acquire();
  if (slot < 0) return nullptr;
  Seq& d = seqs_[s.id];
  d.slot = slot;
  d.sampled = !greedy(pol);
  if (d.sampled) {
    // A stream of its own, derived from the request's seed: the proposals neither consume nor
    // depend on the request's stream, and the same seed gives the same run.
    SamplingParams p = *pol.sampling;
    p.seed = pol.seed ^ 0x9e3779b97f4a7c15ULL;
    d.rng.init(p, {}, vocab_);
  }
  return &d;
}

void DraftModelDrafter::release(const Sequence& s) {
  auto it = seqs_.find(s.id);
  if (it == seqs_.end()) return;
  blocks_.release(it->second.pages);
  states_.release(it->second.slot);
  seqs_.erase(it);
}

int64_t DraftModelDrafter::computed(const Sequence& s) const {
  auto it = seqs_.find(s.id);
  return it == seqs_.end() ? -1 : it->second.computed;
}

const float* DraftModelDrafter::proposal(const Sequence& s) const {
  auto it = seqs_.find(s.id);
  if (it == seqs_.end() || !it->second.sampled || it->second.drafted == 0) return nullptr;
  return it->second.q.data();
}

void DraftModelDrafter::forward(bool greedy_only) {
  meta_.dense_as_sparse = dense_as_sparse_;
  model_->forward(meta_, logits_, nullptr, greedy_only ? &argmax_ : nullptr);
}

int32_t DraftModelDrafter::pick(float* row, int32_t am, const DraftPolicy& pol, Seq& d,
                                int32_t j) {
  if (!d.sampled) return am;
  return sampler_.sample_proposal(row, vocab_, *pol.sampling, d.rng,
                                  d.q.data() + size_t(j) * size_t(vocab_));
}

void DraftModelDrafter::propose(const std::vector<DraftAsk>& asks,
                                std::vector<std::vector<int32_t>>& out) {
  out.assign(asks.size(), {});
  const ModelLimits& lim = model_->limits();
  // Call 1: each drafting sequence's rows since its last computed token, through its pending
  // token L - 1 (1 + the accepted drafts and bonus after a rollback, else 1 or 2), one logit
  // row each; none for a sequence that computed its pending token in a draft step whose
  // verify call was not planned (its row is kept: last_row). A sequence whose rows, logit row
  // or pages do not fit drafts nothing this step (planned() still feeds it the target's rows).
  meta_ = StepMeta{};
  jobs_.clear();
  int64_t budget = lim.max_step_tokens;
  int32_t rows_out = 0;
  bool greedy_only = true;
  for (size_t i = 0; i < asks.size(); ++i) {
    const Sequence& s = *asks[i].seq;
    const int64_t L = int64_t(s.tokens.size());
    if (rows_out >= lim.max_logit_rows) break;
    Seq* d = acquire(s, asks[i].policy);
    if (!d) continue;
    SALA_CHECK(d->drafted == 0 && (d->computed < L || d->last_len == L),
               "draft state of sequence {}: {} computed of {} tokens, {} drafts out", s.id,
               d->computed, L, d->drafted);
    const int64_t rows = L - d->computed;
    if (rows > budget || !blocks_.ensure(d->pages, L + asks[i].k - 1)) continue;
    int32_t row = -1;
    if (rows > 0) {
      meta_.add_seq(s.tokens.data() + d->computed, int32_t(rows), d->computed, d->slot,
                    d->pages, false, true);
      budget -= rows;
      row = rows_out++;
      greedy_only = greedy_only && greedy(asks[i].policy);
    }
    jobs_.push_back({i, d, row});
  }
  if (rows_out > 0) forward(greedy_only);
  for (const Job& job : jobs_) {
    if (job.row < 0) continue;
    Seq& d = *job.d;
    d.last_len = int64_t(asks[job.ask].seq->tokens.size());
    float* row = greedy_only ? nullptr : logits_.data() + size_t(job.row) * size_t(vocab_);
    d.last_argmax = greedy_only ? argmax_[size_t(job.row)] : argmax(row, vocab_);
    if (d.sampled) d.last_row.assign(row, row + vocab_);
  }
  int32_t kmax = 0;
  for (const Job& job : jobs_) {
    const DraftAsk& a = asks[job.ask];
    Seq& d = *job.d;
    d.computed = d.base = int64_t(a.seq->tokens.size());
    // The state after L tokens: what a rejection of any fed draft returns to (nothing is fed
    // after a single draft). Kept by call 2 below, which this sequence is in (no copy).
    if (a.k > 1) model_->snapshot_state(d.slot, d.slot + snapshot_offset_);
    if (d.sampled) d.q.resize(size_t(a.k) * size_t(vocab_));
    scratch_.assign(d.last_row.begin(), d.last_row.end());  // sample_proposal works in place
    out[job.ask].push_back(pick(scratch_.data(), d.last_argmax, a.policy, d, 0));
    d.drafted = 1;
    kmax = std::max(kmax, a.k);
  }
  // Calls 2..k: the previous draft of every sequence that wants more, one row each.
  for (int32_t j = 1; j < kmax; ++j) {
    meta_ = StepMeta{};
    greedy_only = true;
    size_t n = 0;
    for (Job& job : jobs_) {
      const DraftAsk& a = asks[job.ask];
      if (a.k <= j) continue;
      Seq& d = *job.d;
      meta_.add_seq(&out[job.ask].back(), 1, d.computed, d.slot, d.pages, false, true);
      greedy_only = greedy_only && greedy(a.policy);
      jobs_[n] = job;  // compacted: row n of this call
      jobs_[n].row = int32_t(n);
      ++n;
    }
    jobs_.resize(n);
    forward(greedy_only);
    for (const Job& job : jobs_) {
      Seq& d = *job.d;
      ++d.computed;
      const size_t r = size_t(job.row);
      float* row = greedy_only ? nullptr : logits_.data() + r * size_t(vocab_);
      const int32_t am = greedy_only ? argmax_[r] : argmax(row, vocab_);
      out[job.ask].push_back(pick(row, am, asks[job.ask].policy, d, j));
      ++d.drafted;
    }
  }
}

void DraftModelDrafter::settle(const Sequence& s, int32_t drafted, int32_t accepted, bool) {
  auto it = seqs_.find(s.id);
  if (it == seqs_.end() || it->second.drafted == 0) return;  // released (preempted)
  Seq& d = it->second;
  SALA_CHECK(drafted == d.drafted && accepted >= 0 && accepted <= drafted,
             "sequence {}: {} of {} drafts settled, the draft model made {}", s.id, accepted,
             drafted, d.drafted);
  const int32_t fed = d.drafted - 1;  // drafts 1 .. k - 1 went through the draft model
  if (accepted >= fed) {
    d.computed = d.base + fed;  // every fed row is a kept token
  } else {
    model_->copy_state_slot(d.slot + snapshot_offset_, d.slot);
    d.computed = d.base;
    ++rollbacks_;
  }
  d.drafted = 0;
}

void DraftModelDrafter::planned(const SchedulePlan& plan, const DraftPolicyFn& policy) {
  for (const Sequence* s : plan.preempted) release(*s);
  // One call with the target's rows of every eligible non-verify item (and any rows the draft
  // model lags behind them), no logits: up to the draft model's step budget; what does not fit
  // waits (the next step's rows or draft call catch up).
  meta_ = StepMeta{};
  int64_t budget = model_->limits().max_step_tokens;
  fed_.clear();
  for (const ScheduledSeq& it : plan.items) {
    const Sequence& s = *it.seq;
    if (s.spec.drafts > 0) continue;  // a verify call: its rows were fed while drafting
    const DraftPolicy pol = policy(s);
    if (!pol.eligible) continue;
    Seq* d = acquire(s, pol);
    if (!d) continue;
    const int64_t end = s.num_computed + it.num_tokens;
    const int64_t rows = std::min(end - d->computed, budget);
    if (rows <= 0 || !blocks_.ensure(d->pages, d->computed + rows)) continue;
    meta_.add_seq(s.tokens.data() + d->computed, int32_t(rows), d->computed, d->slot, d->pages,
                  false, false);
    budget -= rows;
    fed_.push_back({d, rows});
  }
  if (fed_.empty()) return;
  forward(false);
  for (auto& [d, rows] : fed_) d->computed += rows;
}

std::unique_ptr<Drafter> make_drafter(const SpeculativeOptions& opts, std::unique_ptr<Model> draft,
                                      const ModelConfig& target, bool dense_as_sparse) {
  if (opts.draft_model != (draft != nullptr))
    fail("speculative decoding: {}", draft ? "a draft model is given but the algorithm is not "
                                             "STANDALONE"
                                           : "STANDALONE needs a draft model");
  if (!draft) return nullptr;
  if (draft->config().vocab_size != target.vocab_size)
    fail("the draft model's vocabulary has {} tokens, the target's {}",
         draft->config().vocab_size, target.vocab_size);
  return std::make_unique<DraftModelDrafter>(std::move(draft), dense_as_sparse);
}

}  // namespace sala
