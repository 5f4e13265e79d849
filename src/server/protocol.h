// The server's only JSON code: OpenAI (/v1/chat/completions, /v1/completions) and SGLang
// (/generate) request bodies parsed and validated into typed structs, and the response /
// stream-chunk bodies built from typed results. ../shared/API.md is the contract.
//
// Every validation failure throws ApiError, which carries the HTTP status and the OpenAI
// error shape {"error": {"message", "type", "param", "code"}}. Unknown fields are ignored;
// known fields with a wrong type, an out-of-range value or a feature we do not implement
// (audio, beam search, ...) are refused with 400, never silently misread.
// Null counts as "not given" for every optional field (clients send "lora_path": null).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "engine/engine.h"
#include "engine/request_check.h"
#include "grammar/grammar.h"
#include "tokenizer/chat_template.h"

namespace sala::server {

using json = nlohmann::json;

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "",
           std::string type = "", std::string code = "");
  int status;
  std::string param, type, code;
  json body() const;  // {"error": {...}}
};

// Shorthand for a 400 naming the offending field.
[[noreturn]] void bad_request(const std::string& param, const std::string& message);
// The 400 of a request the engine's rules refuse (engine/request_check.h): the same message,
// its parameter and code.
ApiError bad_request(const InvalidRequest& e);

json error_body(int status, const std::string& message, const std::string& param = "",
                const std::string& type = "", const std::string& code = "");
// Dumps with invalid UTF-8 replaced (never throws).
std::string dump(const json& j);
// Parses a request body; 400 for empty/invalid JSON (incl. invalid UTF-8) or a non-object.
json parse_body(const std::string& body);

// Limits the validation needs from the running server.
struct ProtocolLimits {
  int64_t max_context_len = 0;  // prompt + completion tokens of one request
  int32_t vocab_size = 0;
  int32_t max_n = 64;
  int32_t max_stop_strings = 64;
};

// Log probabilities as a route asked for them (OpenAI's logprobs / top_logprobs / echo,
// SGLang's return_logprob / top_logprobs_num / logprob_start_len / return_text_in_logprobs);
// parsed in logprobs.cpp. Always of the raw distribution (LogprobOptions).
struct LogprobRequest {
  bool enabled = false;      // logprobs of the generated tokens
  int32_t top_n = 0;         // alternatives per token, 0..20
  bool prompt = false;       // the prompt's tokens too (echo, /generate)
  int64_t start = 0;         // first prompt position; -1: the last one (SGLang's default)
  bool return_text = false;  // SGLang: token texts in the tuples
};

// Sampling + stopping as the server applies them: SamplingParams for the engine, stop
// strings for the HTTP thread's StopStringMatcher.
struct Sampling {
  SamplingParams params;  // max_new_tokens < 0: "until the context is full" (resolved later)
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
  int32_t n = 1;
  LogprobRequest logprobs;
  // A matched stop string / stop token stays in the output (vLLM's include_stop_str_in_output,
  // SGLang's no_stop_trim).
  bool include_stop_str = false;
  int32_t stream_interval = 0;  // SGLang's per-request stream_interval; 0: the server's
  // Structured output (structured_output.h): what the output must match, and the request
  // parameter it came from (errors name it).
  std::optional<grammar::GrammarSpec> grammar;
  std::string grammar_param;
  // A JSON schema's place in the body (a JSON pointer), so that restore_client_order
  // (structured_output.h) can re-read it with the client's key order.
  std::string grammar_pointer;
};

// A prompt: text to tokenize, or token ids.
struct Prompt {
  std::optional<std::string> text;
  std::vector<int32_t> ids;
};

// ---- SGLang POST /generate ----
struct GenerateRequest {
  std::vector<Prompt> prompts;  // one per item
  bool batch = false;           // "text"/"input_ids" was a list: answer a list
  Sampling sampling;
  bool stream = false;
  std::string rid;              // optional "rid"
};
GenerateRequest parse_generate(const json& body, const ProtocolLimits& lim);

// OpenAI tool calling (tool_calls.h): the tools offered, how the model must use them.
struct ToolRequest {
  // The validated `tools` array (null: none), in the client's key order (restore_client_order):
  // the template shows the tools, and the grammar orders the arguments, as the client wrote them.
  nlohmann::ordered_json tools = nullptr;
  enum class Choice { None, Auto, Required, Named } choice = Choice::Auto;
  std::string named;     // Choice::Named: the function
  bool parallel = true;  // parallel_tool_calls: several calls in one answer
  // The answer is parsed for tool calls (tools given and tool_choice not "none").
  bool active() const { return tools.is_array() && !tools.empty() && choice != Choice::None; }
};

// ---- OpenAI POST /v1/chat/completions ----
struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  Sampling sampling;
  bool stream = false;
  bool include_usage = false;
  json template_kwargs = json::object();
  // vLLM's chat extensions (protocol_params.cpp): the rendered prompt ends with the
  // generation prompt, or open inside the final message; echo prepends that message.
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool echo = false;
  bool add_special_tokens = false;  // BOS etc. on top of what the template renders
  ToolRequest tools;
};
ChatRequest parse_chat(const json& body, const ProtocolLimits& lim);

// ---- OpenAI POST /v1/completions ----
struct CompletionRequest {
  std::string model;
  std::vector<Prompt> prompts;
  Sampling sampling;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
};
CompletionRequest parse_completion(const json& body, const ProtocolLimits& lim);

// Final or partial state of one generated sequence, as the response builders need it.
struct SeqResult {
  int32_t index = 0;            // choice index / batch index
  std::string text;             // full text so far (stop string cut)
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  bool finished = false;
  // finish: "stop" (matched_str or matched_token), "length", "abort"
  std::string finish;
  std::optional<std::string> matched_str;
  std::optional<int32_t> matched_token;
  std::string abort_message;
  double e2e_latency = 0;       // seconds, for the final SGLang chunk
  // With LogprobRequest::enabled: the prompt positions' and each shown token's logprobs.
  std::vector<TokenLogprob> prompt_logprobs, output_logprobs;
};

std::string openai_finish_reason(const SeqResult& r);  // "stop" | "length" | "abort"
json sglang_finish_reason(const SeqResult& r);         // null | {"type": ...}

// SGLang: {"text", "meta_info": {...}} (full text; streaming chunks carry it cumulatively).
json generate_result(const SeqResult& r, const std::string& id, bool with_index);

json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

json chat_response(const std::string& id, const std::string& model, int64_t created,
                   const std::vector<SeqResult>& seqs, const json& usage);
// One streaming chat chunk; role_only: the opening {"role":"assistant"} delta.
json chat_chunk(const std::string& id, const std::string& model, int64_t created, int32_t index,
                const std::optional<std::string>& delta, bool role_only,
                const std::optional<std::string>& finish_reason);
json completion_response(const std::string& id, const std::string& model, int64_t created,
                         const std::vector<SeqResult>& seqs, const json& usage);
json completion_chunk(const std::string& id, const std::string& model, int64_t created,
                      int32_t index, const std::string& text,
                      const std::optional<std::string>& finish_reason);
// The final stream_options.include_usage chunk (choices: []).
json usage_chunk(const std::string& object, const std::string& id, const std::string& model,
                 int64_t created, int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace sala::server
