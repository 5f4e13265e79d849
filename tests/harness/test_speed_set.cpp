// make-speed-set shape and determinism; speed data loading as bench_serving's custom dataset.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "harness/speed_data.h"
#include "harness/speed_set.h"
#include "harness/token_count.h"

using namespace sala::harness;

namespace {
// Counts whitespace-separated words + 1 (a stand-in "BOS"), for tests without a model.
class WordCounter : public TokenCounter {
 public:
  int64_t count(std::string_view t) const override {
    std::istringstream is{std::string(t)};
    std::string w;
    int64_t n = 1;
    while (is >> w) ++n;
    return n;
  }
};

std::string write_tmp(const std::string& name, const std::string& body) {
  std::string p = ::testing::TempDir() + "/" + name;
  std::ofstream(p) << body;
  return p;
}
}  // namespace

TEST(SpeedSet, ShapeOfTheFullSizeSet) {
  SpeedSetOptions o;
  o.n = 1000;
  o.seed = 7;
  auto items = plan_speed_set(o);
  int64_t n_long = 0;
  for (const auto& it : items) {
    if (it.is_long) {
      ++n_long;
      EXPECT_GE(it.prompt_tokens_est, 32768);
      EXPECT_LE(it.prompt_tokens_est, 524288);
    } else {
      EXPECT_LT(it.prompt_tokens_est, 32768);
      EXPECT_GE(it.prompt_tokens_est, 1024);
    }
    EXPECT_GE(it.output_tokens_est, 256);
    EXPECT_LE(it.output_tokens_est, 4096);
  }
  EXPECT_EQ(n_long, 680);
}

TEST(SpeedSet, DeterministicAndSeedDependent) {
  SpeedSetOptions o;
  o.n = 12;
  o.seed = 3;
  o.scale = 0.002;
  std::ostringstream a, b, c;
  write_speed_set(a, o);
  write_speed_set(b, o);
  o.seed = 4;
  write_speed_set(c, o);
  EXPECT_EQ(a.str(), b.str());
  EXPECT_NE(a.str(), c.str());
}

TEST(SpeedSet, ScaleCapAndWordsMatchTheEstimate) {
  SpeedSetOptions o;
  o.n = 30;
  o.seed = 1;
  o.scale = 0.001;
  o.output_scale = 0.05;
  o.max_prompt_tokens = 300;
  auto items = plan_speed_set(o);
  std::set<std::string> first_lines;
  for (size_t i = 0; i < items.size(); ++i) {
    auto& it = items[i];
    EXPECT_LE(it.prompt_tokens_est, 300);
    EXPECT_GE(it.prompt_tokens_est, 16);
    EXPECT_GE(it.output_tokens_est, 12);   // 256 * 0.05
    EXPECT_LE(it.output_tokens_est, 205);  // 4096 * 0.05
    fill_speed_set_item(it, o.seed, static_cast<int64_t>(i));
    WordCounter wc;
    double words = static_cast<double>(wc.count(it.question) - 1);
    EXPECT_NEAR(words * kTokensPerWord, static_cast<double>(it.prompt_tokens_est),
                0.15 * static_cast<double>(it.prompt_tokens_est) + 20);
    double owords = static_cast<double>(wc.count(it.model_response) - 1);
    EXPECT_NEAR(owords * kTokensPerWord, static_cast<double>(it.output_tokens_est), 3);
    first_lines.insert(it.question.substr(0, it.question.find('\n')));
  }
  EXPECT_EQ(first_lines.size(), items.size());  // no shared prefixes
}

TEST(SpeedData, FieldsShuffleAndPruneLikeBenchServing) {
  std::string p = write_tmp("speed.jsonl",
                            "{\"question\": \"q zero\", \"model_response\": \"a b c\"}\n"
                            "not json\n"
                            "\n"
                            "{\"input\": \"q one x\", \"model_response\": \"a b\"}\n"
                            "{\"prompt\": \"q two\", \"model_response\": \"\"}\n"  // output_len 1: pruned
                            "{\"conversations\": [{\"value\": \"q three\"}, {\"content\": \"r r r r\"}]}\n"
                            "{\"question\": \"no answer\"}\n");
  WordCounter wc;
  SpeedDataOptions o;
  auto rows = load_speed_rows(p, wc, o);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].prompt, "q zero");
  EXPECT_EQ(rows[0].prompt_len, 3);
  EXPECT_EQ(rows[0].output_len, 4);
  EXPECT_EQ(rows[1].prompt, "q one x");
  EXPECT_EQ(rows[2].prompt, "q three");
  EXPECT_EQ(rows[2].output_len, 5);
  // Python: random.seed(42); random.shuffle([0, 1, 2, 3]) -> [2, 1, 3, 0] over the 4 parsed
  // rows (q zero, q one x, q two, q three); then "q two" is pruned.
  o.shuffle_seed = 42;
  auto sh = load_speed_rows(p, wc, o);
  ASSERT_EQ(sh.size(), 3u);
  EXPECT_EQ(sh[0].prompt, "q one x");
  EXPECT_EQ(sh[1].prompt, "q three");
  EXPECT_EQ(sh[2].prompt, "q zero");
  o.num_prompts = 2;
  EXPECT_EQ(load_speed_rows(p, wc, o).size(), 2u);
  EXPECT_THROW(load_speed_rows(write_tmp("empty.jsonl", "\n"), wc, o), sala::Error);
  EXPECT_THROW(load_speed_rows("/nonexistent/x.jsonl", wc, o), sala::Error);
}

TEST(SpeedData, RealTokenizerCountsLikeHfEncode) {
  // Reference counts from transformers AutoTokenizer(sala-tiny-chat).encode(text).
  auto tc = TokenCounter::load(SALA_TINY_MODEL_DIR);
  EXPECT_EQ(tc->count("Hello world, this is a test."), 17);
  EXPECT_EQ(tc->count("What is 426+750?"), 12);
  EXPECT_EQ(tc->count("Document 3 (reference 12345).\n\nThe river and the market."), 36);
  EXPECT_THROW(TokenCounter::load("/nonexistent-model-dir"), sala::Error);
}
