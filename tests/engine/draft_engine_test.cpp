// STANDALONE speculative decoding in the engine (issue 21), CPU fp32 on the bundled tiny
// model with a perturbed copy of it as the draft model (draft_test_util.h; it disagrees with
// the target often): greedy outputs are token for token those without speculation, below
// and across dense_len (256), one request at a time, batched and under preemption; drafts
// are accepted and rejected, and both the target and the draft model roll back; stop tokens
// and max_new_tokens end a verify call's tokens where they should; nothing leaks; sampled
// outputs have the distribution of sampling without speculation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "draft_test_util.h"

namespace sala {
namespace {

std::vector<GenerationRequest> long_requests() {
  std::vector<GenerationRequest> reqs;
  const int lens[] = {40, 120, 230, 250, 300};  // 230, 250: generate across dense_len
  for (int i = 0; i < 5; ++i) {
    const auto phrase = make_prompt(11, 30 + uint32_t(i));  // a repeated phrase (copy-like)
    std::vector<int32_t> rep{1};
    while (int(rep.size()) < lens[i]) rep.insert(rep.end(), phrase.begin() + 1, phrase.end());
    rep.resize(size_t(lens[i]));
    reqs.push_back(greedy(rep, 40));
    reqs.push_back(greedy(make_prompt(lens[i], 50 + uint32_t(i)), 40));
  }
  return reqs;
}

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

// drafts 0: no speculation. together: all requests submitted at once, else one by one (each
// alone in its steps: rows bit-identical with and without drafts on the CPU).
Outputs run(int32_t drafts, const std::vector<GenerationRequest>& reqs, bool together,
            int32_t pages = 512, double noise = 1.0, int32_t chunk = 64) {
  EngineSetup s;
  s.pages = pages;
  s.step_tokens = 512;
  s.opts.chunked_prefill_size = chunk;
  s.opts.speculative.num_draft_tokens = drafts;
  s.opts.max_queued_requests = 2000;
  auto e = drafts > 0 ? start_with_draft(s, perturbed_model_dir(noise)) : start(s);
  Outputs r;
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& g : reqs) {
    hs.push_back(e->submit(g));
    if (!together) r.tokens.push_back(collect(*hs.back()).tokens);
  }
  if (together)
    for (auto& h : hs) r.tokens.push_back(collect(*h).tokens);
  expect_idle(*e);
  r.stats = e->stats();
  EXPECT_EQ(r.stats.spec_draft_pages_used, 0) << "the draft model's pages leaked";
  EXPECT_EQ(r.stats.spec_draft_slots_used, 0) << "the draft model's state slots leaked";
  return r;
}

void print(const char* what, const EngineStats& st) {
  std::printf("%s: %lld verify calls, %lld drafted, %lld accepted (%.2f tokens per call), "
              "%lld target rollbacks, %lld draft-model rollbacks, %lld preemptions, %lld steps\n",
              what, (long long)st.spec_verify_calls, (long long)st.spec_drafted_tokens,
              (long long)st.spec_accepted_tokens,
              1.0 + double(st.spec_accepted_tokens) / double(std::max<int64_t>(1, st.spec_verify_calls)),
              (long long)st.spec_rollbacks, (long long)st.spec_draft_rollbacks,
              (long long)st.preemptions, (long long)st.steps);
}

TEST(DraftModelSpeculative, GreedyOutputUnchanged) {
  const auto reqs = long_requests();
  const Outputs plain = run(0, reqs, false);
  for (int32_t k : {2, 5}) {
    const Outputs spec = run(k, reqs, false);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "k " << k << ", request " << i;
    const EngineStats& st = spec.stats;
    print(k == 2 ? "k 2" : "k 5", st);
    EXPECT_GT(st.spec_accepted_tokens, 0) << "k " << k << ": no draft was ever accepted";
    EXPECT_GT(st.spec_drafted_tokens, st.spec_accepted_tokens) << "k " << k << ": none rejected";
    EXPECT_GT(st.spec_rollbacks, 0) << "k " << k;
    EXPECT_GT(st.spec_draft_rollbacks, 0) << "k " << k << ": the draft model never rolled back";
    EXPECT_EQ(st.generated_tokens_total, plain.stats.generated_tokens_total);
  }
}

// Several requests verifying in the same steps, and a pool too small for all of them
// (preemption in the middle of speculation: the draft model drops the request's caches and
// prefills it again with the target's recompute), and prefill chunks that fill the step
// (472 rows of 512: verify calls wait, their drafts are dropped, the draft model keeps the
// pending token's row). Steps of more than 16 rows take the CPU's
// sgemm, whose rows may differ from the per-row GEMV in the last bits (as without
// speculation), so a near-tie may pick another token: at most one request may differ.
TEST(DraftModelSpeculative, BatchedAndPreemptedMatchAloneUpToCpuRounding) {
  const auto reqs = long_requests();
  const Outputs alone = run(0, reqs, false);
  for (int32_t pages : {512, 40, 0}) {
    const Outputs spec = pages ? run(4, reqs, true, pages) : run(4, reqs, true, 512, 1.0, 8192);
    print(pages == 40 ? "batched, 40 pages" : pages ? "batched" : "batched, long chunks",
          spec.stats);
    size_t equal = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      equal += spec.tokens[i] == alone.tokens[i];
      EXPECT_EQ(spec.tokens[i].size(), alone.tokens[i].size());
    }
    std::printf("%zu of %zu requests equal\n", equal, reqs.size());
    EXPECT_GE(equal, reqs.size() - 1);
    EXPECT_GT(spec.stats.spec_draft_rollbacks, 0);
    if (pages == 40) EXPECT_GT(spec.stats.preemptions, 0);
  }
}

