// Speculative decoding (issue 21): SGLang's --speculative-algorithm NGRAM (n-gram drafts) and
// STANDALONE (a draft model, engine/draft_model.h), behind one Drafter interface.
//
// A running request (greedy, or sampled without penalties, bias or min_tokens; no grammar,
// no logprobs) whose last token is pending drafts up to k tokens: by prompt lookup, the
// tokens that followed the latest earlier occurrence of its longest suffix (ngram_draft), or
// from a draft model run autoregressively. The engine appends them to Sequence::tokens for
// one step, so the scheduler plans one call of 1 + k rows (the last token and the drafts)
// with logits for every row; a verify row computes exactly what a decode step at its
// position computes (the CPU's GEMVs per row for steps of <= 16 rows, the GLA recurrence
// below 64 rows, the per-call dense / sparse choice kept by the scheduler's chunk boundaries:
// tests/model/test_verify_rows.cpp). Row i's distribution gives the token after position i;
// the drafts are accepted while they pass (greedy: equal the argmax; sampled:
// Sampler::sample_draft with the drafter's proposal distribution q: one-hot for n-gram
// drafts, the draft model's sampling distribution for STANDALONE), and the first row that
// rejects its draft (or the one after the last draft) gives the step's last token, so greedy
// output is token for token the output without speculation and sampled output has the same
// distribution (verify_rows).
//
// Rollback: the step keeps the sequence's lightning state before it in its snapshot slot
// (Model::snapshot_state: the verify call writes the new state elsewhere, no copy). All drafts
// accepted: the caches hold exactly the kept tokens. Otherwise the state is
// restored from the snapshot and advanced over the last token and the accepted drafts from the
// verify call's own k and v rows, which the model kept (Model::rollback_state: the recurrence
// of a decode step, so the same bits); the sequence's computed length ends after the accepted
// drafts and the bonus token is pending, as after a fully accepted call. The K/V rows and
// compressed keys the rejected tokens wrote are rewritten before any query reads them. Where
// the model kept no rows (a step too large for its keep buffer, tensor parallelism) the
// computed length goes back to before the step and the next step computes those rows again
// (one call without drafts whose rows all return logits, so that it is a CUDA graph like a
// verify call). A draft model rolls its own caches back the second way (draft_model.h).
// Measured and dropped (session 18): drafting in that recompute call too (fewer steps on the
// CPU, but on the GPU no gain at concurrency 1 and ~5 % fewer tokens/s at 8 on tiny-chat).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <unordered_map>
#include <vector>

#include "engine/ngram_index.h"

