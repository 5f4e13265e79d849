// Internal to the protocol code (protocol.cpp, protocol_params.cpp, routes_extra.cpp): typed
// access to request fields, each failure a 400 naming the field, and the parsers of the
// parameters beyond the basic sampling fields (protocol_params.cpp).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "server/protocol.h"

namespace sala::server {

namespace fields {
const char* type_name(const json& v);                 // "a string", "an array", ...
const json* field(const json& o, const char* k);      // null when absent or null
std::optional<bool> get_bool(const json& o, const char* k);
std::optional<double> get_number(const json& o, const char* k);  // finite
int64_t as_int(const json& v, const std::string& name);          // integral numbers only
std::optional<int64_t> get_int(const json& o, const char* k);
std::optional<std::string> get_string(const json& o, const char* k);
// Token ids in [0, vocab_size).
std::vector<int32_t> token_ids(const json& arr, const std::string& name, const ProtocolLimits& lim);
// 400 when `k` is given with a value other than false / 0 / [] / {}; `what` says why.
void refuse_if_present(const json& o, const char* k, const char* what);
}  // namespace fields

// The OpenAI routes' parameters beyond the basic sampling fields (min_tokens, logit_bias,
// include_stop_str_in_output, ...) and the refusal of every known parameter this server
// does not implement. Call after parse_sampling (max_new_tokens is known).
void parse_openai_extras(const json& body, const ProtocolLimits& lim, bool chat, Sampling& s);
// Chat only: add_generation_prompt, continue_final_message, echo, add_special_tokens,
// reasoning_effort. Call after chat_template_kwargs was read.
void parse_chat_extras(const json& body, ChatRequest& r);
// SGLang's sampling_params beyond the basic fields (min_new_tokens, logit_bias, no_stop_trim,
// stream_interval, ...).
void parse_generate_extras(const json& sp, const ProtocolLimits& lim, Sampling& s);
// /generate's top-level fields this server does not implement (LoRA, images, sessions, ...).
void refuse_generate_unsupported(const json& body);

}  // namespace sala::server
