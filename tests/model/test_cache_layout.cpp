// backend/cache_layout.h: the paged-cache arithmetic every backend and the pool sizing share.
#include "backend/cache_layout.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace sala::cache_layout {
namespace {

TEST(CacheLayout, TokensAndEntriesLandInTheirPages) {
  const int ps = 16, s1 = 4, s2 = 16;
  const int64_t row = 3;
  const std::vector<int32_t> pages = {5, 0, 2};  // a sequence's pages, in position order
  EXPECT_EQ(token_offset(pages.data(), 0, ps, row), 5 * 16 * 3);
  EXPECT_EQ(token_offset(pages.data(), 17, ps, row), (0 * 16 + 1) * 3);
  EXPECT_EQ(token_offset(pages.data(), 47, ps, row), (2 * 16 + 15) * 3);
  // Level 1: 4 entries per page; entry 5 starts at token 20 (page 1, slot 4) -> entry 1 there.
  EXPECT_EQ(entries_per_page(ps, s1), 4);
  EXPECT_EQ(entry_offset(pages.data(), 5, s1, ps, row), (0 * 4 + 1) * 3);
  EXPECT_EQ(entry_offset(pages.data(), 11, s1, ps, row), (2 * 4 + 3) * 3);
  EXPECT_EQ(entry_offset(pages.data(), 2, s2, ps, row), (2 * 1 + 0) * 3);
  // Distinct tokens / entries of the sequence never share a row.
  std::set<int64_t> seen;
  for (int64_t p = 0; p < 48; ++p) EXPECT_TRUE(seen.insert(token_offset(pages.data(), p, ps, row)).second);
  seen.clear();
  for (int64_t j = 0; j < 12; ++j) EXPECT_TRUE(seen.insert(entry_offset(pages.data(), j, s1, ps, row)).second);
  EXPECT_EQ(pages_for(0, ps), 0);
  EXPECT_EQ(pages_for(16, ps), 1);
  EXPECT_EQ(pages_for(17, ps), 2);
  EXPECT_EQ(page_index(33, ps), 2);
  EXPECT_EQ(page_slot(33, ps), 1);
}

TEST(CacheLayout, CompletedEntriesCountToNumEntries) {
  for (auto [w, s] : {std::pair{8, 4}, std::pair{32, 16}, std::pair{128, 64}}) {
    int64_t completed = 0, next = 0;
    for (int64_t p = 0; p < 1000; ++p) {
      const int64_t j = entry_completed_at(p, w, s);
      if (j >= 0) {
        EXPECT_EQ(j, next++) << "entries complete in order";
        EXPECT_EQ(j * s + w - 1, p) << "p is the last token of entry j's window";
        ++completed;
      }
      EXPECT_EQ(num_entries(p + 1, w, s), completed) << "w " << w << " s " << s << " L " << p + 1;
    }
  }
}

TEST(CacheLayout, PageElementsAreKVPlusBothLevels) {
  // 64-token pages, row 2 * 128: K and V 64 rows each, level 1 (stride 16) 4 rows, level 2
  // (stride 64) 1 row.
  EXPECT_EQ(page_elements(64, 256, 16, 64), (64 * 2 + 4 + 1) * 256);
}

}  // namespace
}  // namespace sala::cache_layout
