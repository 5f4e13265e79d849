// The engine's side of log probabilities (engine thread only): per-request progress, and the
// prompt rows of one step whose logprobs Model::forward computes as its extra rows. The row
// of position p gives the logprob of token p + 1, so each chunk of a chunked prefill reports
// its own positions, and a preempted request that recomputes its prompt reports none twice.
#pragma once
#include <functional>
#include <vector>

#include "engine/engine.h"
#include "engine/scheduler.h"

namespace sala {

struct LogprobState {
  LogprobOptions opts;
  int64_t prompt_next = 0;            // next prompt position whose logprob is due
  std::vector<TokenLogprob> pending;  // prompt positions computed, not yet emitted
};

// Entry i of a RowLogprobs computed with top_n >= want, cut to want alternatives.
TokenLogprob logprob_at(const RowLogprobs& lp, size_t i, int32_t tok, int32_t want);

class PromptLogprobRows {
 public:
  // Sequence i of `meta` is plan.items[i] (before Scheduler::commit); state_of: a sequence's
  // LogprobState. Position 0 (nothing precedes it) goes to pending at once, as NaN.
  void plan(const SchedulePlan& plan, const StepMeta& meta,
            const std::function<LogprobState&(Sequence*)>& state_of);
  RowLogprobs& rows() { return rows_; }
  // After the forward: each row's result to its request's pending list.
  void collect();

 private:
  RowLogprobs rows_;
  std::vector<LogprobState*> owner_;  // per row
};

}  // namespace sala
