#include "engine/request_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "engine/engine.h"

namespace sala {
namespace {

// [lo, hi] with open ends where lo_open / hi_open; NaN and infinities are out of range. The
// value is printed as the float it is (0.1, not 0.10000000149).
void check_range(const char* param, float v, double lo, bool lo_open, double hi, bool hi_open) {
  const double x = v;
  const bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  if (ok) return;
  std::string range;
  if (std::isinf(hi))
    range = fmt::format("{} {}", lo_open ? ">" : ">=", lo);
  else
    range = fmt::format("in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  throw InvalidRequest(param, fmt::format("'{}' must be {}, got {}", param, range, v));
}

constexpr double kInf = HUGE_VAL;

}  // namespace

void check_sampling(const SamplingParams& p) {
  check_range("temperature", p.temperature, 0, false, kInf, true);
  check_range("top_p", p.top_p, 0, true, 1, false);
  if (p.top_k < -1)
    throw InvalidRequest("top_k", fmt::format("'top_k' must be -1 (off) or >= 0, got {}", p.top_k));
  check_range("min_p", p.min_p, 0, false, 1, false);
  check_range("frequency_penalty", p.frequency_penalty, -2, false, 2, false);
  check_range("presence_penalty", p.presence_penalty, -2, false, 2, false);
  check_range("repetition_penalty", p.repetition_penalty, 0, true, 10, false);
  if (p.min_new_tokens < 0)
    throw InvalidRequest("min_new_tokens",
                         fmt::format("'min_new_tokens' must be >= 0, got {}", p.min_new_tokens));
  for (const auto& b : p.logit_bias) check_range("logit_bias", b.second, -100, false, 100, false);
}

void check_logit_bias_ids(const SamplingParams& p, int32_t vocab_size, const std::string& param) {
  for (const auto& [id, bias] : p.logit_bias)
    if (id < 0 || id >= vocab_size)
      throw InvalidRequest(param, fmt::format("'{}': token id {} is out of range [0, {})", param,
                                              id, vocab_size));
}

void check_min_new_tokens(int64_t min_new_tokens, int64_t max_new_tokens, const std::string& param) {
  if (min_new_tokens > max_new_tokens)
    throw InvalidRequest(param, fmt::format("'{}' = {} is larger than the token budget of {}",
                                            param, min_new_tokens, max_new_tokens));
}

void check_prompt_length(int64_t prompt_len, int64_t max_context_len, const std::string& param) {
  if (prompt_len <= 0) throw InvalidRequest(param, "the prompt is empty (no tokens)");
  if (max_context_len > 0 && prompt_len >= max_context_len)
    throw InvalidRequest(param,
                         fmt::format("The prompt has {} tokens, which does not fit the model's "
                                     "context length of {} tokens (prompt + output)",
                                     prompt_len, max_context_len),
                         "context_length_exceeded");
}

void check_new_tokens(int64_t max_new_tokens, int64_t prompt_len, int64_t max_context_len,
                      const std::string& param, bool allow_zero) {
  if (max_new_tokens < 0 || (max_new_tokens == 0 && !allow_zero))
    throw InvalidRequest(param, fmt::format("'{}' must be at least {}, got {}", param,
                                            allow_zero ? 0 : 1, max_new_tokens));
  if (max_context_len <= 0 || prompt_len + max_new_tokens <= max_context_len) return;
  if (prompt_len == 0)
    throw InvalidRequest(param,
                         fmt::format("'{}' = {} exceeds the model's context length of {} tokens",
                                     param, max_new_tokens, max_context_len),
                         "context_length_exceeded");
  throw InvalidRequest(param,
                       fmt::format("The prompt ({} tokens) plus the requested {} new tokens "
                                   "('{}') exceeds the model's context length of {} tokens",
                                   prompt_len, max_new_tokens, param, max_context_len),
                       "context_length_exceeded");
}

void check_model_context(const ModelConfig& cfg, int64_t len, const std::string& what) {
  if (cfg.max_position_embeddings > 0 && len > cfg.max_position_embeddings)
    fail("{} {} exceeds the model's max_position_embeddings {} ({})", what, len,
         cfg.max_position_embeddings, cfg.source);
}

bool is_stop_token(const SamplingParams& p, const std::vector<int32_t>& eos_ids, int32_t tok) {
  if (!p.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), tok) != eos_ids.end()) return true;
  return std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end();
}

}  // namespace sala