namespace sala {

class Backend;
class Model;
class Sampler;
class SamplerState;
struct SamplingParams;
struct Sequence;
struct SchedulePlan;
struct ScheduledSeq;
class Scheduler;

struct SpeculativeOptions {
  int32_t num_draft_tokens = 0;  // drafts per verify step, at most; 0: no speculation
  int32_t ngram_min = 1;         // shortest suffix that may match (tokens)
  int32_t ngram_max = 4;         // longest suffix tried (NGRAM)
  // STANDALONE: drafts come from the draft model given to make_engine instead of n-grams.
  bool draft_model = false;
  // NGRAM: the j-th draft of a call is proposed only while the estimate that the first j
  // drafts all pass, P_j, is at least this (NgramDrafter); 0 drafts whenever a suffix matches.
  double ngram_min_accept = 0.05;
  bool enabled() const { return num_draft_tokens > 0; }
};

// Up to k tokens that followed the latest earlier occurrence of the longest suffix of `tokens`
// of ngram_min..ngram_max tokens (the suffix itself excluded); empty when none matches, and
// *match (when given) says how long that suffix is and whether it occurred exactly once
// before. The definition by scan: NgramDrafter drafts from an NgramIndex, tested to return
// the same.
std::vector<int32_t> ngram_draft(const std::vector<int32_t>& tokens, int32_t k,
                                 int32_t ngram_min, int32_t ngram_max,
                                 NgramMatch* match = nullptr);

// Speculative decoding keeps the output distribution of a sampled request exactly when its
// rows' distributions are the plain ones (Sampler::sample_draft: a draft drawn from q is
// accepted with probability min(1, p / q), else the token comes from max(0, p - q); for a
// one-hot q: accepted with p(draft), else drawn from the rest); greedy is the special case
// where the draft is accepted iff it is the argmax.

// A request's speculation between steps: its adaptive draft length and, during a step, the
// drafts appended to its tokens.
struct SpecState {
  int32_t draft_len = 0;  // drafts to ask for next: grows after a fully accepted step,
                          // shrinks to the accepted length + 1 after a rejection
  // Consecutive verify calls that accepted nothing, and the steps left before the next draft:
  // after the 2nd such call 1, then 2, 4, ... up to kMaxDraftPause. A verify call costs more
  // than a decode step (1.03x at B=1 with one draft on the H200), so a request whose drafts
  // never pass drafts ever more rarely: its slowdown stays well under 2 %.
  int32_t misses = 0;
  int32_t pause = 0;
  int32_t drafts = 0;     // drafts at the end of Sequence::tokens during this step
  int64_t base = 0;       // tokens.size() before the drafts were appended
  // Rolled back and not yet computed again: a call of these rows without drafts returns every
  // row's logits too (call_logit_rows), so that it is a CUDA graph like a verify call.
  bool recompute = false;
};

// Logit rows a call of the step returns, decided before the forward: none unless it samples;
// every row of a verify call (its pending token, then one per draft) and of a call of at most
// Model::kGraphMaxCallRows rows that computes rolled-back rows again (its last row samples);
// else its last row. Model::graph_step records steps whose calls return every row's logits.
int32_t call_logit_rows(const ScheduledSeq& it);

// The tokens a verify call emits, into `emit`: the drafts while accepted (greedy: equal to
// the row's argmax; sampled: Sampler::sample_draft), then one more token from the first row
// that rejected its draft, or from the last row. Returns how many drafts were accepted.
// argmax_rows: the rows' argmax when the step took it on the device (greedy-only steps), else
// null and the rows' logits [d + 1, vocab] (modified in place) decide.
// q: the drafts' proposal distributions [d, vocab], or null (one-hot: n-gram, greedy).
int32_t verify_rows(const int32_t* drafts, int32_t d, const int32_t* argmax_rows, float* logits,
                    int32_t vocab, Sampler& sampler, const SamplingParams& p, SamplerState& st,
                    std::vector<int32_t>& emit, const float* q = nullptr);

inline constexpr int32_t kMaxDraftPause = 64;
// Adapts s.draft_len (and the pause after rejected calls) to a verify step that accepted
// `accepted` of `drafted` drafts.
void adapt_draft_len(SpecState& s, int32_t drafted, int32_t accepted, int32_t max_drafts);

// What the engine says about a request, for the drafters: whether it may draft at all
// (greedy or plain sampling, no logprobs, no grammar: fixed for its life), how many drafts
// its budget allows this step, and its sampling (a draft model samples its proposals with the
// same temperature / top-k / top-p / min-p, from a stream derived from the request's seed).
struct DraftPolicy {
  bool eligible = false;
  int32_t cap = 0;  // drafts within max_new_tokens and the context, beyond the bonus token
  const SamplingParams* sampling = nullptr;
  uint64_t seed = 0;
};
using DraftPolicyFn = std::function<DraftPolicy(const Sequence&)>;

// One request that drafts this step: k tokens wanted (adaptive length, budget and the call
// boundary applied, >= 1).
struct DraftAsk {
  Sequence* seq = nullptr;
  int32_t k = 0;
  DraftPolicy policy;
};

// Where drafts come from. The engine thread calls propose() before the schedule, planned()
// after it, settle() for each sequence that had drafts (verified or not), release() when a
// sequence leaves (finished, aborted); all with the sequence's tokens without drafts except
// during propose / planned.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // out[i]: up to asks[i].k tokens to follow asks[i].seq->tokens (possibly none).
  virtual void propose(const std::vector<DraftAsk>& asks,
                       std::vector<std::vector<int32_t>>& out) = 0;
  // s's proposal distributions of its current drafts, [drafts, vocab] row-major, or null for
  // one-hot proposals (n-gram; any greedy request).
  virtual const float* proposal(const Sequence& s) const = 0;
  // After the schedule, before the forward (drafts still appended): the plan's rows and
  // preemptions (a draft model mirrors the prefill chunks and frees the preempted).
  virtual void planned(const SchedulePlan& plan, const DraftPolicyFn& policy) = 0;
  // s's `drafted` drafts of this step were verified (`verified`) and `accepted` kept, or were
  // dropped unverified (the call was not planned; accepted 0); s->tokens holds the kept tokens
  // before the bonus token.
  virtual void settle(const Sequence& s, int32_t drafted, int32_t accepted, bool verified) = 0;
  // s finished or was aborted: drop what the drafter holds for it.
  virtual void release(const Sequence& s) = 0;
  // Times the drafter's own state was rolled back (a draft model's; 0 for n-grams).
  virtual int64_t rollbacks() const = 0;
  // KV pages and state slots the drafter holds (a draft model's; 0 for n-grams).
  virtual std::pair<int64_t, int64_t> usage() const = 0;
};

