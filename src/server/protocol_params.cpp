// Request parameters beyond the basic sampling fields, and the table of parameters this server
// refuses. Every parameter of the OpenAI API reference, vLLM's extensions and SGLang's
// SamplingParams is either implemented or refused with a 400 naming it; none is silently
// ignored (tests/server/test_param_walk.py walks the lists). The few accepted without an
// effect are those whose only meaning is outside generation (ids, caching hints, metadata)
// or whose value asks for what the server does anyway (tool_choice "none", store false).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "server/protocol_fields.h"
#include "server/structured_output.h"

namespace sala::server {

using namespace fields;

namespace {

struct Refused {
  const char* name;
  const char* why;
};

// Decoding constraints this server does not implement (the others: structured_output.cpp).
constexpr Refused kConstraints[] = {
    {"structural_tag", "structural tags are not implemented (use json_schema, regex or ebnf)"},
    {"guided_whitespace_pattern", "whitespace patterns are not implemented (JSON output is compact)"},
    {"stop_regex", "regular-expression stops are not implemented"},
    {"bad_words", "bad_words is not implemented"},
    {"allowed_token_ids", "allowed_token_ids is not implemented"},
};

// Everything else the OpenAI routes know of and do not implement.
constexpr Refused kOpenAIRefused[] = {
    {"audio", "audio output is not supported"},
    
    {"prediction", "predicted outputs are not implemented"},
    {"verbosity", "verbosity control is not implemented"},
    {"moderation", "moderation is not supported"},
    {"prompt_logprobs", "prompt log probabilities are not implemented"},
    {"return_tokens_as_token_ids", "token-id output is not implemented"},
    {"use_beam_search", "beam search is not implemented"},
    {"length_penalty", "beam search is not implemented"},
    {"truncate_prompt_tokens", "prompt truncation is not implemented"},
    {"custom_logit_processor", "custom logit processors are not supported"},
    {"custom_params", "custom logit processors are not supported"},
    {"logits_processors", "custom logit processors are not supported"},
    {"lora_path", "LoRA adapters are not supported"},
    {"lora_request", "LoRA adapters are not supported"},
    {"return_hidden_states", "hidden states are not returned"},
    {"session_params", "sessions are not supported"},
    {"chat_template", "per-request chat templates are not supported"},
    {"documents", "documents for the chat template are not supported"},
    {"mm_processor_kwargs", "multimodal input is not supported"},
    {"image_data", "multimodal input is not supported"},
    {"priority", "priority scheduling is not implemented"},
    {"repetition_detection", "repetition detection is not implemented"},
};

// Refused at the top level of /generate (SGLang's GenerateReqInput).
constexpr Refused kGenerateRefused[] = {
    {"lora_path", "LoRA adapters are not supported"},
    {"image_data", "multimodal input is not supported"},
    {"audio_data", "multimodal input is not supported"},
    {"video_data", "multimodal input is not supported"},
    {"custom_logit_processor", "custom logit processors are not supported"},
    {"return_hidden_states", "hidden states are not returned"},
    {"session_params", "sessions are not supported"},
    {"return_routed_experts", "routed experts are not returned (the model has no experts)"},
};

void refuse_all(const json& o, const Refused* begin, const Refused* end) {
  for (const Refused* r = begin; r != end; ++r) refuse_if_present(o, r->name, r->why);
}

// A string field accepted only with the given values (those that ask for what the server
// does anyway).
void accept_only(const json& o, const char* k, std::initializer_list<const char*> ok,
                 const char* why) {
  const json* v = field(o, k);
  if (!v) return;
  if (v->is_string())
    for (const char* x : ok)
      if (v->get<std::string>() == x) return;
  std::string list;
  for (const char* x : ok) list += fmt::format("{}'{}'", list.empty() ? "" : ", ", x);
  bad_request(k, fmt::format("'{}' is not supported by this server ({}); accepted: {}", k, why, list));
}

// OpenAI / SGLang logit_bias: {"token id": bias}, ids as strings (JSON keys), bias in
// [-100, 100] (check_sampling), ids within the vocabulary.
void parse_logit_bias(const json& o, const ProtocolLimits& lim, SamplingParams& p) {
  const json* v = field(o, "logit_bias");
  if (!v) return;
  if (!v->is_object())
    bad_request("logit_bias", fmt::format("'logit_bias' must be an object mapping token ids to biases, got {}",
                                          type_name(*v)));
  for (const auto& [key, bias] : v->items()) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != key.size())
      bad_request("logit_bias", fmt::format("'logit_bias' keys must be token ids, got '{}'", key));
    if (id < 0 || (lim.vocab_size > 0 && id >= lim.vocab_size))
      bad_request("logit_bias", fmt::format("'logit_bias': token id {} is out of range [0, {})", id, lim.vocab_size));
    if (!bias.is_number())
      bad_request("logit_bias", fmt::format("'logit_bias' values must be numbers, got {}", type_name(bias)));
    p.logit_bias.emplace_back(int32_t(id), float(bias.get<double>()));
  }
}