TEST(DraftModelSpeculative, StopTokenAndLengthEndTheVerifiedTokens) {
  const auto reqs = long_requests();
  const Outputs plain = run(0, reqs, false);
  std::vector<GenerationRequest> stop = {reqs[0]};
  const int32_t tok = plain.tokens[0][19];
  stop[0].sampling.stop_token_ids = {tok};
  size_t first = 0;
  while (plain.tokens[0][first] != tok) ++first;
  const Outputs got = run(6, stop, false, 512, 0.3);  // a close draft: long verify calls
  EXPECT_EQ(got.tokens[0], std::vector<int32_t>(plain.tokens[0].begin(), plain.tokens[0].begin() + long(first)));
  std::vector<GenerationRequest> few = {reqs[1], reqs[4]};
  for (auto& g : few) g.sampling.max_new_tokens = 7;
  const Outputs g7 = run(8, few, false, 512, 0.3);
  EXPECT_EQ(g7.tokens[0], std::vector<int32_t>(plain.tokens[1].begin(), plain.tokens[1].begin() + 7));
  EXPECT_EQ(g7.tokens[1], std::vector<int32_t>(plain.tokens[4].begin(), plain.tokens[4].begin() + 7));
}

// Requests aborted while they speculate free the draft model's caches with the target's.
TEST(DraftModelSpeculative, AbortFreesTheDraftModelsCaches) {
  EngineSetup s;
  s.opts.speculative.num_draft_tokens = 4;
  auto e = start_with_draft(s, perturbed_model_dir(0.3));
  std::vector<std::shared_ptr<RequestHandle>> hs;
  const auto reqs = long_requests();
  for (size_t i = 0; i < 6; ++i) {  // all running at once (8 slots)
    GenerationRequest g = reqs[i];
    g.sampling.max_new_tokens = 4000;  // still running when cancelled
    hs.push_back(e->submit(g));
  }
  TokenEvent ev;
  for (auto& h : hs) ASSERT_TRUE(h->next(ev, 120s));  // each has begun to generate
  EXPECT_GT(e->stats().spec_draft_slots_used, 0);
  for (auto& h : hs) h->cancel();
  for (auto& h : hs) EXPECT_EQ(collect(*h).reason, FinishReason::Aborted);
  expect_idle(*e);
  const EngineStats st = e->stats();
  EXPECT_GT(st.spec_verify_calls, 0);
  EXPECT_EQ(st.spec_draft_pages_used, 0);
  EXPECT_EQ(st.spec_draft_slots_used, 0);
}

