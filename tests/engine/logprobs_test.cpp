// Log probabilities through the engine on the bundled tiny model (CPU backend, fp32): the
// values equal log_softmax of the model's own logits computed here from a plain forward (raw
// distribution: temperature and penalties do not change them), the top-N are the largest
// logits with ties to the lowest id, prompt logprobs with chunked prefill equal the one-shot
// ones, and a budget of 0 new tokens scores the prompt alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/logprobs.h"
#include "core/config.h"
#include "core/safetensors.h"
#include "engine/engine.h"
#include "model/minicpm_sala.h"

namespace sala {
namespace {

using namespace std::chrono_literals;

const std::string kModelDir = std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat";

std::unique_ptr<Model> load_model(int32_t logit_rows, int32_t step_tokens) {
  static const ModelConfig cfg = load_model_config(kModelDir);
  static const Checkpoint ckpt(kModelDir);
  ModelLimits lim;
  lim.max_step_tokens = step_tokens;
  lim.max_logit_rows = logit_rows;
  lim.caches.page_size = cfg.sparse.block_size;
  lim.caches.num_pages = 64;
  lim.caches.num_slots = logit_rows;
  return std::make_unique<Model>(cfg, make_backend("cpu", BackendOptions{NumericMode::F32, 0}),
                                 ckpt, lim);
}

std::vector<int32_t> make_prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p{1};
  while (int(p.size()) < n) p.push_back(int32_t(3 + rng() % 780));
  return p;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> out, prompt;
  FinishReason reason = FinishReason::None;
};

Collected collect(RequestHandle& h) {
  Collected c;
  TokenEvent ev;
  for (;;) {
    if (!h.next(ev, 120s)) {
      ADD_FAILURE() << "timed out";
      return c;
    }
    c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    c.out.insert(c.out.end(), ev.logprobs.begin(), ev.logprobs.end());
    c.prompt.insert(c.prompt.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
    if (ev.finished) {
      c.reason = ev.reason;
      return c;
    }
  }
}

// log_softmax, in double, of every row's logits of `seq` computed the way the engine runs a
// lone request, so that the logits are the engine's bits: the first `prefill` tokens in one
// forward, then one decode forward per token. The prompt rows' logits come 4 rows per forward
// (the CPU's lm_head is a GEMV per row up to 4 rows and a GEMM above, whose last bits differ;
// the engine here holds 4 or fewer logit rows, so it takes the GEMV too).
std::vector<std::vector<double>> reference_logprobs(const std::vector<int32_t>& seq, size_t prefill) {
  auto m = load_model(4, 512);
  const int32_t V = m->config().vocab_size;
  std::vector<int32_t> pages(64);
  for (int i = 0; i < 64; ++i) pages[size_t(i)] = i;
  std::vector<float> all, logits;
  for (size_t r0 = 0; r0 < prefill; r0 += 4) {
    StepMeta meta;
    meta.add_seq(seq.data(), int32_t(prefill), 0, 0, pages, false, false);
    for (size_t r = r0; r < std::min(prefill, r0 + 4); ++r) meta.logit_rows.push_back(int32_t(r));
    m->forward(meta, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  for (size_t p = prefill; p < seq.size(); ++p) {
    StepMeta d;
    d.add_seq(seq.data() + p, 1, int64_t(p), 0, pages, false, true);
    m->forward(d, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  std::vector<std::vector<double>> rows(seq.size(), std::vector<double>(size_t(V)));
  for (size_t r = 0; r < seq.size(); ++r) {
    const float* x = all.data() + r * size_t(V);
    const double mx = *std::max_element(x, x + V);
    double sum = 0;
    for (int32_t j = 0; j < V; ++j) sum += std::exp(double(x[j]) - mx);
    for (int32_t j = 0; j < V; ++j) rows[r][size_t(j)] = double(x[j]) - mx - std::log(sum);
  }
  return rows;
}

// The entry's value and top-N against the reference row (top-N: descending, ties lowest id).
void expect_matches(const TokenLogprob& t, const std::vector<double>& row, int top_n, double tol,
                    const std::string& where) {
  EXPECT_NEAR(t.logprob, row[size_t(t.token)], tol * std::max(1.0, std::fabs(double(t.logprob)))) << where;
  std::vector<int32_t> ids(row.size());
  for (size_t j = 0; j < ids.size(); ++j) ids[j] = int32_t(j);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
  ASSERT_EQ(int(t.top_ids.size()), top_n) << where;
  for (int k = 0; k < top_n; ++k) {
    EXPECT_NEAR(t.top_logprobs[size_t(k)], row[size_t(t.top_ids[size_t(k)])],
                tol * std::max(1.0, std::fabs(double(t.top_logprobs[size_t(k)]))))
        << where;
    // The same id, unless the reference has a near-tie there (its logits are not the bits).
    if (t.top_ids[size_t(k)] != ids[size_t(k)])
      EXPECT_NEAR(row[size_t(ids[size_t(k)])], row[size_t(t.top_ids[size_t(k)])], tol) << where;
  }
}

GenerationRequest request(std::vector<int32_t> prompt, int32_t n, int32_t top_n) {
  GenerationRequest g;
  g.prompt = std::move(prompt);
  g.sampling.max_new_tokens = n;
  g.sampling.ignore_eos = true;
  g.logprobs = {true, top_n, 0};
  return g;
}

// Relative tolerances (times max(1, |logprob|)). kExact: the same logits, an fp32 result
// (half an ulp is 6e-8 relative; measured 5.6e-8). kChunked: chunked prefill changes the attention's and the
// GEMMs' fp32 summation order (the model's chunked == one-shot invariant, measured 6e-6).
constexpr double kExact = 1e-6, kChunked = 2e-5;

TEST(EngineLogprobs, EqualLogSoftmaxOfTheModelsLogits) {
  EngineOptions o;
  o.max_running_requests = 4;
  auto e = make_engine(load_model(4, 512), o);
  // Greedy, and sampled with temperature and penalties: logprobs stay the raw distribution.
  for (int mode = 0; mode < 2; ++mode) {
    GenerationRequest g = request(make_prompt(37, 7), 10, 5);
    if (mode == 0) {
      g.sampling.temperature = 0;
    } else {
      g.sampling.temperature = 0.7f;
      g.sampling.repetition_penalty = 1.3f;
      g.sampling.frequency_penalty = 0.5f;
      g.sampling.seed = 11;
    }
    const std::vector<int32_t> prompt = g.prompt;
    const Collected c = collect(*e->submit(std::move(g)));
    ASSERT_EQ(c.tokens.size(), 10u);
    ASSERT_EQ(c.out.size(), 10u);
    ASSERT_EQ(c.prompt.size(), prompt.size());
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), c.tokens.begin(), c.tokens.end() - 1);
    const auto ref = reference_logprobs(seq, prompt.size());
    EXPECT_TRUE(std::isnan(c.prompt[0].logprob) && c.prompt[0].top_ids.empty());
    EXPECT_EQ(c.prompt[0].token, prompt[0]);
    for (size_t q = 1; q < prompt.size(); ++q) {
      EXPECT_EQ(c.prompt[q].token, prompt[q]);
      expect_matches(c.prompt[q], ref[q - 1], 5, kExact, "prompt position " + std::to_string(q));
    }
    for (size_t i = 0; i < c.out.size(); ++i) {
      EXPECT_EQ(c.out[i].token, c.tokens[i]);
      expect_matches(c.out[i], ref[prompt.size() - 1 + i], 5, kExact,
                     "mode " + std::to_string(mode) + " token " + std::to_string(i));
      if (mode == 0) EXPECT_EQ(c.out[i].top_ids[0], c.tokens[i]) << "greedy picks the top-1";
    }
  }
}

TEST(EngineLogprobs, ChunkedPrefillEqualsOneShot) {
  const auto prompt = make_prompt(90, 3);
  std::vector<Collected> runs;
  for (int chunk : {512, 16}) {
    EngineOptions o;
    o.max_running_requests = 2;
    o.chunked_prefill_size = chunk;
    auto e = make_engine(load_model(2, 512), o);
    GenerationRequest g = request(prompt, 3, 3);
    g.sampling.temperature = 0;
    g.logprobs.prompt_start = 5;
    runs.push_back(collect(*e->submit(std::move(g))));
  }
  ASSERT_EQ(runs[0].prompt.size(), prompt.size() - 5);
  ASSERT_EQ(runs[1].prompt.size(), runs[0].prompt.size());
  EXPECT_EQ(runs[0].tokens, runs[1].tokens);
  for (size_t i = 0; i < runs[0].prompt.size(); ++i) {
    const TokenLogprob &a = runs[0].prompt[i], &b = runs[1].prompt[i];
    EXPECT_EQ(a.token, prompt[5 + i]);
    EXPECT_EQ(b.token, a.token);
    EXPECT_NEAR(a.logprob, b.logprob, kChunked * std::max(1.0, std::fabs(double(a.logprob))))
        << "position " << 5 + i;
    EXPECT_EQ(a.top_ids, b.top_ids) << "position " << 5 + i;
  }
}

TEST(EngineLogprobs, ZeroNewTokensScoresThePrompt) {
  EngineOptions o;
  o.max_running_requests = 2;
  auto e = make_engine(load_model(2, 512), o);
  GenerationRequest g = request(make_prompt(20, 9), 0, 1);
  const auto prompt = g.prompt;
  const Collected c = collect(*e->submit(std::move(g)));
  EXPECT_EQ(c.reason, FinishReason::Length);
  EXPECT_TRUE(c.tokens.empty() && c.out.empty());
  ASSERT_EQ(c.prompt.size(), prompt.size());
  const auto ref = reference_logprobs(prompt, prompt.size());
  for (size_t q = 1; q < prompt.size(); ++q)
    expect_matches(c.prompt[q], ref[q - 1], 1, kExact, "position " + std::to_string(q));
  // Without prompt logprobs a budget of 0 is refused; a top-N past 20 too.
  GenerationRequest bad = request(prompt, 0, 0);
  bad.logprobs.prompt_start = -1;
  EXPECT_THROW(e->submit(std::move(bad)), Error);
  GenerationRequest wide = request(prompt, 1, kMaxTopLogprobs + 1);
  EXPECT_THROW(e->submit(std::move(wide)), Error);
}

// A stop token is not shown but counted and scored: its logprob ends the list.
TEST(EngineLogprobs, StopTokenIsScored) {
  EngineOptions o;
  o.max_running_requests = 2;
  auto e = make_engine(load_model(2, 512), o);
  GenerationRequest g = request(make_prompt(12, 5), 3, 2);
  g.sampling.temperature = 0;
  g.logprobs.prompt_start = -1;
  GenerationRequest stop = g;
  const Collected free_run = collect(*e->submit(std::move(g)));
  ASSERT_EQ(free_run.out.size(), 3u);
  stop.sampling.ignore_eos = false;
  stop.sampling.stop_token_ids = {free_run.tokens[0]};
  const Collected c = collect(*e->submit(std::move(stop)));
  EXPECT_EQ(c.reason, FinishReason::StopToken);
  EXPECT_TRUE(c.tokens.empty() && c.prompt.empty());
  ASSERT_EQ(c.out.size(), 1u);
  EXPECT_EQ(c.out[0].token, free_run.tokens[0]);
  EXPECT_EQ(c.out[0].logprob, free_run.out[0].logprob);
  EXPECT_EQ(c.out[0].top_ids, free_run.out[0].top_ids);
}

// Host log-softmax: ties in the top-N go to the lowest id; exact against a double reference.
TEST(EngineLogprobs, HostRowTiesToLowestId) {
  const std::vector<float> row = {1.f, 3.f, 3.f, -2.f, 3.f, 0.5f};
  float lp = 0;
  int32_t ids[4];
  float tops[4];
  logprobs_of_row(row.data(), int64_t(row.size()), 3, 4, &lp, ids, tops);
  double sum = 0;
  for (float x : row) sum += std::exp(double(x) - 3.0);
  EXPECT_NEAR(lp, -2.0 - 3.0 - std::log(sum), 1e-6);
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 4), (std::vector<int32_t>{1, 2, 4, 0}));
  EXPECT_NEAR(tops[3], 1.0 - 3.0 - std::log(sum), 1e-6);
}

}  // namespace
}  // namespace sala