// Prompt lookup: ngram_draft's drafts, from an NgramIndex per request (engine/ngram_index.h)
// so that a step does not rescan long prompts. An eligible request's prompt is indexed chunk
// by chunk as it is prefilled (planned()), so its decode steps start with a full index.
//
// How many of the found tokens to propose: a verify call whose drafts all fail costs more
// than a decode step, while on the GPU one more draft row in a call costs next to nothing. So
// the drafter estimates P_j, the chance that the first j drafts all pass, proposes j drafts
// while P_j >= min_accept, and proposes none unless their expected tokens, sum of P_j, are
// worth kVerifyCallCost decode steps. Every lookup is scored, proposed or not: the tokens the
// request goes on to produce are compared with what the lookup found ("shadow" drafts: the
// leading matches are accepted, the first mismatch tested and failed; with greedy or one-hot
// proposals a proposed draft passes exactly when the produced token equals it, so both score
// alike), at its next lookup or when it ends. From these, the drafter keeps per match m (the
// suffix length n that found the drafts, and whether that n-gram occurred once or more often
// before: NgramMatch) an engine-wide rate p(m), prior 3 of 4 and a window (counts halved past
// kMatchWindow tested). Draft i of a lookup is scored under the match it extends once the
// drafts before it passed (n + i, capped at ngram_max: chained()), and P_j is the product of
// those rates: a copy that has started goes on more surely than its first token passes. Per
// request the drafter keeps its own counts, which weigh against p(m) as kRequestPrior tested
// drafts: p = (accepted_r + kRequestPrior · p(m)) / (tested_r + kRequestPrior); a seeded
// sampled request's against the prior 3 of 4 instead, so that its tokens do not depend on
// other requests. On tiny-chat (the greedy outputs; every lookup's first draft) unique 1-token
// matches passed 33 % of the time, repeated ones 1 %, 2-token matches 89 %: the copy questions'
// first lookup (a unique word of the prompt) drafts the whole copy, the arithmetic questions'
// digits draft nothing, and the engine-wide rates follow a change of workload without
// proposing drafts to measure it.
class NgramDrafter final : public Drafter {
 public:
  static constexpr double kMatchWindow = 256;
  static constexpr double kRequestPrior = 4;
  // p(n)'s prior: kPriorAccepted of kPriorTested (optimistic until measured).
  static constexpr double kPriorAccepted = 3, kPriorTested = 4;

  // A verify call costs this much more than a decode step, in decode steps (H200, bf16, B=1,
  // k = 4: 1.05x on the 9B, 1.19x on tiny-chat's model): a call is proposed when the tokens
  // its drafts are expected to add (sum of P_j) at least pay for it.
  static constexpr double kVerifyCallCost = 0.2;

  NgramDrafter(int32_t ngram_min, int32_t ngram_max, double min_accept)
      : min_(ngram_min), max_(ngram_max), min_accept_(min_accept),
        by_match_(2 * (size_t(ngram_max) + 1)) {}
  void propose(const std::vector<DraftAsk>& asks, std::vector<std::vector<int32_t>>& out) override;
  const float* proposal(const Sequence&) const override { return nullptr; }
  void planned(const SchedulePlan& plan, const DraftPolicyFn& policy) override;
  void settle(const Sequence& s, int32_t drafted, int32_t accepted, bool verified) override;
  void release(const Sequence& s) override;
  int64_t rollbacks() const override { return 0; }
  std::pair<int64_t, int64_t> usage() const override { return {0, 0}; }
  size_t num_indexes() const { return requests_.size(); }
  // s's index (null: none yet).
  const NgramIndex* index(const Sequence& s) const;
  // The engine-wide acceptance estimate p(m) of drafts found by a suffix match m (its length,
  // unique or repeated).
  double accept_rate(NgramMatch m) const;
  // s's estimate for drafts found by match m: its own counts against p(m), or against the
  // prior alone (own_only: seeded sampled requests, whose drafts decide how their random
  // stream is used, so must not depend on what else runs).
  double request_accept_rate(const Sequence& s, NgramMatch m, bool own_only = false) const;
  // The match draft i (0-based) of a lookup with match m extends once drafts 0..i-1 passed.
  NgramMatch chained(NgramMatch m, int32_t i) const;

