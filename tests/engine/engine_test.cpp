// The engine thread on the bundled tiny model (CPU backend, fp32): greedy equals a manual
// loop over Model, batching / chunking / preemption do not change greedy tokens, cancel and
// random disconnects leak no page or slot, same seed gives the same tokens.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "core/config.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/minicpm_sala.h"
#include "engine_test_util.h"

namespace sala {
namespace {

// Prefill in one forward, then one decode forward per token, straight through Model.
std::vector<int32_t> manual_greedy(Model& m, const std::vector<int32_t>& prompt, int n) {
  const int32_t V = m.config().vocab_size;
  std::vector<int32_t> pages(size_t(m.limits().caches.num_pages));
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = int32_t(i);
  std::vector<float> logits;
  std::vector<int32_t> out;
  StepMeta meta;
  meta.add_seq(prompt.data(), int32_t(prompt.size()), 0, 0, pages, false, true);
  m.forward(meta, logits);
  out.push_back(argmax(logits.data(), V));
  while (int(out.size()) < n) {
    StepMeta d;
    const int64_t past = int64_t(prompt.size() + out.size()) - 1;
    d.add_seq(&out.back(), 1, past, 0, pages, false, true);
    m.forward(d, logits);
    out.push_back(argmax(logits.data(), V));
  }
  return out;
}

TEST(EngineModel, GreedyMatchesManualLoop) {
  auto ref = load_model(64, 1, 512);
  EngineSetup s;
  s.pages = 64;
  auto e = start(s);
  for (int len : {40, 300}) {  // dense and sparse (dense_len 256) paths
    const auto prompt = make_prompt(len, uint32_t(len));
    const auto want = manual_greedy(*ref, prompt, 24);
    auto h = e->submit(greedy(prompt, 24));
    const Result got = collect(*h);
    EXPECT_EQ(got.tokens, want) << "prompt length " << len;
    EXPECT_EQ(got.reason, FinishReason::Length);
    EXPECT_EQ(got.completion_tokens, 24);
  }
  expect_idle(*e);
}

// 8 prompts of different lengths, some beyond dense_len so the sparse path runs.
const std::vector<int> kLens = {7, 300, 33, 280, 64, 120, 5, 260};

TEST(EngineModel, BatchedEqualsAlone) {
  EngineSetup s;
  s.step_tokens = 256;
  s.opts.chunked_prefill_size = 64;
  auto e = start(s);
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < kLens.size(); ++i) {
    auto h = e->submit(greedy(make_prompt(kLens[i], 100 + uint32_t(i)), 12 + int(i) * 3));
    alone.push_back(collect(*h).tokens);
  }
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (size_t i = 0; i < kLens.size(); ++i)
    hs.push_back(e->submit(greedy(make_prompt(kLens[i], 100 + uint32_t(i)), 12 + int(i) * 3)));
  for (size_t i = 0; i < kLens.size(); ++i) {
    const Result r = collect(*hs[i]);
    EXPECT_EQ(r.tokens, alone[i]) << "request " << i << " (prompt " << kLens[i] << ")";
  }
  EXPECT_EQ(e->stats().preemptions, 0);
  expect_idle(*e);
}

// Preemption drops a request's KV and recomputes it by prefilling prompt + generated tokens;
// with an FP8 KV cache the recomputed codes must be the ones decode stored.
void expect_preempted_equals_uninterrupted(KvCacheDtype kv) {
  auto run = [kv](int32_t pages, int64_t* preemptions) {
    EngineSetup s;
    s.kv = kv;
    s.pages = pages;
    s.step_tokens = 256;
    s.opts.chunked_prefill_size = 64;
    auto e = start(s);
    std::vector<std::shared_ptr<RequestHandle>> hs;
    // Some cross dense_len (256) while generating, some start above it.
    const int lens[] = {30, 80, 150, 200, 230, 270};
    for (int i = 0; i < 6; ++i)
      hs.push_back(e->submit(greedy(make_prompt(lens[i], 500 + uint32_t(i)), 60)));
    std::vector<std::vector<int32_t>> out;
    for (auto& h : hs) {
      const Result r = collect(*h);
      EXPECT_EQ(r.tokens.size(), 60u);  // no duplicates, nothing lost
      EXPECT_EQ(r.reason, FinishReason::Length);
      out.push_back(r.tokens);
    }
    *preemptions = e->stats().preemptions;
    std::printf("pages %d: %lld preemptions, %lld steps, %lld step tokens\n", pages, (long long)e->stats().preemptions, (long long)e->stats().steps, (long long)e->stats().step_tokens_total);
    expect_idle(*e);
    return out;
  };
  int64_t p_big = 0, p_small = 0;
  const auto want = run(512, &p_big);
  const auto got = run(26, &p_small);  // 416 tokens of KV for 6 requests of 90..330 tokens
  EXPECT_EQ(p_big, 0);
  EXPECT_GT(p_small, 0);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
}

TEST(EngineModel, PreemptedEqualsUninterrupted) { expect_preempted_equals_uninterrupted(KvCacheDtype::Auto); }
TEST(EngineModel, PreemptedEqualsUninterruptedFp8Kv) {
  expect_preempted_equals_uninterrupted(KvCacheDtype::FP8_E4M3);
}

TEST(EngineModel, CancelFreesPagesAndSlots) {
  EngineSetup s;
  s.opts.chunked_prefill_size = 64;
  auto e = start(s);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 12; ++i)  // 8 run, 4 wait
    hs.push_back(e->submit(greedy(make_prompt(50 + 10 * i, uint32_t(i)), 100000)));
  TokenEvent ev;
  ASSERT_TRUE(hs[0]->next(ev, 60s));
  ASSERT_TRUE(hs[0]->next(ev, 60s));  // stats are published after the step of the 1st event
  const EngineStats mid = e->stats();
  EXPECT_GT(mid.kv_pages_used, 0);
  EXPECT_GT(mid.state_slots_used, 0);
  for (auto& h : hs) h->cancel();
  for (auto& h : hs) {
    h->cancel();  // idempotent
    const Result r = collect(*h);
    EXPECT_EQ(r.reason, FinishReason::Aborted);
  }
  expect_idle(*e);
  EXPECT_EQ(e->stats().requests_aborted, 12);
}

