// `sala make-speed-set`: deterministic synthetic speed sets shaped like the contest's public
// workload: a fraction (default 68 %) of prompts of 32K-512K tokens, the rest 1K-32K tokens
// (both log-uniform), outputs log-uniform in [256, 4096] tokens.
// Text is made of words: a vocabulary of English words, made-up words and numbers, in
// sentences and paragraphs, unique per prompt from its first line on (no shared prefixes).
// Token counts are estimated as tokens ~= 1.3 * words (English with a ~50-100K-entry BPE
// vocabulary); the real count depends on the tokenizer (the 800-entry tiny model's
// tokenizer needs several tokens per word). Each line carries question, model_response and,
// for information, prompt_tokens_est and output_tokens_est (`sala bench serve` counts the
// real tokens of model_response with the served model's tokenizer, as bench_serving does).
// --scale multiplies every length (prompt and, unless --output-scale is given, output), so
// --scale 0.001 turns 32K-512K into 32-512 tokens for a CPU smoke test.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace sala::harness {

struct SpeedSetOptions {
  int64_t n = 100;
  uint64_t seed = 0;
  double scale = 1.0;
  double output_scale = -1;          // < 0: same as scale
  int64_t max_prompt_tokens = -1;    // cap after scaling; -1 none
  double long_fraction = 0.68;
  int64_t long_min = 32768, long_max = 524288;
  int64_t short_min = 1024, short_max = 32768;
  int64_t output_min = 256, output_max = 4096;
};

struct SpeedSetItem {
  std::string question, model_response;
  int64_t prompt_tokens_est = 0, output_tokens_est = 0;
  bool is_long = false;
};

constexpr double kTokensPerWord = 1.3;

// Lengths first (cheap), then text per item: item i depends only on (seed, i, its lengths).
std::vector<SpeedSetItem> plan_speed_set(const SpeedSetOptions& opt);
void fill_speed_set_item(SpeedSetItem& item, uint64_t seed, int64_t index);

struct SpeedSetStats {
  int64_t n = 0, n_long = 0, prompt_tokens_total = 0, output_tokens_total = 0;
  int64_t prompt_min = 0, prompt_max = 0, output_min = 0, output_max = 0;
  uint64_t bytes = 0;
};
// Writes the JSONL; returns statistics.
SpeedSetStats write_speed_set(std::ostream& os, const SpeedSetOptions& opt);

}  // namespace sala::harness
