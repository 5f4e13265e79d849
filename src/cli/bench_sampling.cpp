#include "cli/bench_sampling.h"

#include <chrono>
#include <cstdlib>

#include "core/check.h"
#include "core/error.h"
#include "engine/request_check.h"

namespace sala::cli {

SamplingParams parse_decode_sampling(const std::string& spec) {
  SamplingParams p;
  size_t at = 0;
  while (at < spec.size()) {
    size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(at, end - at);
    at = end + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) fail("--decode-sampling: '{}' is not key=value", item);
    const std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    char* stop = nullptr;
    const double v = std::strtod(val.c_str(), &stop);
    if (val.empty() || *stop != '\0') fail("--decode-sampling: {}={} is not a number", key, val);
    if (key == "temperature") p.temperature = float(v);
    else if (key == "top_p") p.top_p = float(v);
    else if (key == "min_p") p.min_p = float(v);
    else if (key == "repetition_penalty") p.repetition_penalty = float(v);
    else if (key == "frequency_penalty") p.frequency_penalty = float(v);
    else if (key == "presence_penalty") p.presence_penalty = float(v);
    else if (key == "top_k" || key == "seed") {
      if (v != double(int64_t(v)) || v < (key == "seed" ? 0 : -1))
        fail("--decode-sampling: {}={} is not a valid integer", key, val);
      if (key == "top_k") p.top_k = int32_t(v);
      else p.seed = uint64_t(v);
    } else {
      fail("--decode-sampling: unknown key '{}' (temperature, top_k, top_p, min_p, "
           "repetition_penalty, frequency_penalty, presence_penalty, seed)", key);
    }
  }
  try {
    check_sampling(p);
  } catch (const InvalidRequest& e) {
    fail("--decode-sampling: {}", e.what());
  }
  return p;
}

BenchSampling::BenchSampling(const SamplingParams& p, int B, const std::vector<int32_t>& prompt,
                             int32_t prompt_len, int32_t vocab)
    : p_(p), st_(size_t(B)), tokens_(size_t(B)), prompt_len_(prompt_len), vocab_(vocab) {
  SALA_CHECK(B > 0 && prompt_len > 0 && size_t(prompt_len) <= prompt.size());
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + prompt_len);
  for (int b = 0; b < B; ++b) {
    SamplingParams pb = p_;
    pb.seed = p_.seed.value_or(0) + uint64_t(b);
    st_[size_t(b)].init(pb, head, vocab);
    tokens_[size_t(b)] = head;
  }
}

double BenchSampling::step(Model& model, const StepMeta& meta) {
  SALA_CHECK(meta.seqs.size() == st_.size() && meta.logit_rows.size() == st_.size());
  const auto t0 = std::chrono::steady_clock::now();
  model.forward(meta, unused_, nullptr, nullptr, nullptr, nullptr, /*keep_logits=*/true);
  dev_.clear();
  for (size_t b = 0; b < st_.size(); ++b)
    dev_.add(int32_t(b), uint64_t(b) + 1, p_, st_[b], tokens_[b], prompt_len_,
             int32_t(tokens_[b].size()) - prompt_len_, meta.seqs[b].state_slot, {}, vocab_,
             model.backend());
  dev_.run(model.backend(), model.logits(), out_);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (size_t b = 0; b < st_.size(); ++b) {  // the penalty state follows the sampled tokens
    st_[b].observe(out_[b]);
    tokens_[b].push_back(out_[b]);
  }
  return ms;
}

}  // namespace sala::cli
