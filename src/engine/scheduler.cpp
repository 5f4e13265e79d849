#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace sala {

Scheduler::Scheduler(const SchedulerOptions& opts, BlockPool& blocks, StatePool& states)
    : opts_(opts), blocks_(blocks), states_(states) {
  SALA_CHECK(opts_.max_running_requests > 0 && opts_.chunked_prefill_size > 0 &&
                 opts_.max_step_tokens > 0,
             "scheduler limits must be positive");
  running_.reserve(size_t(opts_.max_running_requests));
}

void Scheduler::add(Sequence* s) {
  SALA_CHECK(!s->tokens.empty() && s->pages.empty() && s->slot < 0 && !s->running);
  s->num_computed = 0;
  if (s->prompt_len <= 0) s->prompt_len = int64_t(s->tokens.size());
  waiting_.push_back(s);
}

void Scheduler::free_resources(Sequence* s) {
  blocks_.release(s->pages);
  if (s->slot >= 0) states_.release(s->slot);
  s->slot = -1;
  s->running = false;
}

void Scheduler::remove(Sequence* s) {
  if (s->running) {
    auto it = std::find(running_.begin(), running_.end(), s);
    SALA_CHECK(it != running_.end());
    running_.erase(it);
  } else {
    auto it = std::find(waiting_.begin(), waiting_.end(), s);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  free_resources(s);
}

void Scheduler::preempt(Sequence* s, SchedulePlan& plan) {
  auto it = std::find(running_.begin(), running_.end(), s);
  SALA_CHECK(it != running_.end());
  running_.erase(it);
  free_resources(s);
  s->num_computed = 0;  // recompute prompt + generated tokens from scratch
  ++s->num_preemptions;
  ++preemptions_;
  waiting_.push_front(s);
  plan.preempted.push_back(s);
}

int64_t Scheduler::chunk_end(const Sequence& s) const {
  const int64_t at = s.num_computed, len = int64_t(s.tokens.size());
  const int64_t c = opts_.chunked_prefill_size;
  int64_t end = std::min(len, (at / c + 1) * c);
  if (at < s.prompt_len)
    end = std::min(end, s.prompt_len);
  else if (at < int64_t(opts_.dense_len) - 1)
    end = std::min<int64_t>(end, opts_.dense_len - 1);
  return end;
}

void Scheduler::schedule(SchedulePlan& plan) {
  plan.clear();
  int64_t budget = opts_.max_step_tokens;

  // 1. Running sequences, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i];
    const int64_t end = chunk_end(*s);
    const int64_t n = end - s->num_computed;
    SALA_CHECK(n >= 1, "running sequence {} has nothing to compute", s->id);
    if (n > budget) continue;  // waits for a step with room for its whole chunk
    bool ok = blocks_.ensure(s->pages, end);
    while (!ok) {
      Sequence* victim = running_.back();
      if (victim == s) {
        if (running_.size() == 1) {
          plan.out_of_memory.push_back(s);  // the engine finishes it
        } else {
          preempt(s, plan);
        }
        break;
      }
      preempt(victim, plan);
      ok = blocks_.ensure(s->pages, end);
    }
    if (!ok) break;  // s was the newest: nothing after it is left
    plan.items.push_back({s, int32_t(n), end == int64_t(s->tokens.size())});
    plan.num_tokens += int32_t(n);
    budget -= n;
  }

  // 2. Admission in FIFO order; never right after a preemption (it would thrash).
  if (!plan.preempted.empty()) return;
  int64_t reserved = 0;  // pages that running prefills will still take
  for (Sequence* s : running_)
    if (s->pending() > 1) reserved += blocks_.missing(s->pages, int64_t(s->tokens.size()) + 1);
  while (!waiting_.empty() && budget > 0 &&
         int32_t(running_.size()) < opts_.max_running_requests && states_.free_count() > 0) {
    Sequence* s = waiting_.front();
    const int64_t len = int64_t(s->tokens.size());
    const int64_t need =
        std::min<int64_t>(blocks_.pages_for(len + 1), blocks_.total());  // prefill + 1 decode
    if (need > blocks_.total() - blocks_.used() - reserved) {
      if (running_.empty() && blocks_.pages_for(len) > blocks_.total()) {
        waiting_.pop_front();  // can never run (the engine validates prompts; be safe)
        plan.out_of_memory.push_back(s);
        continue;
      }
      break;
    }
    s->num_computed = 0;
    const int64_t end = chunk_end(*s);
    if (end > budget) break;  // FIFO: the head waits for a step with room
    SALA_CHECK(blocks_.ensure(s->pages, end));
    s->slot = states_.acquire();
    SALA_CHECK(s->slot >= 0);
    s->running = true;
    waiting_.pop_front();
    running_.push_back(s);
    reserved += blocks_.missing(s->pages, len + 1);
    plan.items.push_back({s, int32_t(end), end == len});
    plan.num_tokens += int32_t(end);
    budget -= end;
  }
}

void Scheduler::commit(const SchedulePlan& plan) {
  for (const ScheduledSeq& it : plan.items) {
    it.seq->num_computed += it.num_tokens;
    SALA_CHECK(it.seq->num_computed <= int64_t(it.seq->tokens.size()));
  }
}

}  // namespace sala
