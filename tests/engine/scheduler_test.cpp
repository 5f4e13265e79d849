// Scheduler policy without a model: admission, chunking, mixing, preemption, no leaks.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "engine/block_pool.h"
#include "engine/scheduler.h"
#include "engine/state_pool.h"

namespace sala {
namespace {

TEST(BlockPool, EnsureIsAllOrNothingAndReleaseReturnsPages) {
  BlockPool pool(4, 16);
  std::vector<int32_t> a, b;
  EXPECT_TRUE(pool.ensure(a, 17));  // 2 pages
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0], 0);
  EXPECT_EQ(a[1], 1);
  EXPECT_TRUE(pool.ensure(a, 32));  // still 2
  EXPECT_EQ(pool.used(), 2);
  EXPECT_FALSE(pool.ensure(b, 48));  // needs 3, 2 free
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool.used(), 2);
  EXPECT_TRUE(pool.ensure(b, 32));
  EXPECT_EQ(pool.free_count(), 0);
  pool.release(a);
  pool.release(b);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.pages_for(0), 0);
  EXPECT_EQ(pool.pages_for(16), 1);
  EXPECT_EQ(pool.pages_for(17), 2);
}

TEST(StatePool, AcquireRelease) {
  StatePool pool(2);
  const int32_t a = pool.acquire(), b = pool.acquire();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(pool.acquire(), -1);
  pool.release(a);
  EXPECT_EQ(pool.acquire(), 0);
  pool.release(0);
  pool.release(1);
  EXPECT_EQ(pool.used(), 0);
}

SchedulerOptions fcfs(SchedulerOptions o) {
  o.policy = SchedulePolicy::Fcfs;
  return o;
}

// A fake engine around the scheduler: every sampled row appends token 7.
struct Harness {
  BlockPool blocks;
  StatePool states;
  Scheduler sched;
  std::vector<std::unique_ptr<Sequence>> seqs;
  SchedulePlan plan;

  Harness(int32_t pages, int32_t page_size, int32_t slots, SchedulerOptions o)
      : blocks(pages, page_size), states(slots), sched(o, blocks, states) {}

  Sequence* add(int32_t prompt_len) {
    auto s = std::make_unique<Sequence>();
    s->id = seqs.size() + 1;
    s->tokens.assign(size_t(prompt_len), 1);
    sched.add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }
  // One step; returns the plan.
  const SchedulePlan& step() {
    sched.schedule(plan);
    check_invariants();
    sched.commit(plan);
    for (auto& it : plan.items)
      if (it.sample) it.seq->tokens.push_back(7);
    return plan;
  }
  void check_invariants() {
    int32_t pages = 0, slots = 0;
    for (auto& s : seqs) {
      pages += int32_t(s->pages.size());
      slots += s->slot >= 0;
    }
    EXPECT_EQ(pages, blocks.used());
    EXPECT_EQ(slots, states.used());
    for (auto& it : plan.items) {
      ASSERT_TRUE(it.seq->running);
      EXPECT_GE(int64_t(it.seq->pages.size()) * blocks.page_size(),
                it.seq->num_computed + it.num_tokens);
    }
    EXPECT_LE(plan.num_tokens, sched.options().max_step_tokens);
  }
  int32_t rows_of(const Sequence* s) const {
    for (auto& it : plan.items)
      if (it.seq == s) return it.num_tokens;
    return 0;
  }
};

TEST(Scheduler, AdmitsInFifoOrderUpToTheRunningLimit) {
  Harness h(100, 16, 8, {2, 1024, 4096});
  Sequence* a = h.add(10);
  Sequence* b = h.add(20);
  Sequence* c = h.add(30);
  auto& p = h.step();
  ASSERT_EQ(p.items.size(), 2u);
  EXPECT_EQ(p.items[0].seq, a);
  EXPECT_EQ(p.items[1].seq, b);
  EXPECT_TRUE(p.items[0].sample);
  EXPECT_EQ(h.sched.waiting().front(), c);
  h.sched.remove(a);  // a finishes: c gets in on the next step
  h.step();
  EXPECT_EQ(h.rows_of(b), 1);   // decode
  EXPECT_EQ(h.rows_of(c), 30);  // prefill
  EXPECT_TRUE(h.sched.waiting().empty());
}

