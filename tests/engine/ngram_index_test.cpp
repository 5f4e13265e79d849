// NgramIndex (engine/ngram_index.h) against ngram_draft, the scan it replaces: the same drafts
// at every step of growing sequences, whatever part of them is indexed yet.
#include "engine/ngram_index.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "engine/scheduler.h"
#include "engine/speculative.h"

namespace sala {
namespace {

// Tokens of `vocab` kinds, Zipf-like frequencies (as text), with copies of earlier spans (as a
// prompt a model quotes from) so that long matches occur.
class TokenSource {
 public:
  TokenSource(int32_t vocab, uint64_t seed) : rng_(seed) {
    std::vector<double> w(static_cast<size_t>(vocab));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0 / double(i + 3);
    dist_ = std::discrete_distribution<int32_t>(w.begin(), w.end());
  }
  // Appends `count` tokens to t.
  void append(std::vector<int32_t>& t, int64_t count) {
    while (count > 0) {
      if (t.size() > 8 && std::uniform_int_distribution<int>(0, 9)(rng_) == 0) {
        const int64_t len = std::min<int64_t>(
            {count, int64_t(t.size()), std::uniform_int_distribution<int64_t>(1, 12)(rng_)});
        const int64_t from =
            std::uniform_int_distribution<int64_t>(0, int64_t(t.size()) - len)(rng_);
        for (int64_t i = 0; i < len; ++i) t.push_back(int32_t{t[size_t(from + i)]});
        count -= len;
      } else {
        t.push_back(dist_(rng_));
        --count;
      }
    }
  }
  int32_t uniform(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng_); }

 private:
  std::mt19937_64 rng_;
  std::discrete_distribution<int32_t> dist_;
};

struct Case {
  int32_t vocab, ngram_min, ngram_max;
  int64_t budget;
};

TEST(NgramIndex, SameDraftsAsTheScanAsTokensGrow) {
  const Case cases[] = {{2, 1, 4, 8192}, {5, 1, 4, 1},   {5, 2, 4, 7},   {50, 1, 4, 0},
                        {50, 1, 1, 3},   {50, 3, 6, 64}, {300, 1, 4, 5}, {73448, 1, 4, 8192},
                        {73448, 2, 3, 2}};
  int64_t calls = 0, drafts = 0, unique = 0;
  for (const Case& c : cases) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      TokenSource src(c.vocab, seed * 7919 + uint64_t(c.vocab));
      std::vector<int32_t> tokens;
      src.append(tokens, src.uniform(0, 300));  // the prompt
      NgramIndex index(c.ngram_min, c.ngram_max);
      for (int step = 0; step < 150; ++step) {
        const int32_t k = src.uniform(0, 6);
        NgramMatch want_match, got_match;
        const std::vector<int32_t> want =
            ngram_draft(tokens, k, c.ngram_min, c.ngram_max, &want_match);
        ASSERT_EQ(index.draft(tokens, k, c.budget, &got_match), want)
            << "vocab " << c.vocab << ", n-grams " << c.ngram_min << ".." << c.ngram_max
            << ", budget " << c.budget << ", seed " << seed << ", step " << step << ", "
            << tokens.size() << " tokens";
        ASSERT_EQ(got_match.len, want_match.len) << "step " << step;
        ASSERT_EQ(got_match.unique, want_match.unique) << "step " << step;
        ++calls;
        drafts += !want.empty();
        unique += !want.empty() && want_match.unique;
        src.append(tokens, src.uniform(1, 5));  // a bonus token and accepted drafts
      }
      EXPECT_LE(index.indexed_len(), int64_t(tokens.size()));
    }
  }
  std::printf("%lld calls, %lld with drafts, %lld of them from a unique match\n",
              (long long)calls, (long long)drafts, (long long)unique);
  EXPECT_GT(drafts, calls / 2);
  EXPECT_LT(drafts, calls);  // and some calls found no match
  EXPECT_GT(unique, 0);      // both kinds of match occur
  EXPECT_LT(unique, drafts);
}

TEST(NgramIndex, FewerTokensThanIndexedStartOver) {
  TokenSource src(20, 5);
  std::vector<int32_t> a, b;
  src.append(a, 2000);
  src.append(b, 500);
  NgramIndex index(1, 4);
  EXPECT_EQ(index.draft(a, 4), ngram_draft(a, 4, 1, 4));
  EXPECT_EQ(index.indexed_len(), 1999);
  EXPECT_EQ(index.draft(b, 4), ngram_draft(b, 4, 1, 4));
  EXPECT_EQ(index.indexed_len(), 499);
  EXPECT_GT(index.bytes(), size_t(0));
}

