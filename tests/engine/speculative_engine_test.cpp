// Speculative decoding in the engine (issue 21), CPU fp32 on the bundled tiny model: with
// n-gram drafts, greedy outputs are token for token those without speculation, drafts are
// both accepted and rejected (so rollbacks really happen), requests near dense_len verify
// across it, stop tokens and max_new_tokens end a verify call's tokens where they should, and
// nothing leaks.
#include <gtest/gtest.h>

#include <cstdio>

#include "engine_test_util.h"

namespace sala {
namespace {

// Prompts the n-gram drafter finds matches in: a repeated phrase (copy-like), a random one,
// and lengths that start below dense_len (256) and generate across it.
std::vector<int32_t> repeating_prompt(int n, uint32_t seed) {
  const auto phrase = make_prompt(13, seed);
  std::vector<int32_t> p{1};
  while (int(p.size()) < n) p.insert(p.end(), phrase.begin() + 1, phrase.end());
  p.resize(size_t(n));
  return p;
}

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

// The requests one after another (each alone in its steps: the CPU's per-row GEMVs make its
// rows bit-identical with and without drafts) or all at once.
// keep_rows: rollbacks advance the state from kept rows (else the rows are computed again).
// min_accept: NgramDrafter's threshold (0: every lookup's drafts proposed).
Outputs run(int32_t drafts, const std::vector<GenerationRequest>& reqs, bool together,
            bool keep_rows = true,
            double min_accept = SpeculativeOptions{}.ngram_min_accept) {
  EngineSetup s;
  s.keep_rows = keep_rows;
  s.opts.speculative.ngram_min_accept = min_accept;
  s.step_tokens = 512;
  s.opts.chunked_prefill_size = 64;
  s.opts.speculative.num_draft_tokens = drafts;
  auto e = start(s);
  Outputs r;
  if (together) {
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (const auto& g : reqs) hs.push_back(e->submit(g));
    for (auto& h : hs) r.tokens.push_back(collect(*h).tokens);
  } else {
    for (const auto& g : reqs) r.tokens.push_back(collect(*e->submit(g)).tokens);
  }
  expect_idle(*e);
  r.stats = e->stats();
  return r;
}

std::vector<GenerationRequest> requests() {
  std::vector<GenerationRequest> reqs;
  const int lens[] = {40, 120, 230, 250, 300};
  for (int i = 0; i < 5; ++i) {
    reqs.push_back(greedy(repeating_prompt(lens[i], 70 + uint32_t(i)), 48));
    reqs.push_back(greedy(make_prompt(lens[i], 90 + uint32_t(i)), 48));
  }
  return reqs;
}

TEST(Speculative, GreedyOutputUnchanged) {
  const auto reqs = requests();
  const Outputs plain = run(0, reqs, false);
  for (int32_t k : {1, 4, 8}) {
    const Outputs spec = run(k, reqs, false);
    // The same with rollbacks that compute the rows again (a rollback leaves no trace either
    // way). A rollback that keeps a >= 1 drafts then spends a call of a + 2 rows on one more
    // token, where the state advance lets the next call verify drafts again: with k >= 4 and
    // every lookup drafting (so that both runs draft alike) fewer steps (with k = 1 every
    // rollback keeps no draft, and the counts are close).
    const Outputs recompute = run(k, reqs, false, false);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(recompute.tokens[i], plain.tokens[i]) << "recompute, k " << k << ", request " << i;
    EXPECT_GT(recompute.stats.spec_rollbacks, 0);
    if (k == 4) {
      const Outputs advance_all = run(k, reqs, false, true, 0.0);
      const Outputs recompute_all = run(k, reqs, false, false, 0.0);
      for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(advance_all.tokens[i], plain.tokens[i]) << "every lookup drafting, request " << i;
      EXPECT_LT(advance_all.stats.steps, recompute_all.stats.steps);
    }
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "k " << k << ", request " << i;
    const EngineStats& st = spec.stats;
    std::printf("k %d: %lld verify calls, %lld drafted, %lld accepted (%.2f tokens per call), "
                "%lld steps (recomputing rollbacks: %lld) vs %lld\n", k,
                (long long)st.spec_verify_calls, (long long)st.spec_drafted_tokens,
                (long long)st.spec_accepted_tokens,
                1.0 + double(st.spec_accepted_tokens) / double(std::max<int64_t>(1, st.spec_verify_calls)),
                (long long)st.steps, (long long)recompute.stats.steps, (long long)plain.stats.steps);
    EXPECT_GT(st.spec_verify_calls, 0) << "k " << k;
    EXPECT_GT(st.spec_accepted_tokens, 0) << "k " << k << ": no draft was ever accepted";
    EXPECT_GT(st.spec_drafted_tokens, st.spec_accepted_tokens) << "k " << k << ": no rollback";
    EXPECT_LT(st.steps, plain.stats.steps) << "k " << k << ": speculation saved no step";
    EXPECT_EQ(st.generated_tokens_total, plain.stats.generated_tokens_total);
  }
  EXPECT_EQ(plain.stats.spec_verify_calls, 0);
}

// Several requests verifying in the same steps. Steps of more than 16 rows take the CPU's
// sgemm, whose rows may differ from the per-row GEMV in the last bits (batched == alone holds
// only to rounding on the CPU, with or without speculation), so a near-tie may pick another
// token: at most one of the ten requests may differ from its plain run alone.
TEST(Speculative, BatchedVerifyCallsMatchAloneUpToCpuRounding) {
  const auto reqs = requests();
  const Outputs spec = run(4, reqs, true);
  EXPECT_GT(spec.stats.spec_accepted_tokens, 0);
  const Outputs alone = run(0, reqs, false);
  size_t equal = 0;
  for (size_t i = 0; i < reqs.size(); ++i) equal += spec.tokens[i] == alone.tokens[i];
  std::printf("batched speculative == alone plain: %zu of %zu requests\n", equal, reqs.size());
  EXPECT_GE(equal, reqs.size() - 1);
}

TEST(Speculative, StopTokenAndLengthEndTheVerifiedTokens) {
  const auto reqs = requests();
  const Outputs plain = run(0, reqs, false);
  // A stop token that greedy decoding meets midway (the 20th generated token of request 0):
  // the speculative run must end exactly there, with nothing after it.
  std::vector<GenerationRequest> stop = {reqs[0]};
  const int32_t tok = plain.tokens[0][19];
  stop[0].sampling.stop_token_ids = {tok};
  size_t first = 0;
  while (plain.tokens[0][first] != tok) ++first;
  const Outputs got = run(6, stop, false);
  EXPECT_EQ(got.tokens[0], std::vector<int32_t>(plain.tokens[0].begin(), plain.tokens[0].begin() + long(first)));
  // max_new_tokens inside what a verify call could accept.
  std::vector<GenerationRequest> few = {reqs[0], reqs[2]};
  for (auto& g : few) g.sampling.max_new_tokens = 7;
  const Outputs g7 = run(8, few, false);
  EXPECT_EQ(g7.tokens[0], std::vector<int32_t>(plain.tokens[0].begin(), plain.tokens[0].begin() + 7));
  EXPECT_EQ(g7.tokens[1], std::vector<int32_t>(plain.tokens[2].begin(), plain.tokens[2].begin() + 7));
}

// Preemption in the middle of speculation (a pool too small for all requests): drafts of a
// preempted request are dropped, its recompute starts from its kept tokens, and every output
// is still the plain one.
TEST(Speculative, PreemptedEqualsUninterrupted) {
  const auto reqs = requests();
  EngineSetup s;
  s.pages = 40;  // 640 tokens of KV for 10 requests of 88..348 tokens
  s.step_tokens = 512;
  s.opts.chunked_prefill_size = 64;
  s.opts.speculative.num_draft_tokens = 4;
  auto e = start(s);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& g : reqs) hs.push_back(e->submit(g));
  std::vector<std::vector<int32_t>> got;
  for (auto& h : hs) got.push_back(collect(*h).tokens);
  expect_idle(*e);
  const EngineStats st = e->stats();
  std::printf("%lld preemptions, %lld verify calls\n", (long long)st.preemptions,
              (long long)st.spec_verify_calls);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.spec_accepted_tokens, 0);
  const Outputs plain = run(0, reqs, false);
  size_t equal = 0;
  for (size_t i = 0; i < reqs.size(); ++i) equal += got[i] == plain.tokens[i];
  // Batched steps of > 16 rows round differently on the CPU (see above): at most one differs.
  EXPECT_GE(equal, reqs.size() - 1);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].size(), plain.tokens[i].size());
}

