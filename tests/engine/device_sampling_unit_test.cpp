// DeviceSampling (engine/device_sampling.h) + HostSampler (backend/sampling.h) against the
// engine's host path (adjust_logits + Sampler::sample) on random rows: the same token at every
// step for every parameter mix, with penalties counted across steps, duplicate logit_bias ids
// (their chain applied in order), the min_tokens mask switching off, and greedy rows. The
// backend (the CPU backend) samples host rows with HostSampler.
#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/cpu_backend.h"
#include "engine/device_sampling.h"
#include "engine/sampler.h"

namespace sala {
namespace {

// The CPU backend (sample_rows = HostSampler over host rows), counting penalty loads.
class CountingCpuBackend final : public CpuBackend {
 public:
  CountingCpuBackend() : CpuBackend(BackendOptions{NumericMode::F32, 1}) {}
  void load_penalties(int32_t slot, int32_t vocab, const int32_t* prompt, int64_t np,
                      const int32_t* gen, int64_t ng) override {
    ++loads;
    CpuBackend::load_penalties(slot, vocab, prompt, np, gen, ng);
  }
  int loads = 0;
};

TEST(DeviceSamplingUnit, SameTokensAsTheHostPath) {
  const int32_t V = 300, R = 6, steps = 40;
  const std::vector<int32_t> eos = {2, 299};
  std::vector<SamplingParams> ps(R);
  ps[0].temperature = 0.7f, ps[0].top_p = 0.9f, ps[0].repetition_penalty = 1.1f;
  ps[1].temperature = 1.3f, ps[1].top_k = 20, ps[1].min_p = 0.05f, ps[1].frequency_penalty = 0.4f,
  ps[1].presence_penalty = 0.3f;
  ps[2].temperature = 0.9f, ps[2].logit_bias = {{5, 3.3f}, {17, -100.f}, {5, 0.7f}, {2, 1.f}};
  ps[2].min_new_tokens = 8, ps[2].stop_token_ids = {7, 9};
  ps[3].temperature = 0.f, ps[3].repetition_penalty = 1.5f;
  ps[4].temperature = 0.8f, ps[4].top_p = 0.6f, ps[4].ignore_eos = true, ps[4].min_new_tokens = 5;
  ps[5].temperature = 1.f, ps[5].top_k = 1, ps[5].frequency_penalty = 2.f;
  std::vector<SamplerState> host(R), dev(R);
  std::vector<std::vector<int32_t>> tokens(R);
  for (int32_t r = 0; r < R; ++r) {
    ps[size_t(r)].seed = 100 + uint64_t(r);
    std::mt19937 g(static_cast<uint32_t>(r));
    for (int i = 0; i < 50; ++i) tokens[size_t(r)].push_back(int32_t(g() % V));
    host[size_t(r)].init(ps[size_t(r)], tokens[size_t(r)], V);
    dev[size_t(r)].init(ps[size_t(r)], tokens[size_t(r)], V);
  }
  CountingCpuBackend be;
  DeviceSampling ds;
  Sampler sampler;
  std::vector<int32_t> by_row;
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.f, 2.f);
  int64_t distinct = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> logits(size_t(R) * V);
    for (float& x : logits) x = nd(g);
    ds.clear();
    for (int32_t r = 0; r < R; ++r)
      ds.add(r, uint64_t(r) + 1, ps[size_t(r)], dev[size_t(r)], tokens[size_t(r)], 50,
             int32_t(tokens[size_t(r)].size()) - 50, r, eos, V, be);
    ds.run(be, Tensor{logits.data(), DType::F32, R, V}, by_row);
    for (int32_t r = 0; r < R; ++r) {
      std::vector<float> row(logits.begin() + r * V, logits.begin() + (r + 1) * V);
      const int32_t generated = int32_t(tokens[size_t(r)].size()) - 50;
      adjust_logits(row.data(), V, ps[size_t(r)], generated, eos);
      const int32_t want = sampler.sample(row.data(), V, ps[size_t(r)], host[size_t(r)]);
      ASSERT_EQ(by_row[size_t(r)], want) << "row " << r << " step " << step;
      if (r == 2 && generated < 8) EXPECT_TRUE(want != 7 && want != 9 && want != 2);
      EXPECT_NE(want, r == 2 ? 17 : -1);
      host[size_t(r)].observe(want);
      dev[size_t(r)].observe(want);
      tokens[size_t(r)].push_back(want);
      distinct += want != argmax(logits.data() + r * V, V);
    }
  }
  EXPECT_GT(distinct, steps);  // the rows did not just take the raw argmax
  EXPECT_EQ(be.loads, 4) << "penalty tables loaded once per penalised request";
}

}  // namespace
}  // namespace sala