TEST(NgramIndex, DrafterKeepsOneIndexPerRequestUntilReleased) {
  NgramDrafter drafter(1, 4, 0);
  Sequence s1, s2;
  s1.id = 1;
  s2.id = 2;
  s1.tokens = {1, 7, 8, 2, 3, 7, 8, 9, 5, 6, 7, 8};
  s2.tokens = {4, 5, 6, 4, 5};
  std::vector<std::vector<int32_t>> out;
  drafter.propose({{&s1, 2, {}}, {&s2, 8, {}}}, out);
  ASSERT_EQ(out.size(), size_t(2));
  EXPECT_EQ(out[0], (std::vector<int32_t>{9, 5}));
  EXPECT_EQ(out[1], (std::vector<int32_t>{6, 4, 5}));
  EXPECT_EQ(drafter.num_indexes(), size_t(2));
  s1.tokens.push_back(9);
  drafter.propose({{&s1, 3, {}}}, out);
  EXPECT_EQ(out[0], (std::vector<int32_t>{5, 6, 7}));
  drafter.release(s1);
  EXPECT_EQ(drafter.num_indexes(), size_t(1));
  drafter.release(s2);
  EXPECT_EQ(drafter.num_indexes(), size_t(0));
}

// NgramDrafter proposes j drafts while P_j (the chance that the first j pass) >= min_accept,
// and none unless sum of P_j >= kVerifyCallCost. Every lookup is scored by the tokens its
// request produces next, proposed or not: p(m), the engine-wide rate of drafts found by a
// suffix match m (length, unique or repeated; prior 3 of 4), falls while such lookups fail and
// rises again when they pass, without drafts proposed to measure it; other matches keep
// theirs; draft i is scored under the match it extends (chained); a request's own counts weigh
// against p(m) as kRequestPrior drafts.
TEST(NgramIndex, DrafterProposesByMeasuredAcceptance) {
  NgramDrafter drafter(1, 4, 0.05);
  ASSERT_DOUBLE_EQ(NgramDrafter::kVerifyCallCost, 0.2);  // the counts below assume it
  const std::vector<int32_t> one = {5, 1, 2, 3, 4, 9, 5};  // suffix {5} matches at 0: n = 1
  const NgramMatch u1{1, true}, u2{2, true}, u3{3, true}, r1{1, false};
  uint64_t next_id = 1;
  std::vector<std::vector<int32_t>> out;
  auto drafts = [&](Sequence& s) {
    drafter.propose({{&s, 4, {}}}, out);
    return out[0].size();
  };
  // A request that looks up once, produces `produced`, and ends.
  auto request = [&](const std::vector<int32_t>& produced) {
    Sequence s;
    s.id = next_id++;
    s.tokens = one;
    const size_t d = drafts(s);
    s.tokens.insert(s.tokens.end(), produced.begin(), produced.end());
    drafter.release(s);
    return d;
  };
  EXPECT_DOUBLE_EQ(drafter.accept_rate(u1), 0.75);
  EXPECT_EQ(drafter.chained(u1, 2).len, 3);
  EXPECT_EQ(drafter.chained(u3, 5).len, 4);  // capped at ngram_max
  // Requests whose first draft ({1, 2, 3, 4}: 1) fails. After n of them p(1, unique) =
  // 3 / (4 + n) and P_j = p(1, unique) · 0.75^(j - 1): 4 drafts while P_4 >= 0.05 (n <= 21),
  // 3 while P_3 >= 0.05 (n <= 29, where P_1 + P_2 + P_3 = 0.21), then at n = 30 P_3 < 0.05
  // and P_1 + P_2 = 0.154 < 0.2: none.
  std::vector<size_t> sizes;
  for (size_t d; (d = request({7})) > 0;) {
    sizes.push_back(d);
    ASSERT_LT(sizes.size(), 100u);
  }
  ASSERT_EQ(sizes.size(), 30u);
  EXPECT_EQ(sizes[21], 4u);
  EXPECT_EQ(sizes[22], 3u);
  EXPECT_EQ(sizes[29], 3u);
  EXPECT_DOUBLE_EQ(drafter.accept_rate(u1), 3.0 / 35.0);  // the refused lookup scored too
  EXPECT_DOUBLE_EQ(drafter.accept_rate(u2), 0.75);         // only first drafts were tested
  Sequence two;
  two.id = next_id++;
  two.tokens = {7, 5, 1, 2, 3, 4, 9, 7, 5};  // suffix {7, 5} matches at 1: n = 2
  EXPECT_EQ(drafts(two), 4u);                // another match length: unaffected
  drafter.release(two);                      // produced nothing: nothing scored
  Sequence twice;
  twice.id = next_id++;
  twice.tokens = {5, 1, 2, 5, 1, 6, 9, 5};  // {5} occurred twice: a repeated match
  EXPECT_EQ(drafts(twice), 4u);             // its own rate
  drafter.release(twice);
  EXPECT_DOUBLE_EQ(drafter.accept_rate(r1), 0.75);

  // A request whose refused lookup it then follows raises its own estimate above p(1).
  Sequence r;
  r.id = next_id++;
  r.tokens = one;
  EXPECT_EQ(drafts(r), 0u);
  r.tokens.push_back(1);
  r.tokens.push_back(2);  // the refused draft's first two tokens
  EXPECT_EQ(drafts(r), 4u);  // now {…, 5, 1, 2} matches 3 tokens
  const double p1 = drafter.accept_rate(u1);
  EXPECT_DOUBLE_EQ(p1, 4.0 / 36.0);  // the first draft passed
  EXPECT_DOUBLE_EQ(drafter.accept_rate(u2), 4.0 / 5.0);  // so did the second, under n = 2
  EXPECT_NEAR(drafter.request_accept_rate(r, u1),
              (2 + NgramDrafter::kRequestPrior * p1) / (2 + NgramDrafter::kRequestPrior), 1e-12);
  EXPECT_GT(drafter.request_accept_rate(r, u1), p1);
  drafter.release(r);

  // Requests whose produced tokens follow their lookups bring p(1, unique) back up.
  for (int passing = 0; request({1, 2, 3, 4}) < 4; ++passing) ASSERT_LT(passing, 40);
  EXPECT_GT(drafter.accept_rate(u1), p1);
}