// Sampled requests (temperature > 0) speculate too (Sampler::sample_draft): drafts are
// accepted and rejected, the same seed gives the same tokens run to run, and the tokens'
// distribution is the model's (SampleDraft.ReturnsTheRowsDistribution; the random stream is
// used differently, so the tokens of one seed differ from the run without speculation).
// Requests with penalties never draft.
TEST(Speculative, SampledRequestsSpeculateReproducibly) {
  std::vector<GenerationRequest> reqs;
  for (uint32_t i = 0; i < 4; ++i) {
    GenerationRequest g = greedy(repeating_prompt(100 + 20 * int(i), 5 + i), 32);
    g.sampling.temperature = 0.3f;
    g.sampling.top_p = 0.9f;
    g.sampling.seed = 7 + i;
    reqs.push_back(g);
  }
  const Outputs a = run(4, reqs, false), b = run(4, reqs, true);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(a.tokens[i], b.tokens[i]) << "request " << i;
  EXPECT_GT(a.stats.spec_accepted_tokens, 0);
  EXPECT_GT(a.stats.spec_drafted_tokens, a.stats.spec_accepted_tokens);
  GenerationRequest pen = reqs[0];
  pen.sampling.repetition_penalty = 1.2f;
  EXPECT_EQ(run(4, {pen}, false).stats.spec_verify_calls, 0);
}

}  // namespace
}  // namespace sala
