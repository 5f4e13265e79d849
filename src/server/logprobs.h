// Log probabilities on the wire: the request fields of each route parsed into a
// LogprobRequest, and the response shapes built from the engine's TokenLogprobs.
//   chat (OpenAI):        logprobs: bool, top_logprobs: 0..20 →
//                         choices[i].logprobs = {"content": [{token, logprob, bytes,
//                         top_logprobs: [{token, logprob, bytes}]}]} (per chunk when streaming)
//   completions (OpenAI): logprobs: 0..20 (OpenAI allows 5; vLLM 20), echo →
//                         {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset},
//                         the prompt's tokens first with echo (the first one's logprob null)
//   /generate (SGLang):   return_logprob, top_logprobs_num, logprob_start_len (-1: the last
//                         prompt token), return_text_in_logprobs → meta_info.
//                         {input,output}_token_logprobs: [[logprob, id, text|null]],
//                         {input,output}_top_logprobs: [[[logprob, id, text|null]] | null]
// Values are of the raw model distribution (log_softmax of the logits before temperature,
// penalties and top-k/p; vLLM's default logprobs mode). Internal to src/server.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/protocol.h"
#include "tokenizer/tokenizer.h"

namespace sala::server {

void parse_chat_logprobs(const json& body, LogprobRequest& lp);
void parse_completion_logprobs(const json& body, bool echo, LogprobRequest& lp);
void parse_generate_logprobs(const json& body, LogprobRequest& lp);

// The engine's options for a prompt of prompt_len tokens (400 naming logprob_start_len when
// the start is past the prompt). A request for 0 new tokens still computes one prompt row:
// the engine's scoring request.
LogprobOptions engine_logprobs(const LogprobRequest& lp, int64_t prompt_len,
                               int32_t max_new_tokens);

class LogprobFormatter {
 public:
  explicit LogprobFormatter(const Tokenizer& tok) : tok_(tok) {}
  // chat: {"content": [...]} of output_logprobs[from, to).
  json chat(const std::vector<TokenLogprob>& lps, size_t from, size_t to) const;
  // completions: prompt (echo; may be null) then output_logprobs[from, to); text_offset
  // counts characters from *offset, which is advanced (streaming chunks continue it).
  json completion(const std::vector<TokenLogprob>* prompt, const std::vector<TokenLogprob>& out,
                  size_t from, size_t to, int32_t top_n, int64_t* offset) const;
  // An OpenAI choice's "logprobs" from output_logprobs[from, end): chat's, or completions'
  // (with_prompt: the prompt's first, for echo).
  json openai(bool chat, const LogprobRequest& lp, const SeqResult& r, size_t from,
              bool with_prompt, int64_t* offset) const {
    const size_t to = r.output_logprobs.size();
    return chat ? this->chat(r.output_logprobs, from, to)
                : completion(with_prompt ? &r.prompt_logprobs : nullptr, r.output_logprobs, from,
                             to, lp.top_n, offset);
  }
  // SGLang: adds the four meta_info fields (the top ones only with top_n > 0).
  void sglang(json& meta_info, const SeqResult& r, const LogprobRequest& lp) const;

 private:
  std::string text(int32_t id) const { return tok_.decode({id}, false); }
  json value(float lp) const;  // null for NaN (prompt position 0)
  const Tokenizer& tok_;
};

}  // namespace sala::server