TEST(Scheduler, AdmissionWaitsForSlots) {
  Harness h(100, 16, 1, {8, 1024, 4096});
  h.add(10);
  Sequence* b = h.add(10);
  h.step();
  EXPECT_EQ(h.sched.running().size(), 1u);
  EXPECT_EQ(h.sched.waiting().front(), b);
}

TEST(Scheduler, ChunkedPrefillThenDecode) {
  Harness h(100, 16, 4, {4, 64, 4096});
  Sequence* a = h.add(200);
  std::vector<int32_t> rows;
  std::vector<bool> sampled;
  for (int i = 0; i < 6; ++i) {
    auto& p = h.step();
    ASSERT_EQ(p.items.size(), 1u);
    rows.push_back(p.items[0].num_tokens);
    sampled.push_back(p.items[0].sample);
  }
  EXPECT_EQ(rows, (std::vector<int32_t>{64, 64, 64, 8, 1, 1}));
  EXPECT_EQ(sampled, (std::vector<bool>{false, false, false, true, true, true}));
  EXPECT_EQ(a->num_computed, 202);
  EXPECT_EQ(a->tokens.size(), 203u);
}

TEST(Scheduler, FcfsDecodeRowsMixWithPrefillChunksWithinTheStepBudget) {
  Harness h(100, 16, 4, fcfs({4, 64, 130}));
  Sequence* a = h.add(10);
  h.step();  // a prefilled, sampled
  Sequence* b = h.add(300);
  Sequence* c = h.add(50);
  Sequence* d = h.add(20);
  auto& p = h.step();
  EXPECT_EQ(h.rows_of(a), 1);   // decode first
  EXPECT_EQ(h.rows_of(b), 64);  // chunk limit
  EXPECT_EQ(h.rows_of(c), 50);  // whole prompt
  EXPECT_EQ(h.rows_of(d), 0);   // 20 > the 15 rows left: waits, never a shorter chunk
  EXPECT_EQ(p.num_tokens, 115);
  EXPECT_TRUE(p.items[2].sample);
  h.step();
  EXPECT_EQ(h.rows_of(a), 1);
  EXPECT_EQ(h.rows_of(b), 64);
  EXPECT_EQ(h.rows_of(c), 1);
  EXPECT_EQ(h.rows_of(d), 20);
}

TEST(Scheduler, ChunkBoundariesDependOnTheSequenceOnly) {
  // A prefill chunk that does not fit the step budget waits rather than shrinking (fcfs: the
  // running b goes first, the newcomer c waits).
  Harness h(100, 16, 4, fcfs({4, 64, 100}));
  Sequence* a = h.add(10);
  h.step();
  Sequence* b = h.add(200);
  h.step();
  EXPECT_EQ(h.rows_of(b), 64);
  Sequence* c = h.add(60);  // 1 + 64 + 60 > 100: c waits a step
  h.step();
  EXPECT_EQ(h.rows_of(a), 1);
  EXPECT_EQ(h.rows_of(b), 64);
  EXPECT_EQ(h.rows_of(c), 0);
  h.step();
  EXPECT_EQ(h.rows_of(b), 64);
  EXPECT_EQ(h.rows_of(c), 0);
  h.step();
  EXPECT_EQ(h.rows_of(b), 8);  // 200 = 3 * 64 + 8
  EXPECT_EQ(h.rows_of(c), 60);
}

