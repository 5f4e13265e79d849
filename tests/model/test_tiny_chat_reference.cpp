// The trained sala-tiny-chat model, greedy, CPU fp32, against the reference answers of
// tests/fixtures/eval/tiny-chat.reference.jsonl (prompts tokenized by HF, see
// scripts/pretokenize_eval.py). Every output must equal the reference token for token; a
// divergence is accepted only where our top-2 logits are within 1e-4 (a near-tie). With one
// rank and with two tensor-parallel ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace sala::test {
namespace {

// The parameter: tensor-parallel ranks (issue 24: TP=2 answers as TP=1; its logits differ from
// TP=1's by fp32 rounding, so the same near-tie rule holds).
class TinyChatReference : public ::testing::TestWithParam<int> {};

TEST_P(TinyChatReference, GreedyOutputsEqualReference) {
  const char* path = std::getenv("SALA_PRETOKENIZED_EVAL");
  ASSERT_TRUE(path) << "SALA_PRETOKENIZED_EVAL not set (ctest sets it)";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  auto m = load_tiny(tiny_chat_dir(), 2048, 256, 1, NumericMode::F32, nullptr, KvCacheDtype::Auto,
                     GetParam());
  ASSERT_EQ(m->tp_size(), GetParam());
  const ModelConfig& c = m->config();
  const int64_t V = c.vocab_size;
  const auto pages = page_range(0, 256);
  std::string line;
  int rows = 0, equal = 0, near_tie = 0;
  std::vector<float> logits;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    auto prompt = j["prompt_ids"].get<std::vector<int32_t>>();
    auto ref = j["output_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> out;
    bool tie_ok = false;
    StepMeta meta;
    meta.add_seq(prompt.data(), int32_t(prompt.size()), 0, 0, pages, false, true);
    m->forward(meta, logits);
    int64_t pos = int64_t(prompt.size());
    while (out.size() < ref.size()) {
      std::vector<float> row(logits.begin(), logits.begin() + V);
      const int32_t tok = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
      if (tok != ref[out.size()]) {
        std::nth_element(row.begin(), row.begin() + 1, row.end(), std::greater<float>());
        tie_ok = row[0] - row[1] < 1e-4f;
        break;
      }
      out.push_back(tok);
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), tok) != c.eos_token_ids.end()) break;
      StepMeta d;
      d.add_seq(&out.back(), 1, pos++, 0, pages, false, true);
      m->forward(d, logits);
    }
    ++rows;
    if (out == ref) ++equal;
    else if (tie_ok) ++near_tie;
    else ADD_FAILURE() << "row " << rows - 1 << " (" << j["task"] << ", " << prompt.size()
                       << " prompt tokens) diverges at output token " << out.size();
  }
  EXPECT_EQ(rows, 160);
  std::printf("tiny-chat reference (TP=%d): %d rows, %d identical, %d diverge at a near-tie\n",
              GetParam(), rows, equal, near_tie);
}

INSTANTIATE_TEST_SUITE_P(Tp, TinyChatReference, ::testing::Values(1, 2));

}  // namespace
}  // namespace sala::test
