// The draft model of STANDALONE speculation (engine/draft_model.h), driven directly as the
// engine drives it: a rollback leaves no trace in the draft model's lightning state, KV rows
// or compressed keys (its next proposal distribution is bit for bit that of a draft model
// that never drafted, below and above dense_len), and its pages and slots are freed on
// preemption and release.
#include "engine/draft_model.h"

#include <gtest/gtest.h>

#include <cstring>

#include "draft_test_util.h"
#include "engine/scheduler.h"

namespace sala {
namespace {

constexpr int32_t kPages = 64, kSlots = 4, kStep = 512, kDrafts = 4;

std::unique_ptr<DraftModelDrafter> make(const std::string& dir) {
  return std::make_unique<DraftModelDrafter>(load_draft(dir, kPages, kSlots, kStep, kDrafts),
                                             false);
}

SamplingParams sampled() {
  SamplingParams p;
  p.temperature = 0.8f;
  return p;
}
SamplingParams greedy_params() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

// The target's side of one step for the drafter: s's next `rows` rows, from num_computed.
void mirror(Drafter& d, Sequence& s, int64_t rows, const DraftPolicy& pol) {
  SchedulePlan plan;
  plan.items.push_back({&s, int32_t(rows), s.num_computed + rows == int64_t(s.tokens.size())});
  d.planned(plan, [&](const Sequence&) { return pol; });
  s.num_computed += rows;
}

struct Proposal {
  std::vector<int32_t> drafts;
  std::vector<float> q0;  // the first draft's distribution (sampled policy)
};

Proposal propose(Drafter& d, Sequence& s, const DraftPolicy& pol, int32_t vocab) {
  std::vector<std::vector<int32_t>> out;
  d.propose({{&s, kDrafts, pol}}, out);
  Proposal p{out.at(0), {}};
  if (const float* q = d.proposal(s)) p.q0.assign(q, q + vocab);
  return p;
}

// Path A drafts k tokens after the prompt, the target keeps one of them and a bonus token that
// differs from the second draft (the draft model rolls back), recomputes, and drafts again.
// Path B, a fresh draft model, is fed the kept tokens in the same calls but never drafted
// before. Their second proposals must be identical.
void check_rollback_leaves_no_trace(int prompt_len) {
  const std::string dir = perturbed_model_dir(1.0);
  const int32_t V = tiny_config().vocab_size;
  for (const SamplingParams& sp : {greedy_params(), sampled()}) {
    const DraftPolicy pol{true, kDrafts, &sp, 42};
    auto a = make(dir), b = make(dir);
    Sequence sa, sb;
    sa.id = sb.id = 1;
    sa.tokens = sb.tokens = make_prompt(prompt_len, 5);
    mirror(*a, sa, prompt_len, pol);  // the prompt: one prefill chunk
    mirror(*b, sb, prompt_len, pol);
    EXPECT_EQ(a->computed(sa), prompt_len);
    const int32_t t0 = 17;  // the token the target sampled from the prompt
    sa.tokens.push_back(t0);
    sb.tokens.push_back(t0);
    const Proposal first = propose(*a, sa, pol, V);
    ASSERT_EQ(first.drafts.size(), size_t(kDrafts));
    EXPECT_EQ(a->computed(sa), prompt_len + kDrafts);  // t0 and drafts 1..k-1 fed
    a->settle(sa, kDrafts, 1, true);  // draft 1 kept, draft 2 rejected: rolled back
    EXPECT_EQ(a->rollbacks(), 1);
    EXPECT_EQ(a->computed(sa), prompt_len + 1);
    const int32_t bonus = first.drafts[1] == 30 ? 31 : 30;
    for (Sequence* s : {&sa, &sb}) {
      s->tokens.push_back(first.drafts[0]);
      s->tokens.push_back(bonus);
    }
    // The target's recompute after its own rollback: t0, the kept draft and the bonus (B:
    // t0 is fed here too, in the same call as the others, as a never-drafting model would).
    sa.num_computed = prompt_len;
    mirror(*a, sa, 3, pol);
    mirror(*b, sb, 3, pol);
    EXPECT_EQ(a->computed(sa), prompt_len + 3);
    EXPECT_EQ(b->computed(sb), prompt_len + 3);
    for (Sequence* s : {&sa, &sb}) s->tokens.push_back(55);  // the recompute's sampled token
    const Proposal pa = propose(*a, sa, pol, V), pb = propose(*b, sb, pol, V);
    if (sp.temperature == 0) {
      EXPECT_EQ(pa.drafts, pb.drafts) << "prompt " << prompt_len;
    } else {
      ASSERT_EQ(pa.q0.size(), size_t(V));
      ASSERT_EQ(pb.q0.size(), size_t(V));
      EXPECT_EQ(std::memcmp(pa.q0.data(), pb.q0.data(), size_t(V) * sizeof(float)), 0)
          << "prompt " << prompt_len << ": the rolled-back draft model's distribution differs";
    }
    // All drafts kept: no rollback, everything fed is computed.
    a->settle(sa, kDrafts, kDrafts, true);
    EXPECT_EQ(a->rollbacks(), 1);
    EXPECT_EQ(a->computed(sa), int64_t(sa.tokens.size()) + kDrafts - 1);
  }
}

TEST(DraftModel, RollbackLeavesNoTraceDense) { check_rollback_leaves_no_trace(40); }

// Prompt 300 > dense_len 256: every call is sparse (InfLLM-v2 selection over compressed keys
// that the rejected drafts' rows completed).
TEST(DraftModel, RollbackLeavesNoTraceSparse) { check_rollback_leaves_no_trace(300); }

TEST(DraftModel, PreemptionAndReleaseFreeItsCaches) {
  auto d = make(perturbed_model_dir(1.0));
  const SamplingParams sp = greedy_params();
  const DraftPolicy pol{true, kDrafts, &sp, 1};
  Sequence s1, s2;
  s1.id = 1;
  s2.id = 2;
  s1.tokens = make_prompt(70, 1);
  s2.tokens = make_prompt(90, 2);
  mirror(*d, s1, 70, pol);
  mirror(*d, s2, 64, pol);  // a chunk of its prompt
  EXPECT_EQ(d->computed(s2), 64);
  EXPECT_EQ(d->slots_used(), 2);
  const int32_t pages = d->pages_used();
  EXPECT_GT(pages, 0);
  s1.tokens.push_back(9);
  std::vector<std::vector<int32_t>> out;
  d->propose({{&s1, 3, pol}}, out);
  EXPECT_EQ(out[0].size(), 3u);
  // s1 is preempted before its verify call: its draft caches go; settle finds nothing.
  SchedulePlan plan;
  plan.preempted.push_back(&s1);
  d->planned(plan, [&](const Sequence&) { return pol; });
  d->settle(s1, 3, 0, false);
  EXPECT_EQ(d->computed(s1), -1);
  EXPECT_EQ(d->slots_used(), 1);
  EXPECT_LT(d->pages_used(), pages);
  // Its recompute starts from nothing, chunk by chunk with the target.
  s1.num_computed = 0;
  mirror(*d, s1, 32, pol);
  EXPECT_EQ(d->computed(s1), 32);
  d->release(s1);
  d->release(s2);
  d->release(s2);  // idempotent
  EXPECT_EQ(d->slots_used(), 0);
  EXPECT_EQ(d->pages_used(), 0);
}

// Drafts whose verify call was not planned (the step's budget): the target's pending token is
// computed in the draft model, which restores its state and, in the next step (the token
// still pending), drafts the same tokens from the kept row (greedy) without feeding it again.
TEST(DraftModel, UnverifiedDraftsDraftAgainFromTheKeptRow) {
  const std::string dir = perturbed_model_dir(1.0);
  for (int32_t k : {1, 3}) {
    auto d = make(dir);
    const SamplingParams sp = greedy_params();
    const DraftPolicy pol{true, k, &sp, 1};
    Sequence s;
    s.id = 4;
    s.tokens = make_prompt(50, 4);
    mirror(*d, s, 50, pol);
    s.tokens.push_back(12);  // pending
    std::vector<std::vector<int32_t>> first, again;
    d->propose({{&s, k, pol}}, first);
    ASSERT_EQ(first[0].size(), size_t(k));
    d->settle(s, k, 0, false);  // not verified: dropped
    EXPECT_EQ(d->computed(s), 51);
    EXPECT_EQ(d->rollbacks(), k > 1 ? 1 : 0);
    d->propose({{&s, k, pol}}, again);
    EXPECT_EQ(again[0], first[0]) << "k " << k;
    // And it goes on: the target keeps the first draft and a bonus token.
    d->settle(s, k, 1, true);
    s.tokens.push_back(first[0][0]);
    s.tokens.push_back(first[0][0] == 40 ? 41 : 40);
    d->propose({{&s, k, pol}}, again);
    EXPECT_EQ(again[0].size(), size_t(k));
  }
}

// A sequence that is not eligible (logprobs, grammar, penalties) is never fed.
TEST(DraftModel, IneligibleSequencesAreNotMirrored) {
  auto d = make(perturbed_model_dir(1.0));
  Sequence s;
  s.id = 3;
  s.tokens = make_prompt(20, 3);
  mirror(*d, s, 20, DraftPolicy{});
  EXPECT_EQ(d->computed(s), -1);
  EXPECT_EQ(d->slots_used(), 0);
}

}  // namespace
}  // namespace sala
