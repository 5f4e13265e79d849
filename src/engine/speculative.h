// Speculative decoding with n-gram drafts (issue 21; SGLang's --speculative-algorithm NGRAM).
//
// A running request (greedy, or sampled without penalties, bias or min_tokens; no grammar,
// no logprobs) whose last token is pending drafts up to k tokens by prompt
// lookup: the tokens that followed the latest earlier occurrence of its longest suffix
// (ngram_draft). The engine appends them to Sequence::tokens for one step, so the scheduler
// plans one call of 1 + k rows (the last token and the drafts) with logits for every row; a
// verify row computes exactly what a decode step at its position computes (the CPU's GEMVs
// per row for steps of <= 16 rows, the GLA recurrence below 64 rows, the per-call dense /
// sparse choice kept by the scheduler's chunk boundaries: tests/model/test_verify_rows.cpp).
// Row i's distribution gives the token after position i; the drafts are accepted while they
// pass (greedy: equal the argmax; sampled: Sampler::sample_draft), and the first row that
// rejects its draft (or the one after the last draft) gives the step's last token, so greedy
// output is token for token the output without speculation and sampled output has the same
// distribution (verify_rows).
//
// Rollback: before the step the engine copies the sequence's lightning state to its snapshot
// slot. All drafts accepted: the caches hold exactly the kept tokens. Otherwise the state is
// restored from the snapshot and the sequence's computed length set back to before the step,
// so the next step computes the last token and the accepted drafts again (one call: rows are
// nearly free where a step streams its weights) together with its next drafts; the K/V rows
// and compressed keys the rejected tokens wrote are rewritten before any query reads them.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace sala {

class Backend;
class Sampler;
class SamplerState;
struct SamplingParams;
struct Sequence;
struct SchedulePlan;
class Scheduler;

struct SpeculativeOptions {
  int32_t num_draft_tokens = 0;  // drafts per verify step, at most; 0: no speculation
  int32_t ngram_min = 1;         // shortest suffix that may match (tokens)
  int32_t ngram_max = 4;         // longest suffix tried
  bool enabled() const { return num_draft_tokens > 0; }
};

// Up to k tokens that followed the latest earlier occurrence of the longest suffix of `tokens`
// of ngram_min..ngram_max tokens (the suffix itself excluded); empty when none matches.
std::vector<int32_t> ngram_draft(const std::vector<int32_t>& tokens, int32_t k,
                                 int32_t ngram_min, int32_t ngram_max);

// Speculative decoding keeps the output distribution of a sampled request exactly when its
// rows' distributions are the plain ones (Sampler::sample_draft: a one-hot draft is accepted
// with its probability, else the token comes from the rest); greedy is the special case
// where the draft is accepted iff it is the argmax.

// A request's speculation between steps: its adaptive draft length and, during a step, the
// drafts appended to its tokens.
struct SpecState {
  int32_t draft_len = 0;  // drafts to ask for next: grows after a fully accepted step,
                          // shrinks to the accepted length + 1 after a rejection
  int32_t drafts = 0;     // drafts at the end of Sequence::tokens during this step
  int64_t base = 0;       // tokens.size() before the drafts were appended
};

// The tokens a verify call emits, into `emit`: the drafts while accepted (greedy: equal to
// the row's argmax; sampled: Sampler::sample_draft), then one more token from the first row
// that rejected its draft, or from the last row. Returns how many drafts were accepted.
// argmax_rows: the rows' argmax when the step took it on the device (greedy-only steps), else
// null and the rows' logits [d + 1, vocab] (modified in place) decide.
int32_t verify_rows(const int32_t* drafts, int32_t d, const int32_t* argmax_rows, float* logits,
                    int32_t vocab, Sampler& sampler, const SamplingParams& p, SamplerState& st,
                    std::vector<int32_t>& emit);

// Adapts s.draft_len to a verify step that accepted `accepted` of `drafted` drafts.
void adapt_draft_len(SpecState& s, int32_t drafted, int32_t accepted, int32_t max_drafts);

// The engine thread's side of speculation, one step at a time: draft() before the schedule,
// snapshot() after it, resolve() for each verified sequence after the forward and the
// scheduler's commit, end_step() last.
class Speculator {
 public:
  // snapshot_offset: a request's snapshot state slot is its slot + snapshot_offset.
  Speculator(const SpeculativeOptions& opts, int32_t snapshot_offset)
      : opts_(opts), snapshot_offset_(opts.enabled() ? snapshot_offset : 0) {}
  bool enabled() const { return opts_.enabled(); }

  // Appends up to min(draft_len, cap(s)) n-gram drafts to every running sequence whose last
  // token is pending and whose cap is > 0 (the caller's eligibility and budget: greedy
  // requests only, drafts within max_new_tokens and the context), trimmed so that the
  // scheduler plans them in one call.
  void draft(const std::vector<Sequence*>& running, const Scheduler& sch,
             const std::function<int32_t(const Sequence&)>& cap);
  // Copies the state of every planned drafted sequence that will verify to its snapshot slot.
  void snapshot(const SchedulePlan& plan, Backend& be);
  // A verified sequence after the forward and the scheduler's commit, whose first `accepted`
  // drafts were kept (the caller decided them from its rows, greedy or by speculative
  // sampling, and emits them and the bonus token): removes the drafts from its tokens, keeps
  // the accepted ones' cache rows or rolls back.
  void settle(Sequence& s, int32_t accepted, Backend& be);
  // Drops the drafts of sequences that were not verified this step (not planned, preempted).
  void end_step();
  // s is finished and freed during the step: no end_step for it.
  void forget(const Sequence* s) { std::erase(step_seqs_, s); }

  int64_t drafted_tokens() const { return drafted_; }
  int64_t accepted_tokens() const { return accepted_; }
  int64_t verify_calls() const { return verifies_; }

 private:
  SpeculativeOptions opts_;
  int32_t snapshot_offset_;
  std::vector<Sequence*> step_seqs_;  // this step's sequences with drafts
  int64_t drafted_ = 0, accepted_ = 0, verifies_ = 0;
};

}  // namespace sala