TEST(Scheduler, RecomputeChunksStopAtThePromptEndAndBelowDenseLen) {
  // After a preemption, prompt (100) + generated (30) are recomputed. Chunks end at the
  // prompt's end (as the original prefill did) and at dense_len - 1 (the original decode
  // steps there were dense calls).
  SchedulerOptions o{4, 64, 4096};
  o.dense_len = 120;
  Harness h(100, 16, 4, o);
  h.seqs.push_back(std::make_unique<Sequence>());
  Sequence* s = h.seqs.back().get();
  s->tokens.assign(130, 1);
  s->prompt_len = 100;
  h.sched.add(s);
  std::vector<int32_t> rows;
  for (int i = 0; i < 5; ++i) {
    h.step();
    rows.push_back(h.plan.items.at(0).num_tokens);
  }
  EXPECT_EQ(rows, (std::vector<int32_t>{64, 36, 19, 9, 2}));
  h.sched.remove(s);
  EXPECT_EQ(h.blocks.used(), 0);
}

TEST(Scheduler, FifoAdmissionDoesNotSkipAHeadThatDoesNotFit) {
  Harness h(10, 16, 4, {4, 1024, 4096});
  Sequence* a = h.add(100);  // 7 pages with its first decode token
  h.step();
  Sequence* b = h.add(100);  // does not fit beside a
  Sequence* c = h.add(5);    // would fit, but must wait behind b
  h.step();
  EXPECT_EQ(h.rows_of(a), 1);
  EXPECT_FALSE(b->running);
  EXPECT_FALSE(c->running);
  h.sched.remove(a);
  h.step();
  EXPECT_TRUE(b->running);
  EXPECT_TRUE(c->running);
}

TEST(Scheduler, PreemptsTheNewestRunningRequestAndRequeuesItFirst) {
  // 6 pages of 4 tokens; three sequences of 7 tokens take 2 pages each (the 8th position
  // is the first decode token), then the oldest needs a third page.
  Harness h(6, 4, 4, {4, 1024, 4096});
  Sequence* a = h.add(7);
  Sequence* b = h.add(7);
  Sequence* c = h.add(7);
  Sequence* d = h.add(3);  // waits (no pages)
  h.step();
  ASSERT_EQ(h.sched.running().size(), 3u);
  EXPECT_EQ(h.blocks.free_count(), 0);
  h.step();  // each decodes position 7: still within 2 pages
  EXPECT_EQ(h.sched.preemptions(), 0);
  auto& p = h.step();  // position 8: a needs a third page → c (newest) is preempted
  EXPECT_EQ(h.sched.preemptions(), 1);
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], c);
  EXPECT_EQ(h.rows_of(a), 1);
  EXPECT_EQ(h.rows_of(b), 1);  // b takes the page c left
  EXPECT_FALSE(c->running);
  EXPECT_TRUE(c->pages.empty());
  EXPECT_EQ(c->slot, -1);
  EXPECT_EQ(c->num_computed, 0);
  EXPECT_EQ(c->tokens.size(), 9u);  // prompt + generated are kept for the recompute
  ASSERT_EQ(h.sched.waiting().size(), 2u);
  EXPECT_EQ(h.sched.waiting()[0], c);  // back at the front, ahead of d
  EXPECT_EQ(h.sched.waiting()[1], d);
  for (int i = 0; i < 3; ++i) {  // positions 9..11 fit in 3 pages; nothing is admitted
    h.step();
    EXPECT_EQ(h.plan.items.size(), 2u);
  }
  h.step();  // position 12: a needs a fourth page → b is preempted
  EXPECT_EQ(h.sched.preemptions(), 2);
  ASSERT_EQ(h.sched.waiting().size(), 3u);
  EXPECT_EQ(h.sched.waiting()[0], b);
  EXPECT_EQ(h.sched.waiting()[1], c);
  EXPECT_EQ(b->tokens.size(), 13u);
  // a finishes; b is recomputed from scratch: its prompt (7), then its generated tokens (6);
  // c must wait.
  h.sched.remove(a);
  h.step();
  ASSERT_EQ(h.plan.items.size(), 1u);
  EXPECT_EQ(h.rows_of(b), 7);
  EXPECT_FALSE(h.plan.items[0].sample);
  h.step();
  EXPECT_EQ(h.rows_of(b), 6);
  EXPECT_TRUE(h.plan.items[0].sample);
  EXPECT_EQ(b->num_preemptions, 1);
  EXPECT_EQ(h.sched.waiting()[0], c);
}

