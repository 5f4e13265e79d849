// Host-side scheduling policy, independent of the model (unit-tested without one).
//
// A Sequence knows all its tokens (prompt + generated so far) and how many of them are in
// the caches (num_computed). Each step feeds tokens[num_computed, num_computed + n): a
// prefill chunk when more than one token is pending, a decode row when exactly one is (the
// last sampled token). When a chunk reaches the end of the known tokens, its last row is
// sampled. A preempted sequence loses its pages and slot and restarts at num_computed 0:
// its prompt plus generated tokens are simply recomputed; nothing is emitted twice.
//
// Chunk boundaries are a function of the sequence alone, never of the batch, the step budget
// or free memory: the model's dense / sparse choice depends on where a call ends (a call
// whose sequence reaches dense_len uses sparse attention for all its rows), so other
// boundaries would change the tokens. Prefill chunks end at multiples of
// chunked_prefill_size and at the prompt's end; a recompute after preemption also ends a
// chunk at dense_len - 1 when its generated tokens begin below it, so every position is
// computed dense or sparse exactly as in the uninterrupted run.
//
// Policy of one step (schedule()), SchedulerOptions::policy:
// fcfs (first come, first served; the old default):
//  1. Running sequences, oldest first, each get their next decode row or prefill chunk if
//     it fits in what is left of max_step_tokens (else they wait a step). A sequence that
//     needs pages the pool lacks preempts the newest running sequence (possibly itself)
//     until the pages fit. The only running sequence that still cannot grow is reported in
//     `out_of_memory` (the engine finishes it: the KV pool is its context limit).
//  2. Waiting sequences are admitted in FIFO order (no skipping) while a state slot, the
//     running limit and the step budget allow and the free pages, less what running
//     prefills still need, hold the whole pending prefill plus one decode token. Admission
//     never preempts.
//  A running chunk thus goes before any newcomer: while a long prompt prefills (a full chunk
//  takes the budget but for one decode row per running request), a short request waits for
//  all of it.
// fair (the default): the same rules for pages, preemption, slots and admission, but the work
// of the step (running sequences' next rows and waiting sequences' first chunks together) is
// taken least recently served first (Sequence::last_step: the last step that gave it rows,
// or for a new arrival the step before it arrived), then smallest chunk first, then age; work
// that does not fit the budget left waits and keeps its place. So a short request arriving
// beside a long prefill runs in the next step (its chunk is smaller than the long one's at
// equal last_step) and the long chunk goes the step after (it is then the least recently
// served): a short request waits at most about one chunk time, the long prompt at most one
// step per step it is given. The budget is the only thing skipped for: a waiting sequence is
// admitted only if the pages of every sequence queued ahead of it still fit as well (no one is
// starved of memory by later arrivals); a running sequence's unplanned row keeps its pages in
// reserve, so admissions never force a preemption within the step, and a preemption (only
// ever before the first admission) ends admission for the step, as in fcfs.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "engine/block_pool.h"
#include "engine/speculative.h"
#include "engine/state_pool.h"

namespace sala {

struct Sequence {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // prompt + generated so far
  int64_t prompt_len = 0;       // the original prompt (chunk alignment); add() sets it if 0
  int64_t num_computed = 0;     // tokens whose KV / state are in the caches (past_len)
  std::vector<int32_t> pages;   // KV pages in position order
  int32_t slot = -1;            // lightning-state slot; -1 while not running
  int32_t num_preemptions = 0;
  int64_t last_step = 0;        // scheduler step that last gave it rows (fair ordering)
  bool running = false;
  SpecState spec;               // speculative decoding (drafts appended to tokens in a step)
  int64_t pending() const { return int64_t(tokens.size()) - num_computed; }
};

enum class SchedulePolicy { Fcfs, Fair };

struct SchedulerOptions {
  int32_t max_running_requests = 64;
  int32_t chunked_prefill_size = 8192;  // per sequence per step
  int32_t max_step_tokens = 8192;       // all rows of a step
  // First total length whose call is sparse (SparseConfig::first_sparse_len: dense_len, or
  // 1 with --dense-as-sparse); 0 or 1: no boundary.
  int32_t dense_len = 0;
  SchedulePolicy policy = SchedulePolicy::Fair;
};

// "fcfs" | "fair"; throws sala::Error otherwise.
SchedulePolicy parse_schedule_policy(const std::string& name);
const char* schedule_policy_name(SchedulePolicy p);

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int32_t num_tokens = 0;  // rows this step, from seq->num_computed
  bool sample = false;     // the chunk reaches the end: sample its last row
};

struct SchedulePlan {
  std::vector<ScheduledSeq> items;        // in row order
  std::vector<Sequence*> preempted;       // moved back to the front of the queue this step
  std::vector<Sequence*> out_of_memory;   // running alone, the pool cannot hold one more token
  int32_t num_tokens = 0;
  void clear() {
    items.clear();
    preempted.clear();
    out_of_memory.clear();
    num_tokens = 0;
  }
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& opts, BlockPool& blocks, StatePool& states);

  // Appends to the waiting queue (FIFO). The sequence must have tokens and no resources.
  void add(Sequence* s);
  // Removes a sequence wherever it is (finished or cancelled) and frees its pages and slot.
  void remove(Sequence* s);
  // Plans the next step; pages and slots of the planned rows are allocated on return.
  void schedule(SchedulePlan& plan);
  // After the forward: advances num_computed of every planned sequence.
  void commit(const SchedulePlan& plan);

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  int64_t preemptions() const { return preemptions_; }
  const SchedulerOptions& options() const { return opts_; }
  // End (exclusive) of s's next call if it were planned now (the chunk boundary rule above):
  // speculative drafts are trimmed so that a verify call is never cut.
  int64_t call_end(const Sequence& s) const { return chunk_end(s); }

 private:
  // End (exclusive) of the next chunk of s: see the boundary rule above.
  int64_t chunk_end(const Sequence& s) const;
  void schedule_fcfs(SchedulePlan& plan);
  void schedule_fair(SchedulePlan& plan);
  // Pages for s up to end, preempting the newest running sequences (possibly s) until they
  // fit; false if s itself was preempted or is reported out of memory. A victim already
  // planned this step leaves the plan and gives its rows back to budget.
  bool grow(Sequence* s, int64_t end, SchedulePlan& plan, int64_t& budget);
  // Pages that running sequences still need: a prefill the rest of its prompt plus one decode
  // token, a decode not yet planned this step its row.
  int64_t reserved_pages() const;
  void admit(Sequence* s, int64_t end, SchedulePlan& plan, int64_t& budget);
  void preempt(Sequence* s, SchedulePlan& plan);
  void free_resources(Sequence* s);

  SchedulerOptions opts_;
  BlockPool& blocks_;
  StatePool& states_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order: oldest first
  int64_t preemptions_ = 0;
  int64_t step_ = 0;  // schedule() calls so far
  struct Candidate {
    Sequence* seq;
    int64_t rows;
    int64_t queue_index;  // -1 if running
  };
  std::vector<Candidate> candidates_;  // fair: reused across steps
  std::vector<int64_t> queued_pages_;  // fair: pages each waiting sequence needs, queue order
};

}  // namespace sala