// Two-sample chi-square of the tokens at one output position, bins with fewer than 10 plain
// draws merged; true if below the p = 1e-4 critical value (Wilson-Hilferty).
bool same_distribution(const std::vector<std::vector<int32_t>>& a,
                       const std::vector<std::vector<int32_t>>& b, size_t pos, double& chi2,
                       int& dof) {
  std::map<int32_t, std::pair<double, double>> bins;
  for (const auto& t : a) bins[t[pos]].first += 1;
  for (const auto& t : b) bins[t[pos]].second += 1;
  std::pair<double, double> other{0, 0};
  chi2 = 0;
  dof = -1;
  auto add = [&](const std::pair<double, double>& c) {
    chi2 += (c.first - c.second) * (c.first - c.second) / (c.first + c.second);
    ++dof;
  };
  for (const auto& [tok, c] : bins) {
    if (c.first < 10) {
      other.first += c.first;
      other.second += c.second;
    } else {
      add(c);
    }
  }
  if (other.first + other.second > 0) add(other);
  const double v = std::max(1, dof), z = 3.719;  // one-sided p = 1e-4
  const double crit = v * std::pow(1 - 2 / (9 * v) + z * std::sqrt(2 / (9 * v)), 3);
  return chi2 < crit;
}

// Sampled requests with the draft model's proposals (q: its distribution, not one-hot): the
// tokens after the first, where drafts are verified, have the distribution of sampling
// without speculation. 1,500 seeds each; a q that is not the distribution the draft was drawn
// from (e.g. another row's) biases them.
TEST(DraftModelSpeculative, SampledOutputHasThePlainDistribution) {
  std::vector<GenerationRequest> plain_reqs, spec_reqs;
  const auto prompt = make_prompt(12, 3);
  for (uint32_t i = 0; i < 1500; ++i) {
    GenerationRequest g = greedy(prompt, 4);
    g.sampling.temperature = 1.0f;
    g.sampling.top_k = 30;
    g.sampling.seed = 1000 + i;
    plain_reqs.push_back(g);
    g.sampling.seed = 9000 + i;
    spec_reqs.push_back(g);
  }
  const Outputs plain = run(0, plain_reqs, true), spec = run(3, spec_reqs, true, 512, 0.3);
  print("sampled", spec.stats);
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0);
  EXPECT_GT(spec.stats.spec_rollbacks, 0);
  for (size_t pos = 1; pos < 4; ++pos) {
    double chi2 = 0;
    int dof = 0;
    EXPECT_TRUE(same_distribution(plain.tokens, spec.tokens, pos, chi2, dof))
        << "token " << pos << ": chi2 " << chi2 << " with " << dof << " degrees of freedom";
    std::printf("token %zu: chi2 %.1f, %d degrees of freedom\n", pos, chi2, dof);
  }
}

// `sala serve`'s budget (--kv-memory-mb) pays for the draft model's caches too: its state and
// snapshot slots, KV for every target token plus the drafts in flight; together they fit.
TEST(DraftModelSpeculative, PlanLimitsBudgetHoldsTheDraftModel) {
  const ModelConfig& c = tiny_config();
  EngineOptions o;
  o.max_running_requests = 16;
  o.max_context_len = 4096;
  o.speculative.num_draft_tokens = 4;
  o.speculative.draft_model = true;
  const size_t budget = size_t(64) << 20, page = kv_bytes_per_page(c, c.sparse.block_size);
  const ModelLimits alone = plan_limits(c, o, budget);
  const ModelLimits l = plan_limits(c, o, budget, 0, 4, &c);
  const ModelLimits d = plan_draft_limits(c, o, l);
  EXPECT_EQ(d.caches.num_slots, 32);
  EXPECT_EQ(d.max_logit_rows, 16);
  EXPECT_EQ(d.max_step_tokens, l.max_step_tokens + 16 * 5);
  EXPECT_GE(int64_t(d.caches.num_pages) * d.caches.page_size,
            int64_t(l.caches.num_pages) * l.caches.page_size + 16 * 4);
  const size_t used = size_t(l.caches.num_slots + d.caches.num_slots) * state_bytes_per_slot(c) +
                      size_t(l.caches.num_pages + d.caches.num_pages) * page;
  EXPECT_LE(used, budget);
  EXPECT_GT(used, budget - 2 * page);  // and the budget is used
  EXPECT_LT(l.caches.num_pages, alone.caches.num_pages * 6 / 10);
}

}  // namespace
}  // namespace sala
