// The n-gram drafter and the adaptive draft length of speculative decoding
// (engine/speculative.h), and speculative sampling of a drafted token (Sampler::sample_draft).
#include "engine/speculative.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/minicpm_sala.h"

namespace sala {
namespace {

using V = std::vector<int32_t>;

TEST(NgramDraft, LongestLatestSuffixMatch) {
  // Suffix "7 8": its latest earlier occurrence is followed by 9 5.
  EXPECT_EQ(ngram_draft({1, 7, 8, 2, 3, 7, 8, 9, 5, 6, 7, 8}, 2, 1, 4), (V{9, 5}));
  // k longer than what follows: up to the end of the tokens.
  EXPECT_EQ(ngram_draft({4, 5, 6, 4, 5}, 8, 1, 4), (V{6, 4, 5}));
  // A longer match wins over a later shorter one: "1 2 3" at 0 beats "3" at 5.
  EXPECT_EQ(ngram_draft({1, 2, 3, 10, 11, 3, 12, 1, 2, 3}, 2, 1, 4), (V{10, 11}));
  // Of equally long matches, the latest.
  EXPECT_EQ(ngram_draft({5, 1, 5, 2, 5}, 1, 1, 4), (V{2}));
}

TEST(NgramDraft, NoMatchNoDraft) {
  EXPECT_TRUE(ngram_draft({1, 2, 3, 4}, 4, 1, 4).empty());
  EXPECT_TRUE(ngram_draft({9}, 4, 1, 4).empty());
  EXPECT_TRUE(ngram_draft({}, 4, 1, 4).empty());
  EXPECT_TRUE(ngram_draft({1, 2, 1}, 0, 1, 4).empty());
  // A match shorter than ngram_min does not count.
  EXPECT_TRUE(ngram_draft({1, 2, 9, 3, 2}, 2, 2, 4).empty());
  EXPECT_EQ(ngram_draft({1, 2, 9, 3, 1, 2}, 2, 2, 4), (V{9, 3}));
}

// The match: its length, and whether that n-gram occurred exactly once before the suffix.
TEST(NgramDraft, MatchLengthAndUniqueness) {
  auto match = [](const V& tokens, int32_t ngram_min = 1) {
    NgramMatch m;
    ngram_draft(tokens, 4, ngram_min, 4, &m);
    return std::pair{m.len, m.unique};
  };
  EXPECT_EQ(match({1, 7, 8, 2, 3, 7, 8, 9, 5, 6, 7, 8}), std::pair(2, false));  // "7 8" twice
  EXPECT_EQ(match({4, 5, 6, 4, 5}), std::pair(2, true));
  // The longest match's n-gram counts, not its shorter suffixes: "3" occurred twice.
  EXPECT_EQ(match({1, 2, 3, 10, 11, 3, 12, 1, 2, 3}), std::pair(3, true));
  EXPECT_EQ(match({5, 1, 5, 2, 5}), std::pair(1, false));
  EXPECT_EQ(match({3, 3, 3, 3}), std::pair(3, true));   // "3 3 3" ends once, at 2
  EXPECT_EQ(match({3, 3, 3, 3, 3, 3}), std::pair(4, false));  // "3 3 3 3" at 3 and 4
  EXPECT_EQ(match({1, 2, 3, 4}), std::pair(0, false));  // no match
  EXPECT_EQ(match({1, 2, 9, 3, 2}, 2), std::pair(0, false));  // shorter than ngram_min
}

TEST(NgramDraft, RepeatedTokenDraftsItself) {
  // The latest earlier occurrence of the longest suffix (3 3 3 at 0..2) leaves one token.
  EXPECT_EQ(ngram_draft({3, 3, 3, 3}, 2, 1, 4), (V{3}));
}

// Which rows of a call return logits: a verify call all of them, a recompute after a
// rollback all of them while it is short (a CUDA graph like a verify call), anything else its
// last row, and a call that does not sample none.
TEST(CallLogitRows, VerifyAndRecomputeCallsReturnEveryRow) {
  Sequence s;
  s.tokens.assign(40, 7);
  s.num_computed = 35;
  ScheduledSeq it{&s, 5, true};
  EXPECT_EQ(call_logit_rows(it), 1);  // a plain chunk of 5 rows
  s.spec.drafts = 4;
  EXPECT_EQ(call_logit_rows(it), 5);  // the pending token and 4 drafts
  s.spec.drafts = 0;
  s.spec.recompute = true;
  EXPECT_EQ(call_logit_rows(it), 5);  // rolled-back rows computed again
  it.num_tokens = Model::kGraphMaxCallRows + 1;
  s.num_computed = 40 - it.num_tokens;
  EXPECT_EQ(call_logit_rows(it), 1);  // too long to be recorded
  it.num_tokens = 5;
  s.num_computed = 0;
  EXPECT_EQ(call_logit_rows(it), 1);  // a preempted request's prefill from the start
  it.sample = false;
  s.num_computed = 35;
  EXPECT_EQ(call_logit_rows(it), 0);  // a chunk that does not reach the end
}

TEST(AdaptDraftLen, GrowsOnFullAcceptanceShrinksOnRejection) {
  SpecState s;
  s.draft_len = 4;
  adapt_draft_len(s, 4, 4, 6);
  EXPECT_EQ(s.draft_len, 5);
  adapt_draft_len(s, 5, 5, 6);
  adapt_draft_len(s, 6, 6, 6);
  EXPECT_EQ(s.draft_len, 6);  // capped
  adapt_draft_len(s, 6, 2, 6);
  EXPECT_EQ(s.draft_len, 3);
  adapt_draft_len(s, 3, 0, 6);
  EXPECT_EQ(s.draft_len, 1);  // never 0: a later match may still pay
  adapt_draft_len(s, 0, 0, 6);
  EXPECT_EQ(s.draft_len, 1);  // nothing drafted: unchanged
}

// Verify calls that accept nothing pause drafting for 1, 2, 4, ... kMaxDraftPause steps from
// the second in a row on; an accepted draft ends the pauses.
TEST(AdaptDraftLen, PausesAfterCallsThatAcceptNothing) {
  SpecState s;
  s.draft_len = 4;
  adapt_draft_len(s, 4, 0, 4);
  EXPECT_EQ(s.pause, 0);  // one miss: draft again at once
  std::vector<int32_t> pauses;
  for (int i = 0; i < 9; ++i) {
    adapt_draft_len(s, 1, 0, 4);
    pauses.push_back(s.pause);
  }
  EXPECT_EQ(pauses, (std::vector<int32_t>{1, 2, 4, 8, 16, 32, 64, 64, 64}));
  adapt_draft_len(s, 1, 1, 4);
  EXPECT_EQ(s.pause, 0);
  EXPECT_EQ(s.misses, 0);
  adapt_draft_len(s, 2, 0, 4);
  EXPECT_EQ(s.pause, 0);
}

// The token sample_draft returns is distributed exactly as sample()'s, whatever the draft:
// accepted with p(draft), else drawn from the rest. Chi-square over 200,000 draws per case
// (8 tokens; top-p and min-p cases give some tokens probability 0, which must never appear).
TEST(SampleDraft, ReturnsTheRowsDistribution) {
  const std::vector<float> row = {2.0f, 1.5f, 0.3f, -1.0f, 1.9f, 0.0f, -3.0f, 1.0f};
  const int32_t V = int32_t(row.size());
  struct Case {
    SamplingParams p;
    int32_t draft;
  };
  std::vector<Case> cases;
  for (int32_t draft : {0, 3, 6, 7}) {
    SamplingParams p;
    p.temperature = 0.9f;
    cases.push_back({p, draft});
    p.top_p = 0.7f;
    cases.push_back({p, draft});
    p.top_p = 1.0f;
    p.min_p = 0.2f;
    p.top_k = 5;
    cases.push_back({p, draft});
  }
  Sampler sampler;
  for (const Case& c : cases) {
    // The reference distribution: sample() many times from seeds 0.. (the same rows).
    std::vector<double> want(static_cast<size_t>(V), 0.0), got(static_cast<size_t>(V), 0.0);
    const int n = 200000;
    SamplerState a, b;
    SamplingParams pa = c.p, pb = c.p;
    pa.seed = 11;
    pb.seed = 12;
    a.init(pa, {}, V);
    b.init(pb, {}, V);
    int64_t accepted = 0;
    for (int i = 0; i < n; ++i) {
      std::vector<float> l1 = row, l2 = row;
      want[size_t(sampler.sample(l1.data(), V, pa, a))] += 1;
      bool acc = false;
      got[size_t(sampler.sample_draft(l2.data(), V, pb, b, c.draft, acc))] += 1;
      accepted += acc;
    }
    double chi2 = 0;
    int dof = -1;
    for (int32_t t = 0; t < V; ++t) {
      if (want[size_t(t)] == 0) {
        EXPECT_EQ(got[size_t(t)], 0) << "token " << t << " has probability 0";
        continue;
      }
      const double e = want[size_t(t)];
      chi2 += (got[size_t(t)] - e) * (got[size_t(t)] - e) / (2 * e);  // two samples
      ++dof;
    }
    // p < 1e-4 bound for up to 7 degrees of freedom (critical value 27.9).
    EXPECT_LT(chi2, 27.9) << "draft " << c.draft << " top_p " << c.p.top_p << " min_p " << c.p.min_p;
    // The draft was accepted as often as the distribution gives it.
    EXPECT_NEAR(double(accepted) / n, want[size_t(c.draft)] / n, 0.01) << "draft " << c.draft;
  }
}

// A draft model's proposal (Sampler::sample_proposal on the draft's row, q its distribution)
// verified by sample_draft with that q: the returned token is distributed exactly as
// sample()'s on the target row, whatever q, and the draft is accepted with probability
// sum_i min(p_i, q_i). Chi-square over 200,000 draws per case; q narrower than p (top-k),
// wider (p with top-p), close to p and far from it; p's zero-probability tokens never appear.
TEST(SampleDraft, DraftModelProposalKeepsTheRowsDistribution) {
  const std::vector<float> row = {2.0f, 1.5f, 0.3f, -1.0f, 1.9f, 0.0f, -3.0f, 1.0f};
  const std::vector<std::vector<float>> draft_rows = {
      {1.8f, 1.6f, 0.5f, -0.5f, 1.2f, 0.1f, -2.0f, 1.1f},   // close to the target
      {-1.0f, 0.0f, 2.5f, 2.0f, -1.0f, 1.0f, 1.5f, -2.0f},  // far from it
  };
  const int32_t V = int32_t(row.size());
  struct Case {
    SamplingParams p, q;  // the target's and the draft's sampling
    size_t draft_row;
  };
  std::vector<Case> cases;
  for (size_t dr = 0; dr < draft_rows.size(); ++dr) {
    SamplingParams p;
    p.temperature = 0.9f;
    cases.push_back({p, p, dr});
    SamplingParams narrow = p;
    narrow.top_k = 2;
    cases.push_back({p, narrow, dr});
    SamplingParams tp = p;
    tp.top_p = 0.7f;
    cases.push_back({tp, p, dr});
    SamplingParams mp = p;
    mp.min_p = 0.2f;
    mp.top_k = 5;
    cases.push_back({mp, mp, dr});
  }
  Sampler sampler;
  for (const Case& c : cases) {
    std::vector<double> want(size_t(V), 0.0), got(size_t(V), 0.0);
    const int n = 200000;
    SamplingParams pa = c.p, pb = c.p, pq = c.q;
    pa.seed = 21;
    pb.seed = 22;
    pq.seed = 23;
    SamplerState a, b, sq;
    a.init(pa, {}, V);
    b.init(pb, {}, V);
    sq.init(pq, {}, V);
    // The exact p and q, for the expected acceptance rate.
    std::vector<float> pd(static_cast<size_t>(V)), qd(static_cast<size_t>(V)), tmp = row;
    SamplerState scratch;
    scratch.init(pa, {}, V);
    sampler.sample_proposal(tmp.data(), V, pa, scratch, pd.data());
    tmp = draft_rows[c.draft_row];
    sampler.sample_proposal(tmp.data(), V, pq, scratch, qd.data());
    double overlap = 0;
    for (int32_t t = 0; t < V; ++t) overlap += std::min(pd[size_t(t)], qd[size_t(t)]);
    int64_t accepted = 0;
    std::vector<float> q(static_cast<size_t>(V));
    for (int i = 0; i < n; ++i) {
      std::vector<float> l1 = row, l2 = row, l3 = draft_rows[c.draft_row];
      want[size_t(sampler.sample(l1.data(), V, pa, a))] += 1;
      const int32_t draft = sampler.sample_proposal(l3.data(), V, pq, sq, q.data());
      EXPECT_GT(q[size_t(draft)], 0.0f);
      bool acc = false;
      got[size_t(sampler.sample_draft(l2.data(), V, pb, b, draft, acc, q.data()))] += 1;
      accepted += acc;
    }
    double chi2 = 0;
    for (int32_t t = 0; t < V; ++t) {
      if (want[size_t(t)] == 0) {
        EXPECT_EQ(got[size_t(t)], 0) << "token " << t << " has probability 0";
        continue;
      }
      const double e = want[size_t(t)];
      chi2 += (got[size_t(t)] - e) * (got[size_t(t)] - e) / (2 * e);  // two samples
    }
    EXPECT_LT(chi2, 27.9) << "draft row " << c.draft_row << " q top_k " << c.q.top_k
                          << " p top_p " << c.p.top_p << " min_p " << c.p.min_p;
    EXPECT_NEAR(double(accepted) / n, overlap, 0.01) << "draft row " << c.draft_row;
  }
}

}  // namespace
}  // namespace sala