TEST(EngineModel, SeedDeterminism) {
  EngineSetup s;
  s.opts.chunked_prefill_size = 64;
  auto e = start(s);
  auto req = [](uint64_t seed) {
    GenerationRequest g;
    g.prompt = make_prompt(30, 7);
    g.sampling.temperature = 0.9f;
    g.sampling.top_p = 0.95f;
    g.sampling.top_k = 100;
    g.sampling.seed = seed;
    g.sampling.max_new_tokens = 32;
    g.sampling.ignore_eos = true;
    return g;
  };
  const auto a = collect(*e->submit(req(42))).tokens;
  const auto b = collect(*e->submit(req(42))).tokens;
  const auto c = collect(*e->submit(req(43))).tokens;
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // The same seeded request batched with others.
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 4; ++i) hs.push_back(e->submit(greedy(make_prompt(40 + i, uint32_t(i)), 40)));
  auto h = e->submit(req(42));
  EXPECT_EQ(collect(*h).tokens, a);
  for (auto& x : hs) collect(*x);
  expect_idle(*e);
}

TEST(EngineModel, StopTokensEndGenerationAndAreNotEmitted) {
  auto e = start(EngineSetup{});
  const auto prompt = make_prompt(30, 3);
  const auto full = collect(*e->submit(greedy(prompt, 20))).tokens;
  ASSERT_EQ(full.size(), 20u);
  GenerationRequest g = greedy(prompt, 20);
  g.sampling.stop_token_ids = {full[6]};
  auto hg = e->submit(g);
  const Result r = collect(*hg);
  TokenEvent again;  // after the final event: a copy of it, at once
  ASSERT_TRUE(hg->next(again, 0ms));
  EXPECT_TRUE(again.finished);
  EXPECT_TRUE(again.tokens.empty());
  EXPECT_EQ(again.reason, FinishReason::StopToken);
  const size_t first = size_t(std::find(full.begin(), full.end(), full[6]) - full.begin());
  EXPECT_EQ(r.reason, FinishReason::StopToken);
  EXPECT_EQ(r.matched, full[6]);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(full.begin(), full.begin() + std::ptrdiff_t(first)));
  EXPECT_EQ(r.completion_tokens, int32_t(first) + 1);
  // EOS (config eos_token_id) ends generation unless ignore_eos.
  GenerationRequest eos = greedy(prompt, 20);
  eos.sampling.ignore_eos = false;
  const Result r2 = collect(*e->submit(eos));
  const auto& ids = tiny_config().eos_token_ids;
  if (r2.reason == FinishReason::StopToken)
    EXPECT_NE(std::find(ids.begin(), ids.end(), r2.matched), ids.end());
  for (int32_t t : r2.tokens) EXPECT_EQ(std::find(ids.begin(), ids.end(), t), ids.end());
  expect_idle(*e);
}