// min_tokens / min_new_tokens: at least 0, and within the budget when the budget is known
// (chat's default budget is the rest of the context: checked after tokenizing).
void parse_min_tokens(const json& o, const char* key, SamplingParams& p) {
  auto v = get_int(o, key);
  if (!v) return;
  if (*v < 0) bad_request(key, fmt::format("'{}' must be >= 0, got {}", key, *v));
  p.min_new_tokens = int32_t(std::min<int64_t>(*v, std::numeric_limits<int32_t>::max()));
  if (p.max_new_tokens > 0) {
    try {
      check_min_new_tokens(*v, p.max_new_tokens, key);
    } catch (const InvalidRequest& e) {
      throw bad_request(e);
    }
  }
}

void parse_stop_trim(const json& o, Sampling& s) {
  for (const char* k : {"include_stop_str_in_output", "no_stop_trim"})
    if (auto v = get_bool(o, k); v && *v) s.include_stop_str = true;
}

void sampling_extras(const json& o, const ProtocolLimits& lim, const char* min_key, Sampling& s) {
  parse_min_tokens(o, min_key, s.params);
  parse_logit_bias(o, lim, s.params);
  parse_stop_trim(o, s);
  // Accepted with SGLang's meaning for a fast tokenizer (tokenizer.json): HF's fast decode
  // ignores it, and our decode is HF's.
  (void)get_bool(o, "spaces_between_special_tokens");
  try {
    check_sampling(s.params);
  } catch (const InvalidRequest& e) {
    throw bad_request(e);
  }
}

}  // namespace

void parse_openai_extras(const json& body, const ProtocolLimits& lim, bool chat, Sampling& s) {
  // An empty object asks for web search with its defaults: refused whatever its value.
  if (field(body, "web_search_options"))
    bad_request("web_search_options", "'web_search_options' is not supported (web search is not available)");
  refuse_all(body, std::begin(kConstraints), std::end(kConstraints));
  refuse_all(body, std::begin(kOpenAIRefused), std::end(kOpenAIRefused));
  parse_openai_grammar(body, s);
  sampling_extras(body, lim, "min_tokens", s);
  // Ids, caching hints and metadata: no meaning for generation. Types are still checked.
  for (const char* k : {"user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "request_id"})
    (void)get_string(body, k);
  if (const json* m = field(body, "metadata"); m && !m->is_object())
    bad_request("metadata", "'metadata' must be an object");
  accept_only(body, "service_tier", {"auto", "default"}, "there is one tier");
  if (auto v = get_bool(body, "store"); v && *v)
    bad_request("store", "'store' is not supported: completions are not stored; send false or omit it");
  if (!chat) return;
  // The deprecated functions API: use tools / tool_choice (tool_calls.cpp).
  accept_only(body, "function_call", {"none", "auto"}, "the functions API is not implemented; use tools");
  if (const json* m = field(body, "modalities")) {
    if (!m->is_array() || m->size() != 1 || (*m)[0] != "text")
      bad_request("modalities", "only modalities [\"text\"] is supported");
  }
}

void parse_chat_extras(const json& body, ChatRequest& r) {
  r.add_generation_prompt = get_bool(body, "add_generation_prompt").value_or(true);
  r.continue_final_message = get_bool(body, "continue_final_message").value_or(false);
  // As vLLM (and transformers' apply_chat_template): both cannot hold. add_generation_prompt
  // defaults to true, so continuing needs an explicit false.
  if (r.continue_final_message && r.add_generation_prompt)
    bad_request("continue_final_message",
                "'continue_final_message' and 'add_generation_prompt' cannot both be true "
                "(add_generation_prompt defaults to true: send false to continue the final message)");
  r.echo = get_bool(body, "echo").value_or(false);
  r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(false);
  // SGLang's mapping onto the template: "none" turns thinking off, any other effort on,
  // unless chat_template_kwargs says otherwise.
  if (auto e = get_string(body, "reasoning_effort")) {
    static const char* kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    if (std::find(std::begin(kEfforts), std::end(kEfforts), *e) == std::end(kEfforts))
      bad_request("reasoning_effort", fmt::format("'reasoning_effort' must be one of none, minimal, low, "
                                                  "medium, high, xhigh; got '{}'", *e));
    if (!r.template_kwargs.contains("enable_thinking")) r.template_kwargs["enable_thinking"] = *e != "none";
    if (!r.template_kwargs.contains("thinking")) r.template_kwargs["thinking"] = *e != "none";
  }
}

void parse_generate_extras(const json& sp, const ProtocolLimits& lim, Sampling& s) {
  refuse_all(sp, std::begin(kConstraints), std::end(kConstraints));
  refuse_if_present(sp, "custom_params", "custom logit processors are not supported");
  parse_generate_grammar(sp, s, "/sampling_params");
  sampling_extras(sp, lim, "min_new_tokens", s);
  if (auto v = get_int(sp, "stream_interval")) {
    if (*v < 1) bad_request("stream_interval", fmt::format("'stream_interval' must be >= 1, got {}", *v));
    s.stream_interval = int32_t(std::min<int64_t>(*v, std::numeric_limits<int32_t>::max()));
  }
}

void refuse_generate_unsupported(const json& body) {
  refuse_all(body, std::begin(kGenerateRefused), std::end(kGenerateRefused));
}

}  // namespace sala::server
