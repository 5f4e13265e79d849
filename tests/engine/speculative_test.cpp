// The n-gram drafter and greedy acceptance of speculative decoding (engine/speculative.h).
#include "engine/speculative.h"

#include <gtest/gtest.h>

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

TEST(NgramDraft, RepeatedTokenDraftsItself) {
  // The latest earlier occurrence of the longest suffix (3 3 3 at 0..2) leaves one token.
  EXPECT_EQ(ngram_draft({3, 3, 3, 3}, 2, 1, 4), (V{3}));
}

TEST(AcceptedPrefix, StopsAtTheFirstDifference) {
  const int32_t drafts[] = {4, 5, 6, 7};
  const int32_t all[] = {4, 5, 6, 7, 8};
  const int32_t two[] = {4, 5, 9, 7, 8};
  const int32_t none[] = {1, 5, 6, 7, 8};
  EXPECT_EQ(accepted_prefix(drafts, 4, all), 4);
  EXPECT_EQ(accepted_prefix(drafts, 4, two), 2);
  EXPECT_EQ(accepted_prefix(drafts, 4, none), 0);
  EXPECT_EQ(accepted_prefix(drafts, 0, none), 0);
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

}  // namespace
}  // namespace sala