 private:
  struct Counts {
    double tested = 0, accepted = 0;
  };
  struct PerRequest {
    explicit PerRequest(NgramIndex i) : index(std::move(i)) {}
    NgramIndex index;
    std::vector<int32_t> shadow;  // the last lookup's tokens, proposed or not
    int64_t shadow_at = 0;        // where shadow[0] goes in the request's tokens
    NgramMatch shadow_match;      // its match
    Counts counts;                // this request's scored drafts
  };
  PerRequest& request(const Sequence& s);
  // Scores r's shadow drafts against the tokens s produced since (clearing them).
  void score(PerRequest& r, const std::vector<int32_t>& tokens);
  Counts& counts(NgramMatch m);

  int32_t min_, max_;
  double min_accept_;
  std::unordered_map<uint64_t, PerRequest> requests_;  // by Sequence::id
  std::vector<Counts> by_match_;  // [2 * match length + unique]
};

// The engine thread's side of speculation, one step at a time: draft() before the schedule,
// planned() after it, settle() for each verified sequence after the forward and the
// scheduler's commit, end_step() last.
class Speculator {
 public:
  // snapshot_offset: a request's snapshot state slot is its slot + snapshot_offset.
  // drafter: NgramDrafter or a draft model (null: n-grams with opts' window sizes).
  Speculator(const SpeculativeOptions& opts, int32_t snapshot_offset,
             std::unique_ptr<Drafter> drafter, DraftPolicyFn policy);
  bool enabled() const { return opts_.enabled(); }

  // Appends up to min(draft_len, policy cap) drafts to every running eligible sequence whose
  // last token is pending, no more than the scheduler plans in one call with the last token.
  void draft(const std::vector<Sequence*>& running, const Scheduler& sch);
  // After the schedule: copies the state of every planned drafted sequence that will verify to
  // its snapshot slot, and tells the drafter the plan.
  void planned(const SchedulePlan& plan, Model& model);
  // A verified sequence after the forward and the scheduler's commit, whose first `accepted`
  // drafts were kept (the caller decided them from its rows, greedy or by speculative
  // sampling, and emits them and the bonus token): removes the drafts from its tokens, keeps
  // the accepted ones' cache rows or rolls back.
  void settle(Sequence& s, int32_t accepted, Model& model);
  // s's drafts' proposal distributions (Drafter::proposal).
  const float* proposal(const Sequence& s) const { return drafter_->proposal(s); }
  // Drops the drafts of sequences that were not verified this step (not planned, preempted).
  void end_step();
  // s is finished and freed during the step: no end_step for it; the drafter lets it go.
  void forget(const Sequence* s);

  int64_t drafted_tokens() const { return drafted_; }
  int64_t accepted_tokens() const { return accepted_; }
  int64_t verify_calls() const { return verifies_; }
  int64_t rollbacks() const { return rollbacks_; }  // verify calls that rejected a draft
  int64_t drafter_rollbacks() const { return drafter_->rollbacks(); }
  std::pair<int64_t, int64_t> drafter_usage() const { return drafter_->usage(); }

 private:
  SpeculativeOptions opts_;
  int32_t snapshot_offset_;
  std::unique_ptr<Drafter> drafter_;
  DraftPolicyFn policy_;
  std::vector<Sequence*> step_seqs_;  // this step's sequences with drafts
  std::vector<DraftAsk> asks_;
  std::vector<std::vector<int32_t>> proposed_;
  int64_t drafted_ = 0, accepted_ = 0, verifies_ = 0, rollbacks_ = 0;
};

}  // namespace sala
