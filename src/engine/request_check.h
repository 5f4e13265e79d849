// The rules a generation request must satisfy, in one place: the bounds of every sampling
// parameter and the context-length rules. Engine::submit applies them to every request; the
// server applies them while parsing (so that a bad field is a 400 naming it, ../shared/API.md
// §3) and maps InvalidRequest to the OpenAI error body. `sala serve` and `sala bench offline`
// check their context against the model with check_model_context.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"

namespace sala {

struct SamplingParams;

// A request the rules refuse: the parameter at fault (OpenAI's "param": the request field,
// e.g. "top_p", "prompt", "max_tokens") and, for a context overflow, the OpenAI code
// "context_length_exceeded" (else empty). A sala::Error, so callers that do not care about
// the parameter see a plain error with the same message.
class InvalidRequest : public Error {
 public:
  InvalidRequest(std::string param, const std::string& msg, std::string code = "")
      : Error(msg), param_(std::move(param)), code_(std::move(code)) {}
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  std::string param_, code_;
};

// Bounds of the sampling parameters (OpenAI's where it defines them, SGLang's otherwise):
// temperature >= 0, top_p in (0, 1], top_k >= -1 (-1 and 0: off), min_p in [0, 1],
// repetition_penalty in (0, 10], frequency_penalty and presence_penalty in [-2, 2].
// min_new_tokens >= 0, logit_bias values in [-100, 100] (ids: check_logit_bias_ids).
// max_new_tokens is checked by check_new_tokens (it depends on the context), min_new_tokens
// against it by check_min_new_tokens.
void check_sampling(const SamplingParams& p);

// Whether token `tok` ends a request with these parameters: an EOS id of the model (unless
// ignore_eos) or one of its stop_token_ids.
bool is_stop_token(const SamplingParams& p, const std::vector<int32_t>& eos_ids, int32_t tok);

// Every logit_bias token id is in [0, vocab_size).
void check_logit_bias_ids(const SamplingParams& p, int32_t vocab_size,
                          const std::string& param = "logit_bias");

// A minimum of `min_new_tokens` within the budget of `max_new_tokens` (a larger minimum could
// never be met). `param` names the field that held the minimum.
void check_min_new_tokens(int64_t min_new_tokens, int64_t max_new_tokens,
                          const std::string& param = "min_new_tokens");

// A prompt of `prompt_len` tokens fits a context of `max_context_len` tokens (prompt +
// output): it is not empty and leaves room for at least one new token. `param` names the
// field for the error ("prompt", "prompt[2]", ...).
void check_prompt_length(int64_t prompt_len, int64_t max_context_len,
                         const std::string& param = "prompt");

// A budget of `max_new_tokens` new tokens: at least 1, and with a context limit
// (max_context_len > 0) prompt_len + max_new_tokens within it. prompt_len 0: the budget
// alone, before the prompt is known (a budget larger than the whole context). The engine
// passes no limit (a larger budget ends at the context with finish reason "length"); the
// HTTP API refuses it (API.md §3). `param` is the field that held the budget. allow_zero: a
// request that only scores its prompt (prompt logprobs) may ask for 0 new tokens.
void check_new_tokens(int64_t max_new_tokens, int64_t prompt_len, int64_t max_context_len,
                      const std::string& param = "max_new_tokens", bool allow_zero = false);

// A context of `len` positions (`what`: the flag or run that asks for it, for the message)
// is within the model's trained positions (max_position_embeddings, when the config gives
// it): positions past it are not the model's, and the GPU's InfLLM-v2 workspaces are sized
// for it. sala::Error naming the config file otherwise.
void check_model_context(const ModelConfig& cfg, int64_t len, const std::string& what);

}  // namespace sala
