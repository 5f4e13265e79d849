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
// Policy of one step (schedule()):
//  1. Running sequences, oldest first, each get their next decode row or prefill chunk if
//     it fits in what is left of max_step_tokens (else they wait a step). A sequence that
//     needs pages the pool lacks preempts the newest running sequence (possibly itself)
//     until the pages fit. The only running sequence that still cannot grow is reported in
//     `out_of_memory` (the engine finishes it: the KV pool is its context limit).
//  2. Waiting sequences are admitted in FIFO order (no skipping) while a state slot, the
//     running limit and the step budget allow and the free pages, less what running
//     prefills still need, hold the whole pending prefill plus one decode token. Admission
//     never preempts.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "engine/block_pool.h"
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
  bool running = false;
  int64_t pending() const { return int64_t(tokens.size()) - num_computed; }
};

struct SchedulerOptions {
  int32_t max_running_requests = 64;
  int32_t chunked_prefill_size = 8192;  // per sequence per step
  int32_t max_step_tokens = 8192;       // all rows of a step
  // First total length whose call is sparse (SparseConfig::first_sparse_len: dense_len, or
  // 1 with --dense-as-sparse); 0 or 1: no boundary.
  int32_t dense_len = 0;
};

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

 private:
  // End (exclusive) of the next chunk of s: see the boundary rule above.
  int64_t chunk_end(const Sequence& s) const;
  void preempt(Sequence* s, SchedulePlan& plan);
  void free_resources(Sequence* s);

  SchedulerOptions opts_;
  BlockPool& blocks_;
  StatePool& states_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order: oldest first
  int64_t preemptions_ = 0;
};

}  // namespace sala