// Without a threshold every match drafts all it found.
TEST(NgramIndex, DrafterWithoutThresholdAlwaysDrafts) {
  NgramDrafter drafter(1, 4, 0);
  Sequence s;
  s.id = 1;
  s.tokens = {5, 1, 2, 3, 4, 9, 5};
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 50; ++i) {
    drafter.propose({{&s, 3, {}}}, out);
    ASSERT_EQ(out[0], (std::vector<int32_t>{1, 2, 3}));
    drafter.settle(s, 3, 0, true);
  }
}

// planned() indexes an eligible request's prefill chunks (not verify calls, not ineligible
// requests), so that its first draft finds the prompt indexed.
TEST(NgramIndex, DrafterIndexesPrefillChunks) {
  NgramDrafter drafter(1, 4, 0);
  TokenSource src(40, 3);
  Sequence a, b, v;
  a.id = 1;
  b.id = 2;
  v.id = 3;
  src.append(a.tokens, 5000);
  b.tokens = a.tokens;
  src.append(v.tokens, 300);
  a.num_computed = 2048;  // the second chunk of a's prompt
  v.num_computed = 296;   // a verify call: its last token and 3 drafts
  v.spec.drafts = 3;
  SchedulePlan plan;
  plan.items = {{&a, 2048, false}, {&b, 2048, false}, {&v, 4, true}};
  const DraftPolicyFn policy = [&](const Sequence& s) {
    return DraftPolicy{s.id != b.id, 4, nullptr, 0};
  };
  drafter.planned(plan, policy);
  ASSERT_NE(drafter.index(a), nullptr);
  EXPECT_EQ(drafter.index(a)->indexed_len(), 4096);
  EXPECT_EQ(drafter.index(b), nullptr);  // not eligible
  EXPECT_EQ(drafter.index(v), nullptr);  // its tokens hold drafts
  a.num_computed = 4096;
  plan.items = {{&a, 904, true}};
  drafter.planned(plan, policy);
  EXPECT_EQ(drafter.index(a)->indexed_len(), 4999);  // every end with a follower
  std::vector<std::vector<int32_t>> out;
  drafter.propose({{&a, 4, {}}}, out);
  EXPECT_EQ(out[0], ngram_draft(a.tokens, 4, 1, 4));
  EXPECT_EQ(drafter.index(a)->indexed_len(), 4999);
}

// A 512K-token prompt (the workload's longest): once indexed (64 steps at the default
// budget), a step's lookup no longer scans. Prints the costs; asserts the drafts and that the
// index caught up.
TEST(NgramIndex, LongPromptIsIndexedWithinBoundedSteps) {
  TokenSource src(73448, 11);
  std::vector<int32_t> tokens;
  src.append(tokens, 524288);
  NgramIndex index(1, 4);
  using clock = std::chrono::steady_clock;
  const int steps = 100, indexing = int(524288 / NgramIndex::kDefaultBudget);
  double scan_us = 0, indexing_us = 0, indexed_us = 0;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = clock::now();
    const std::vector<int32_t> want = ngram_draft(tokens, 4, 1, 4);
    const auto t1 = clock::now();
    const std::vector<int32_t> got = index.draft(tokens, 4);
    const auto t2 = clock::now();
    ASSERT_EQ(got, want) << "step " << step;
    scan_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
    (step < indexing ? indexing_us : indexed_us) +=
        std::chrono::duration<double, std::micro>(t2 - t1).count();
    if (step == indexing) EXPECT_EQ(index.indexed_len(), int64_t(tokens.size()) - 1);
    src.append(tokens, 1);
  }
  std::printf("%zu tokens: scan %.1f us per step; index %.1f us per step in the first %d, then "
              "%.2f us; %.1f MB\n",
              tokens.size(), scan_us / steps, indexing_us / indexing, indexing,
              indexed_us / (steps - indexing), double(index.bytes()) / 1e6);
}

}  // namespace
}  // namespace sala
