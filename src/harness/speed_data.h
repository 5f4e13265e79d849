// The speed data of the SOAR toolkit: one JSON object per line with the prompt in
// `question` (or `input` / `prompt`) and the reference answer in `model_response`
// (SGLang's own `conversations: [{content|value}, {content|value}]` is accepted too).
// Turned into requests as sglang.bench_serving --dataset-name custom does:
//   prompt = the raw user text; prompt_len = len(encode(prompt)); output_len =
//   len(encode(model_response)) (BOS included in both); rows shuffled with Python's
//   random.seed(seed) + random.shuffle; rows with prompt_len < 2 or output_len < 2 dropped;
//   the first num_prompts kept.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/token_count.h"

namespace sala::harness {

struct SpeedRow {
  std::string prompt;
  int64_t prompt_len = 0;
  int64_t output_len = 0;
};

struct SpeedDataOptions {
  std::optional<uint64_t> shuffle_seed;  // nullopt: keep file order
  int64_t num_prompts = -1;              // -1: all
};

std::vector<SpeedRow> load_speed_rows(const std::string& path, const TokenCounter& counter,
                                      const SpeedDataOptions& opt);

}  // namespace sala::harness
