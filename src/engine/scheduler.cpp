#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"
#include "core/error.h"

namespace sala {

SchedulePolicy parse_schedule_policy(const std::string& name) {
  if (name == "fcfs") return SchedulePolicy::Fcfs;
  if (name == "fair") return SchedulePolicy::Fair;
  fail("unknown schedule policy '{}' (fcfs | fair)", name);
}

const char* schedule_policy_name(SchedulePolicy p) {
  return p == SchedulePolicy::Fcfs ? "fcfs" : "fair";
}

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
  s->last_step = step_;  // as if served in the last step: ties with work running now
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
  ++step_;
  if (opts_.policy == SchedulePolicy::Fcfs)
    schedule_fcfs(plan);
  else
    schedule_fair(plan);
  for (const ScheduledSeq& it : plan.items) it.seq->last_step = step_;
}

bool Scheduler::grow(Sequence* s, int64_t end, SchedulePlan& plan, int64_t& budget) {
  while (!blocks_.ensure(s->pages, end)) {
    Sequence* victim = running_.back();
    if (victim == s) {
      if (running_.size() == 1) {
        plan.out_of_memory.push_back(s);  // the engine finishes it
      } else {
        preempt(s, plan);
      }
      return false;
    }
    for (auto it = plan.items.begin(); it != plan.items.end(); ++it) {
      if (it->seq != victim) continue;
      budget += it->num_tokens;
      plan.num_tokens -= it->num_tokens;
      plan.items.erase(it);
      victim->last_step = step_ - 1;  // it lost this step's rows: not "served" now
      break;
    }
    preempt(victim, plan);
  }
  return true;
}

int64_t Scheduler::reserved_pages() const {
  int64_t reserved = 0;
  for (const Sequence* s : running_) {
    const int64_t len = int64_t(s->tokens.size());
    if (s->pending() > 1 || s->num_computed == 0)
      reserved += blocks_.missing(s->pages, len + 1);
    else if (s->last_step != step_)
      reserved += blocks_.missing(s->pages, len);
  }
  return reserved;
}

void Scheduler::admit(Sequence* s, int64_t end, SchedulePlan& plan, int64_t& budget) {
  SALA_CHECK(blocks_.ensure(s->pages, end));
  s->slot = states_.acquire();
  SALA_CHECK(s->slot >= 0);
  s->running = true;
  s->last_step = step_;
  running_.push_back(s);
  plan.items.push_back({s, int32_t(end), end == int64_t(s->tokens.size())});
  plan.num_tokens += int32_t(end);
  budget -= end;
}

void Scheduler::schedule_fcfs(SchedulePlan& plan) {
  int64_t budget = opts_.max_step_tokens;

  // 1. Running sequences, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i];
    const int64_t end = chunk_end(*s);
    const int64_t n = end - s->num_computed;
    SALA_CHECK(n >= 1, "running sequence {} has nothing to compute", s->id);
    if (n > budget) continue;  // waits for a step with room for its whole chunk
    if (!grow(s, end, plan, budget)) break;  // s was the newest: nothing after it is left
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
    waiting_.pop_front();
    admit(s, end, plan, budget);
    reserved += blocks_.missing(s->pages, len + 1);
  }
}

void Scheduler::schedule_fair(SchedulePlan& plan) {
  int64_t budget = opts_.max_step_tokens;
  // A prompt the whole pool cannot hold can never run (the engine validates prompts; be safe).
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (blocks_.pages_for(int64_t((*it)->tokens.size())) > blocks_.total()) {
      plan.out_of_memory.push_back(*it);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }

  candidates_.clear();
  queued_pages_.clear();
  for (Sequence* s : running_) {
    const int64_t n = chunk_end(*s) - s->num_computed;
    SALA_CHECK(n >= 1, "running sequence {} has nothing to compute", s->id);
    candidates_.push_back({s, n, -1});
  }
  for (Sequence* s : waiting_) {
    s->num_computed = 0;
    const int64_t len = int64_t(s->tokens.size());
    candidates_.push_back({s, chunk_end(*s), int64_t(queued_pages_.size())});
    queued_pages_.push_back(std::min<int64_t>(blocks_.pages_for(len + 1), blocks_.total()));
  }
  std::stable_sort(candidates_.begin(), candidates_.end(),
                   [](const Candidate& a, const Candidate& b) {
                     if (a.seq->last_step != b.seq->last_step)
                       return a.seq->last_step < b.seq->last_step;
                     return a.rows < b.rows;
                   });

  bool admitted = false;
  for (const Candidate& c : candidates_) {
    if (budget <= 0) break;
    Sequence* s = c.seq;
    if (c.rows > budget) continue;  // keeps its place: least recently served next step
    if (c.queue_index < 0) {
      if (!s->running) continue;  // preempted earlier in this step
      const int64_t end = s->num_computed + c.rows;
      SALA_CHECK(!admitted || blocks_.free_count() >= blocks_.missing(s->pages, end),
                 "an admission took the pages of running sequence {}", s->id);
      if (!grow(s, end, plan, budget)) continue;
      plan.items.push_back({s, int32_t(c.rows), end == int64_t(s->tokens.size())});
      plan.num_tokens += int32_t(c.rows);
      budget -= c.rows;
      s->last_step = step_;  // planned: its decode row no longer needs a reserve
      continue;
    }
    // Admission: never right after a preemption (it would thrash).
    if (!plan.preempted.empty() || int32_t(running_.size()) >= opts_.max_running_requests ||
        states_.free_count() == 0)
      continue;
    int64_t ahead = 0;  // pages of those queued ahead and not admitted: they keep first claim
    for (int64_t q = 0; q < c.queue_index; ++q)
      if (!waiting_[size_t(q)]->running) ahead += queued_pages_[size_t(q)];
    if (ahead + queued_pages_[size_t(c.queue_index)] >
        blocks_.total() - blocks_.used() - reserved_pages())
      continue;
    admit(s, c.rows, plan, budget);
    admitted = true;
  }
  if (admitted)
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                  [](const Sequence* s) { return s->running; }),
                   waiting_.end());
}

void Scheduler::commit(const SchedulePlan& plan) {
  for (const ScheduledSeq& it : plan.items) {
    it.seq->num_computed += it.num_tokens;
    SALA_CHECK(it.seq->num_computed <= int64_t(it.seq->tokens.size()));
  }
}

}  // namespace sala