TEST(EngineModel, SubmitValidatesAndBoundsTheQueue) {
  EngineSetup s;
  s.pages = 8;  // 128 tokens of KV
  s.slots = 1;
  s.opts.max_queued_requests = 2;
  s.opts.max_context_len = 100;
  auto e = start(s);
  EXPECT_THROW(e->submit(greedy({}, 4)), Error);
  EXPECT_THROW(e->submit(greedy(make_prompt(100, 1), 4)), Error);  // context limit
  EXPECT_THROW(e->submit(greedy({1, 5000}, 4)), Error);            // token id
  EXPECT_THROW(e->submit(greedy(make_prompt(10, 1), 0)), Error);   // max_new_tokens
  // One request runs; two wait; the next is refused.
  auto a = e->submit(greedy(make_prompt(10, 1), 100000));
  TokenEvent ev;
  ASSERT_TRUE(a->next(ev, 60s));
  auto b = e->submit(greedy(make_prompt(10, 2), 4));
  auto c = e->submit(greedy(make_prompt(10, 3), 4));
  EXPECT_THROW(e->submit(greedy(make_prompt(10, 4), 4)), QueueFull);
  // The running one stops at the context limit.
  const Result ra = collect(*a);
  EXPECT_EQ(ra.reason, FinishReason::Length);
  EXPECT_EQ(ra.completion_tokens, 90);
  EXPECT_EQ(collect(*b).tokens.size(), 4u);
  EXPECT_EQ(collect(*c).tokens.size(), 4u);
  expect_idle(*e);
  EXPECT_TRUE(e->alive());
  e->shutdown();
  EXPECT_FALSE(e->alive());
  EXPECT_THROW(e->submit(greedy(make_prompt(10, 1), 4)), Error);
}

TEST(EngineModel, ConcurrentRequestsWithRandomCancelsLeakNothing) {
  EngineSetup s;
  s.pages = 96;  // tight: some preemption
  s.slots = 64;
  s.opts.max_running_requests = 64;
  s.opts.chunked_prefill_size = 64;
  auto e = start(s);
  std::atomic<int> finished{0}, aborted{0}, errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng{uint32_t(i)};
      GenerationRequest g = greedy(make_prompt(int(5 + rng() % 120), uint32_t(i)), 8 + int(rng() % 24));
      if (i % 2) {
        g.sampling.temperature = 0.7f;
        g.sampling.seed = uint64_t(i);
      }
      auto h = e->submit(std::move(g));
      const int cancel_after = rng() % 3 == 0 ? int(rng() % 6) : -1;
      int events = 0;
      TokenEvent ev;
      for (;;) {
        if (!h->next(ev, 120s)) {
          ++errors;
          return;
        }
        if (ev.finished) {
          (ev.reason == FinishReason::Aborted ? aborted : finished)++;
          if (ev.reason == FinishReason::Error) ++errors;
          return;
        }
        if (++events == cancel_after) h->cancel();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(finished + aborted, 64);
  EXPECT_GT(aborted.load(), 0);
  expect_idle(*e);
  const EngineStats st = e->stats();
  EXPECT_EQ(st.requests_total, 64);
  EXPECT_EQ(st.requests_finished + st.requests_aborted, 64);
}

TEST(EngineModel, PlanLimitsSizesThePoolFromTheBudget) {
  const ModelConfig& c = tiny_config();
  EngineOptions o;
  o.max_running_requests = 16;
  o.max_context_len = 4096;
  const size_t page = kv_bytes_per_page(c, c.sparse.block_size);
  // 4 sparse layers, 1 kv head of 16 dims, 16-token pages: K+V 8 KiB + compressed keys.
  EXPECT_EQ(page, size_t(4) * (16 * 64 * 2 + 4 * 64 + 1 * 64));
  ModelLimits l = plan_limits(c, o, size_t(64) << 20);
  EXPECT_EQ(l.caches.page_size, 16);
  EXPECT_EQ(l.caches.num_slots, 16);
  EXPECT_EQ(l.max_logit_rows, 16);
  EXPECT_EQ(l.keep_verify_rows, 0);  // no speculation: no rows kept for rollbacks
  {
    EngineOptions so = o;
    so.speculative.num_draft_tokens = 4;  // 16 x 5 verify rows kept; 200 x 5 capped at 512
    EXPECT_EQ(plan_limits(c, so, size_t(64) << 20).keep_verify_rows, 80);
    so.max_running_requests = 200;
    EXPECT_EQ(plan_limits(c, so, size_t(1) << 30).keep_verify_rows, 512);
  }
  const size_t states = 16 * state_bytes_per_slot(c);
  EXPECT_EQ(size_t(l.caches.num_pages), ((size_t(64) << 20) - states) / page);
  // A tiny budget still holds one request of max_context_len.
  EXPECT_EQ(plan_limits(c, o, 1000).caches.num_pages, 4096 / 16);
  EXPECT_EQ(plan_limits(c, o, 1000, 1600).caches.num_pages, 100);
  // An FP8 KV cache (1-byte elements) fits 4x the pages of the CPU's fp32 cache.
  EXPECT_EQ(kv_bytes_per_page(c, c.sparse.block_size, 1) * 4, page);
  EXPECT_EQ(size_t(plan_limits(c, o, size_t(64) << 20, 0, 1).caches.num_pages),
            ((size_t(64) << 20) - states) / (page / 4));
}

}  // namespace
}  // namespace sala