TEST(Scheduler, ALoneRequestThatOutgrowsThePoolIsReported) {
  Harness h(2, 4, 1, {1, 1024, 4096});
  Sequence* a = h.add(7);
  h.step();  // 7 prompt tokens, samples the 8th
  h.step();  // decodes position 7
  auto& p = h.step();  // position 8 needs a third page
  ASSERT_EQ(p.out_of_memory.size(), 1u);
  EXPECT_EQ(p.out_of_memory[0], a);
  EXPECT_TRUE(p.items.empty());
  h.sched.remove(a);
  EXPECT_EQ(h.blocks.used(), 0);
}

TEST(Scheduler, RandomWorkloadLeaksNothing) {
  std::mt19937 rng(123);
  Harness h(40, 16, 8, {8, 48, 128});
  std::vector<Sequence*> live;
  for (int stepi = 0; stepi < 2000; ++stepi) {
    if (rng() % 3 == 0 && h.seqs.size() < 300) live.push_back(h.add(int32_t(1 + rng() % 200)));
    if (!h.sched.running().empty() || !h.sched.waiting().empty()) {
      auto& p = h.step();
      for (Sequence* s : p.out_of_memory) h.sched.remove(s);
    }
    // finish or cancel some
    for (size_t i = 0; i < live.size();) {
      Sequence* s = live[i];
      const bool done = s->tokens.size() > 260 || rng() % 50 == 0;
      if (done) {
        h.sched.remove(s);
        live[i] = live.back();
        live.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (Sequence* s : live) h.sched.remove(s);
  EXPECT_EQ(h.blocks.used(), 0);
  EXPECT_EQ(h.states.used(), 0);
  EXPECT_TRUE(h.sched.running().empty());
  EXPECT_TRUE(h.sched.waiting().empty());
  EXPECT_GT(h.sched.preemptions(), 0);
}

TEST(Scheduler, FairSmallerWorkFirstAtEqualServiceTheSkippedChunkNext) {
  // The fcfs case above under fair: c (60 rows) goes before b's chunk (64) at equal
  // last_step; b, skipped, is least recently served and goes first the step after.
  Harness h(100, 16, 4, {4, 64, 100});
  Sequence* a = h.add(10);
  h.step();
  Sequence* b = h.add(200);
  h.step();
  Sequence* c = h.add(60);
  h.step();
  EXPECT_EQ(h.rows_of(a), 1);
  EXPECT_EQ(h.rows_of(b), 0);
  EXPECT_EQ(h.rows_of(c), 60);
  h.step();
  EXPECT_EQ(h.rows_of(b), 64);  // a boundary of b alone, never shortened
  EXPECT_EQ(h.rows_of(a), 1);
  EXPECT_EQ(h.rows_of(c), 1);
}

// A 200K-token prompt prefilling in 8192-token chunks with the engine's budget (a chunk plus
// one row per running request, here 8), and a 100-token request (a short chat prompt: more
// than the 8 rows a full chunk leaves) arriving at step 4. Returns the step that first gave
// the short request rows, and the step of the long prompt's last chunk.
std::pair<int, int> long_and_short(SchedulePolicy policy) {
  SchedulerOptions o{8, 8192, 8192 + 8};
  o.policy = policy;
  Harness h(13000, 16, 8, o);
  Sequence* lng = h.add(200000);
  Sequence* shrt = nullptr;
  int short_first = -1, long_done = -1;
  for (int step = 1; step <= 40 && long_done < 0; ++step) {
    if (step == 4) shrt = h.add(100);
    h.step();
    if (shrt && short_first < 0 && h.rows_of(shrt) > 0) short_first = step;
    if (lng->tokens.size() > 200000)
      long_done = step;
  }
  return {short_first, long_done};
}

TEST(Scheduler, FairAShortRequestDoesNotWaitForALongPrefill) {
  const auto [short_first, long_done] = long_and_short(SchedulePolicy::Fair);
  EXPECT_EQ(short_first, 4);  // the step it arrived in: smaller than the long chunk, equal service
  EXPECT_EQ(long_done, 26);   // 25 chunks, one step lost to the short request
}

TEST(Scheduler, FcfsAShortRequestWaitsForTheWholeLongPrefill) {
  // The old behaviour: every full chunk leaves only the decode rows' share of the budget (8),
  // so the 100-token request gets in beside the long prompt's last, partial chunk (200000 =
  // 24 * 8192 + 3392).
  const auto [short_first, long_done] = long_and_short(SchedulePolicy::Fcfs);
  EXPECT_EQ(long_done, 25);
  EXPECT_EQ(short_first, 25);
}

TEST(Scheduler, FairALongPrefillIsNotStarvedByAStreamOfShortRequests) {
  // A new 100-token request every step, each finishing after 3 decode rows; the long prompt
  // gets at least every other step, every short request its first rows within 2 steps.
  Harness h(13000, 16, 64, {64, 8192, 8192 + 64});
  Sequence* lng = h.add(200000);
  std::vector<std::pair<Sequence*, int>> shorts;  // sequence, arrival step
  int long_done = -1;
  for (int step = 1; step <= 80 && long_done < 0; ++step) {
    shorts.push_back({h.add(100), step});
    h.step();
    if (lng->tokens.size() > 200000) long_done = step;
    for (auto& [s, arrived] : shorts) {
      if (s->num_computed == 0 && !s->running) EXPECT_LT(step, arrived + 1) << "short " << s->id;
      if (s->running && s->tokens.size() >= 104 && s->num_computed == int64_t(s->tokens.size()) - 1) {
        h.sched.remove(s);
        s->tokens.clear();  // done: skipped from now on
      }
    }
    std::erase_if(shorts, [](auto& e) { return e.first->tokens.empty(); });
  }
  EXPECT_GT(long_done, 25);
  EXPECT_LE(long_done, 2 * 25 + 1);
  for (auto& s : h.seqs)
    if (!s->tokens.empty()) h.sched.remove(s.get());
  EXPECT_EQ(h.blocks.used(), 0);
}

TEST(Scheduler, FcfsRandomWorkloadLeaksNothing) {
  std::mt19937 rng(7);
  Harness h(40, 16, 8, fcfs({8, 48, 128}));
  for (int stepi = 0; stepi < 1500; ++stepi) {
    if (rng() % 3 == 0 && h.seqs.size() < 200) h.add(int32_t(1 + rng() % 200));
    if (!h.sched.running().empty() || !h.sched.waiting().empty()) {
      auto& p = h.step();
      for (Sequence* s : p.out_of_memory) h.sched.remove(s);
    }
    for (auto& s : h.seqs)
      if ((s->running || !s->pages.empty()) && (s->tokens.size() > 260 || rng() % 50 == 0))
        h.sched.remove(s.get());
  }
  for (Sequence* s : std::vector<Sequence*>(h.sched.running())) h.sched.remove(s);
  for (Sequence* s : std::vector<Sequence*>(h.sched.waiting().begin(), h.sched.waiting().end()))
    h.sched.remove(s);
  EXPECT_EQ(h.blocks.used(), 0);
  EXPECT_EQ(h.states.used(), 0);
  EXPECT_GT(h.sched.preemptions(), 0);
}

}  // namespace
}  // namespace sala
