#include "engine/step_logprobs.h"

#include <algorithm>
#include <cstddef>
#include <limits>

namespace sala {

TokenLogprob logprob_at(const RowLogprobs& lp, size_t i, int32_t tok, int32_t want) {
  TokenLogprob t;
  t.token = tok;
  t.logprob = lp.logprob[i];
  const auto b = std::ptrdiff_t(i * size_t(lp.top_n)), e = b + std::ptrdiff_t(want);
  t.top_ids.assign(lp.top_ids.begin() + b, lp.top_ids.begin() + e);
  t.top_logprobs.assign(lp.top_logprobs.begin() + b, lp.top_logprobs.begin() + e);
  return t;
}

void PromptLogprobRows::plan(const SchedulePlan& plan, const StepMeta& meta,
                             const std::function<LogprobState&(Sequence*)>& state_of) {
  rows_.clear();
  owner_.clear();
  for (size_t i = 0; i < plan.items.size(); ++i) {
    Sequence* s = plan.items[i].seq;
    LogprobState& st = state_of(s);
    if (st.opts.prompt_start < 0) continue;
    if (st.prompt_next == 0) {
      TokenLogprob t;
      t.token = s->tokens[0];
      t.logprob = std::numeric_limits<float>::quiet_NaN();
      st.pending.push_back(std::move(t));
      st.prompt_next = 1;
    }
    const int64_t a = s->num_computed, end = a + plan.items[i].num_tokens;
    for (int64_t q = std::max(st.prompt_next, a + 1); q <= end && q < s->prompt_len; ++q) {
      rows_.rows.push_back(meta.seqs[i].token_begin + int32_t(q - 1 - a));
      rows_.targets.push_back(s->tokens[size_t(q)]);
      rows_.top_n = std::max(rows_.top_n, st.opts.top_n);
      owner_.push_back(&st);
    }
  }
}

void PromptLogprobRows::collect() {
  for (size_t i = 0; i < owner_.size(); ++i) {
    owner_[i]->pending.push_back(logprob_at(rows_, i, rows_.targets[i], owner_[i]->opts.top_n));
    ++owner_[i]->prompt_next;
  }
}

}  // namespace sala
