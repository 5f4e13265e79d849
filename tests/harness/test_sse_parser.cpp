// The SSE parsing and bench_serving timing rules of sse.h, on hand-fed byte streams.
#include <gtest/gtest.h>

#include "harness/sse.h"

using namespace sala::harness;

namespace {
std::string chunk(const std::string& text, int completion_tokens, int prompt_tokens = 7) {
  return "data: {\"text\":\"" + text + "\",\"meta_info\":{\"id\":\"x\",\"prompt_tokens\":" +
         std::to_string(prompt_tokens) + ",\"completion_tokens\":" + std::to_string(completion_tokens) +
         ",\"finish_reason\":null}}\n\n";
}
}  // namespace

TEST(SseParser, LineSplitterHandlesSplitsAndCrLf) {
  LineSplitter s;
  auto a = s.feed("data: a\r\n\r\nda");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0], "data: a");
  auto b = s.feed("ta: b\n");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0], "data: b");
  s.feed("  tail ");
  EXPECT_EQ(s.flush(), "tail");
}

TEST(SseParser, TtftItlLatencyAsBenchServing) {
  RequestOutput o;
  o.start_s = 10.0;
  SglangStreamParser p(o, 99);
  // An empty-text chunk first (ignored for TTFT), then text at 10.5 with 1 token.
  EXPECT_TRUE(p.feed(chunk("", 0), 10.2));
  EXPECT_TRUE(p.feed(chunk("a", 1), 10.5));
  // 3 new tokens 0.3 s later: 3 ITL entries of 0.1.
  EXPECT_TRUE(p.feed(chunk("abcd", 4), 10.8));
  // Same count again: skipped, and the reference time does not move.
  EXPECT_TRUE(p.feed(chunk("abcd", 4), 10.9));
  // 1 new token at 11.0: gap from 10.8 (not 10.9).
  EXPECT_TRUE(p.feed(chunk("abcde", 5), 11.0));
  EXPECT_TRUE(p.feed("data: [DONE]\n\n", 11.25));
  EXPECT_TRUE(p.finish(11.3));
  EXPECT_TRUE(p.saw_done());
  EXPECT_NEAR(o.ttft_s, 0.5, 1e-12);
  ASSERT_EQ(o.itl.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(o.itl[i], 0.1, 1e-12);
  EXPECT_NEAR(o.itl[3], 0.2, 1e-12);
  EXPECT_NEAR(o.latency_s, 1.25, 1e-12);  // the [DONE] line's arrival
  EXPECT_EQ(o.output_len, 5);
  EXPECT_EQ(o.server_prompt_len, 7);
  EXPECT_EQ(o.generated_text, "abcde");
}

TEST(SseParser, ChunkSplitAcrossReads) {
  RequestOutput o;
  SglangStreamParser p(o, 3);
  std::string all = chunk("hi", 2) + "data: [DONE]\n\n";
  for (size_t i = 0; i < all.size(); i += 5) EXPECT_TRUE(p.feed(all.substr(i, 5), 1.0 + i * 0.001));
  EXPECT_TRUE(p.finish(2.0));
  EXPECT_EQ(o.output_len, 2);
  EXPECT_TRUE(p.saw_done());
  EXPECT_GT(o.ttft_s, 1.0);
}

TEST(SseParser, NoTextKeepsRequestedLength) {
  RequestOutput o;
  SglangStreamParser p(o, 42);
  EXPECT_TRUE(p.feed("data: [DONE]\n", 0.5));
  EXPECT_EQ(o.output_len, 42);
  EXPECT_EQ(o.ttft_s, 0);
}

TEST(SseParser, ErrorsMarkTheRequestFailed) {
  {
    RequestOutput o;
    SglangStreamParser p(o, 4);
    EXPECT_FALSE(p.feed("data: {\"error\":{\"message\":\"boom\"}}\n", 0.1));
    EXPECT_FALSE(p.ok());
    EXPECT_NE(p.error().find("boom"), std::string::npos);
  }
  {
    RequestOutput o;
    SglangStreamParser p(o, 4);
    EXPECT_FALSE(p.feed("data: {not json\n", 0.1));
  }
  {
    RequestOutput o;
    SglangStreamParser p(o, 4);
    EXPECT_FALSE(p.feed("data: {\"text\":\"x\"}\n", 0.1));  // text without completion_tokens
  }
}
