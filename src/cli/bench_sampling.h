// `sala bench offline --decode-sampling SPEC`: the decode runs also time each step again with
// sampled rows (temperature, top-k / top-p / min-p, penalties, seeds), sampled on the backend
// through the engine's own path (engine/device_sampling.h: Backend::sample_rows, penalty tables
// loaded once, one draw per row from the sequence's seeded stream), so the sampled step's
// cost is measured against the greedy step of the same run at the same context.
#pragma once
#include <string>
#include <vector>

#include "engine/device_sampling.h"
#include "engine/sampler.h"
#include "model/minicpm_sala.h"

namespace sala::cli {

// "temperature=0.7,top_p=0.9,repetition_penalty=1.1,seed=1" (keys: temperature, top_k,
// top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty, seed); bounds as a
// request's (check_sampling). sala::Error naming the bad key or value.
SamplingParams parse_decode_sampling(const std::string& spec);

class BenchSampling {
 public:
  // B sequences whose prompts are prompt[0, prompt_len); sequence b draws from seed + b.
  BenchSampling(const SamplingParams& p, int B, const std::vector<int32_t>& prompt,
                int32_t prompt_len, int32_t vocab);
  // One step of meta's rows (one per sequence, sequence b in state slot b): forward with the
  // logits kept on the device, then sample_rows. Returns its milliseconds.
  double step(Model& model, const StepMeta& meta);

 private:
  SamplingParams p_;
  std::vector<SamplerState> st_;
  std::vector<std::vector<int32_t>> tokens_;  // per sequence: prompt, then sampled tokens
  int32_t prompt_len_, vocab_;
  DeviceSampling dev_;
  std::vector<int32_t> out_;
  std::vector<float> unused_;
};

}  // namespace sala::cli
