// Sampling on the backend (engine/device_sampling.h) against the host Sampler, engine level, on
// the tiny model with the CPU backend (whose sample_rows is HostSampler, the oracle of the CUDA
// kernel): the same seeded requests give the same tokens with EngineOptions::device_sampling
// on and off, for every sampling feature (temperature, top-k / top-p / min-p, repetition /
// frequency / presence penalties, logit_bias, min_tokens), batched, across preemption (a
// penalty table reloaded on another slot) and beside sampled speculative verify calls (steps
// sampled on the host, after which the device tables are reloaded).
#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace sala {
namespace {

std::vector<GenerationRequest> mixed_requests() {
  std::vector<GenerationRequest> out;
  auto add = [&](int len, uint32_t seed, int32_t n, auto&& set) {
    GenerationRequest g;
    g.prompt = make_prompt(len, seed);
    g.sampling.max_new_tokens = n;
    g.sampling.ignore_eos = true;
    g.sampling.seed = seed;
    set(g.sampling);
    out.push_back(std::move(g));
  };
  // The bench setting.
  add(30, 11, 60, [](SamplingParams& p) {
    p.temperature = 0.7f;
    p.top_p = 0.9f;
    p.repetition_penalty = 1.1f;
  });
  add(80, 12, 60, [](SamplingParams& p) {
    p.temperature = 1.3f;
    p.top_k = 20;
    p.min_p = 0.05f;
    p.frequency_penalty = 0.4f;
    p.presence_penalty = 0.3f;
  });
  add(150, 13, 60, [](SamplingParams& p) {  // bias toward a few ids, stop tokens masked early
    p.temperature = 0.9f;
    p.logit_bias = {{5, 3.0f}, {17, -100.0f}, {5, 0.5f}, {700, 2.0f}};
    p.min_new_tokens = 10;
    p.ignore_eos = false;
    p.stop_token_ids = {7, 9};
  });
  add(200, 14, 60, [](SamplingParams& p) {  // greedy, but penalised: not the plain argmax
    p.temperature = 0.0f;
    p.repetition_penalty = 1.3f;
  });
  add(230, 15, 60, [](SamplingParams& p) {  // plain sampling (drafts when speculating)
    p.temperature = 0.8f;
    p.top_p = 0.95f;
  });
  add(270, 16, 60, [](SamplingParams& p) { p.temperature = 0.0f; });  // plain greedy
  return out;
}

std::vector<std::vector<int32_t>> run(bool device, int32_t pages, int32_t drafts,
                                      int64_t* preemptions = nullptr) {
  EngineSetup s;
  s.pages = pages;
  s.step_tokens = 256;
  s.opts.chunked_prefill_size = 64;
  s.opts.device_sampling = device;
  s.opts.speculative.num_draft_tokens = drafts;
  auto e = start(s);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (GenerationRequest& g : mixed_requests()) hs.push_back(e->submit(std::move(g)));
  std::vector<std::vector<int32_t>> out;
  for (auto& h : hs) {
    const Result r = collect(*h);
    EXPECT_TRUE(r.error.empty()) << r.error;
    out.push_back(r.tokens);
  }
  if (preemptions) *preemptions = e->stats().preemptions;
  expect_idle(*e);
  return out;
}

TEST(DeviceSampling, SameTokensAsHostSampler) {
  const auto host = run(false, 512, 0);
  const auto dev = run(true, 512, 0);
  ASSERT_EQ(host.size(), dev.size());
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(dev[i], host[i]) << "request " << i;
    if (i != 2) EXPECT_EQ(dev[i].size(), 60u);  // request 2 may end at EOS after min_tokens
  }
  // The biased request: id 17 (bias -100) never, stop ids 7 / 9 not before min_tokens.
  EXPECT_GE(dev[2].size(), 10u);
  for (size_t t = 0; t < dev[2].size(); ++t) {
    EXPECT_NE(dev[2][t], 17);
    if (t < 10) EXPECT_TRUE(dev[2][t] != 7 && dev[2][t] != 9);
  }
  // Seeds are per request: the same requests again give the same tokens.
  EXPECT_EQ(run(true, 512, 0), dev);
}

TEST(DeviceSampling, PreemptionReloadsPenaltyTables) {
  int64_t preemptions = 0;
  const auto want = run(false, 512, 0);
  const auto got = run(true, 26, 0, &preemptions);  // 416 tokens of KV for 6 requests
  EXPECT_GT(preemptions, 0);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
}

TEST(DeviceSampling, BesideSampledSpeculation) {
  // Request 4 drafts (plain sampling): its verify steps sample every row on the host, the
  // penalised requests' tables are then reloaded; the output equals host sampling's.
  const auto want = run(false, 512, 3);
  const auto got = run(true, 512, 3);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
}

}  // namespace
}  // namespace sala
