#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sampler.h"

namespace sala {
namespace {

TEST(Sampler, ArgmaxTiesGoToTheLowestId) {
  const float x[] = {1.f, 3.f, 2.f, 3.f};
  EXPECT_EQ(argmax(x, 4), 1);
}

TEST(Sampler, TemperatureZeroAndTopK1AreGreedy) {
  Sampler s;
  for (float t : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = t == 0 ? -1 : 1;
    SamplerState st;
    st.init(p, {}, 5);
    std::vector<float> x = {0.f, 5.f, 5.f, 1.f, -2.f};
    EXPECT_EQ(s.sample(x.data(), 5, p, st), 1);
  }
}

TEST(Sampler, TopKAndTopPAndMinPRestrictTheCandidates) {
  Sampler s;
  const std::vector<float> base = {2.0f, 1.9f, 1.8f, 0.f, -1.f, 1.85f};
  auto draws = [&](SamplingParams p) {
    SamplerState st;
    p.seed = 1;
    st.init(p, {}, 6);
    std::map<int32_t, int> seen;
    for (int i = 0; i < 2000; ++i) {
      auto x = base;
      ++seen[s.sample(x.data(), 6, p, st)];
    }
    return seen;
  };
  SamplingParams k2;
  k2.top_k = 2;
  auto a = draws(k2);
  EXPECT_EQ(a.size(), 2u);
  EXPECT_TRUE(a.count(0) && a.count(1));
  SamplingParams tp;
  tp.top_p = 0.01f;  // only the top token
  auto b = draws(tp);
  EXPECT_EQ(b.size(), 1u);
  EXPECT_TRUE(b.count(0));
  SamplingParams mp;
  mp.min_p = 0.5f;  // exp(-1) and exp(-2) relative weights fall out
  auto c = draws(mp);
  EXPECT_EQ(c.count(3) + c.count(4), 0u);
  EXPECT_EQ(c.size(), 4u);
  SamplingParams all;
  EXPECT_EQ(draws(all).size(), 6u);
}

TEST(Sampler, SameSeedSameStream) {
  Sampler s;
  SamplingParams p;
  p.temperature = 1.5f;
  p.seed = 99;
  auto run = [&](SamplingParams q) {
    SamplerState st;
    st.init(q, {}, 50);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      std::vector<float> x(50);
      for (int j = 0; j < 50; ++j) x[size_t(j)] = float((j * 7 + i) % 13) * 0.1f;
      out.push_back(s.sample(x.data(), 50, q, st));
    }
    return out;
  };
  EXPECT_EQ(run(p), run(p));
  SamplingParams q = p;
  q.seed = 100;
  EXPECT_NE(run(p), run(q));
}

TEST(Sampler, PenaltiesFollowHfAndOpenAiSemantics) {
  Sampler s;
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  SamplerState st;
  st.init(p, {0}, 3);
  std::vector<float> x = {3.0f, 2.0f, 1.0f};  // token 0 in the prompt: 3 / 2 = 1.5
  EXPECT_EQ(s.sample(x.data(), 3, p, st), 1);
  EXPECT_FLOAT_EQ(x[0], 1.5f);

  SamplingParams f;
  f.temperature = 0;
  f.frequency_penalty = 0.6f;
  f.presence_penalty = 0.1f;
  SamplerState sf;
  sf.init(f, {1}, 3);  // prompt tokens are not penalised by frequency / presence
  sf.observe(0);
  sf.observe(0);
  std::vector<float> y = {3.0f, 2.0f, 1.0f};
  EXPECT_EQ(s.sample(y.data(), 3, f, sf), 1);  // 3 - 1.2 - 0.1 = 1.7 < 2
  EXPECT_FLOAT_EQ(y[0], 1.7f);
  EXPECT_FLOAT_EQ(y[1], 2.0f);
}

}  // namespace
}  // namespace sala

namespace sala {

// logit_bias is added; stop tokens (EOS unless ignore_eos, stop_token_ids) are -inf until
// min_new_tokens tokens were generated, then untouched.
TEST(Sampler, AdjustLogits) {
  SamplingParams p;
  p.logit_bias = {{1, 2.5f}};
  p.min_new_tokens = 2;
  p.stop_token_ids = {3};
  std::vector<float> x(5, 0.0f);
  adjust_logits(x.data(), 5, p, 1, {4});
  EXPECT_EQ(x[1], 2.5f);
  EXPECT_TRUE(std::isinf(x[3]) && x[3] < 0);
  EXPECT_TRUE(std::isinf(x[4]) && x[4] < 0);
  std::vector<float> y(5, 0.0f);
  adjust_logits(y.data(), 5, p, 2, {4});
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(y[4], 0.0f);
  p.ignore_eos = true;
  std::vector<float> z(5, 0.0f);
  adjust_logits(z.data(), 5, p, 0, {4});
  EXPECT_EQ(z[4], 0.0f);  // EOS is no stop token with ignore_eos
  EXPECT_TRUE(std::isinf(z[3]));
  SamplerState st;
  EXPECT_FALSE(st.plain_greedy(p));  // the device argmax would skip the adjustment
}

}  // namespace sala
