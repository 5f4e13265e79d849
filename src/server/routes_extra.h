// Routes beside the generation routes, internal to src/server: GET /v1/models and
// /v1/models/{id}, vLLM's / SGLang's /tokenize,
// /detokenize, /tokenizer_info (lm-evaluation-harness's remote tokenizer), /version, and a
// text-only OpenAI /v1/responses (create, streamed or not). Also
// the chat prompt (template + vLLM's continue_final_message / add_special_tokens / echo),
// shared by /v1/chat/completions and /v1/responses.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "server/http_internal.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace sala::server::detail {

// What these routes need from the server (http_server.cpp fills it in).
struct RouteContext {
  const Tokenizer* tok = nullptr;
  const ChatTemplate* tmpl = nullptr;  // null: chat routes answer 400
  const ProtocolLimits* lim = nullptr;
  std::string model_id, model_path, version;
  Metrics* metrics = nullptr;
  // 404 (model_not_found) unless `model` names the served model (empty: the default).
  std::function<void(const std::string& model)> check_model;
  // Validated, tokenized prompts → submitted sequences (n per prompt), echo text first.
  std::function<std::vector<Seq>(const std::vector<std::vector<int32_t>>& prompts,
                                 const std::vector<std::string>& echo, const Sampling& sp, int n,
                                 const std::string& id)>
      submit;
  // Waits for the sequences, then answers body(seqs) (see HttpServer's respond_when_done).
  std::function<void(httplib::Response&, std::vector<Seq>, std::function<json(std::vector<Seq>&)>)>
      respond_when_done;
  // Counts the request and maps exceptions to OpenAI error bodies.
  std::function<httplib::Server::Handler(httplib::Server::Handler)> wrap;
};

void register_extra_routes(httplib::Server& svr, RouteContext ctx);

// The chat request's prompt ids: the template rendered with add_generation_prompt, or cut
// inside the final message (continue_final_message), encoded with add_special_tokens.
// ApiError 400 when the model has no template or the final message cannot be continued.
// The chat prompt as text (template, add_generation_prompt, continue_final_message), and its ids.
std::string chat_prompt_text(const ChatRequest& c, const ChatTemplate* tmpl);
std::vector<int32_t> chat_prompt_ids(const ChatRequest& c, const Tokenizer& tok, const ChatTemplate* tmpl);

// vLLM's chat echo: the final message's content when the reply continues it (the final
// message is the assistant's, or add_generation_prompt is false), else "".
std::string chat_echo_text(const ChatRequest& c);

}  // namespace sala::server::detail
