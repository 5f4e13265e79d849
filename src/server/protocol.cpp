#include "server/protocol.h"

#include "server/logprobs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "server/protocol_fields.h"
#include "server/tool_calls.h"

namespace sala::server {

// ---------------------------------------------------------------- errors

namespace {
std::string default_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}
}  // namespace

ApiError::ApiError(int status_, std::string message, std::string param_, std::string type_,
                   std::string code_)
    : std::runtime_error(std::move(message)),
      status(status_),
      param(std::move(param_)),
      type(type_.empty() ? default_type(status_) : std::move(type_)),
      code(std::move(code_)) {}

json ApiError::body() const { return error_body(status, what(), param, type, code); }

json error_body(int status, const std::string& message, const std::string& param,
                const std::string& type, const std::string& code) {
  json e = {{"message", message},
            {"type", type.empty() ? default_type(status) : type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(status) : json(code)}};
  return json{{"error", std::move(e)}};
}

void bad_request(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

ApiError bad_request(const InvalidRequest& e) {
  return ApiError(400, e.what(), e.param(), "invalid_request_error", e.code());
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_body(const std::string& body) {
  if (body.empty()) throw ApiError(400, "The request body is empty; expected a JSON object.");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    // nlohmann rejects invalid UTF-8 inside strings with a parse error too.
    std::string what = e.what();
    const bool utf8 = what.find("UTF-8") != std::string::npos || what.find("utf-8") != std::string::npos;
    throw ApiError(400, fmt::format("The request body is not valid JSON{}: {}",
                                    utf8 ? " (invalid UTF-8)" : "", what));
  } catch (const json::out_of_range&) {  // a number beyond double, e.g. 1e309
    throw ApiError(400, "The request body has a number out of range (beyond a 64-bit float).");
  }
  if (!j.is_object()) throw ApiError(400, "The request body must be a JSON object.");
  return j;
}

// ---------------------------------------------------------------- typed field access

namespace fields {

const char* type_name(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

const json* field(const json& o, const char* k) {
  auto it = o.find(k);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> get_bool(const json& o, const char* k) {
  const json* v = field(o, k);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_request(k, fmt::format("'{}' must be a boolean, got {}", k, type_name(*v)));
  return v->get<bool>();
}

std::optional<double> get_number(const json& o, const char* k) {
  const json* v = field(o, k);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_request(k, fmt::format("'{}' must be a number, got {}", k, type_name(*v)));
  double d = v->get<double>();
  if (!std::isfinite(d)) bad_request(k, fmt::format("'{}' must be finite", k));
  return d;
}

int64_t as_int(const json& v, const std::string& name) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      bad_request(name, fmt::format("'{}' is out of range", name));
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18) return int64_t(d);
  }
  bad_request(name, fmt::format("'{}' must be an integer, got {}", name,
                                v.is_number() ? "a non-integral number" : type_name(v)));
}

std::optional<int64_t> get_int(const json& o, const char* k) {
  const json* v = field(o, k);
  if (!v) return std::nullopt;
  return as_int(*v, k);
}

std::optional<std::string> get_string(const json& o, const char* k) {
  const json* v = field(o, k);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_request(k, fmt::format("'{}' must be a string, got {}", k, type_name(*v)));
  return v->get<std::string>();
}

std::vector<int32_t> token_ids(const json& arr, const std::string& name, const ProtocolLimits& lim) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const json& x : arr) {
    if (!x.is_number_integer())
      bad_request(name, fmt::format("'{}' must contain only integer token ids, got {}", name, type_name(x)));
    int64_t id = as_int(x, name);
    if (id < 0 || (lim.vocab_size > 0 && id >= lim.vocab_size))
      bad_request(name, fmt::format("'{}': token id {} is out of range [0, {})", name, id, lim.vocab_size));
    ids.push_back(int32_t(id));
  }
  return ids;
}

void refuse_if_present(const json& o, const char* k, const char* what) {
  const json* v = field(o, k);
  if (!v) return;
  bool trivial = (v->is_boolean() && !v->get<bool>()) || (v->is_number() && v->get<double>() == 0) ||
                 (v->is_array() && v->empty()) || (v->is_object() && v->empty());
  if (!trivial) bad_request(k, fmt::format("'{}' is not supported by this server ({})", k, what));
}

}  // namespace fields

namespace {
using namespace fields;

// Fields shared by the OpenAI routes and SGLang's sampling_params.
// max_key: the field(s) holding the token budget.
// allow_zero: a budget of 0 new tokens is valid (scoring the prompt: echo, /generate).
void parse_sampling(const json& o, const std::vector<const char*>& max_keys, const char* seed_key,
                    const ProtocolLimits& lim, Sampling& s, bool allow_zero = false) {
  SamplingParams& p = s.params;
  // Types here; the bounds are the engine's (check_sampling below, check_new_tokens).
  if (auto v = get_number(o, "temperature")) p.temperature = float(*v);
  if (auto v = get_number(o, "top_p")) p.top_p = float(*v);
  if (auto v = get_int(o, "top_k"))
    p.top_k = int32_t(std::clamp<int64_t>(*v, std::numeric_limits<int32_t>::min(),
                                          std::numeric_limits<int32_t>::max()));
  if (auto v = get_number(o, "min_p")) p.min_p = float(*v);
  if (auto v = get_number(o, "frequency_penalty")) p.frequency_penalty = float(*v);
  if (auto v = get_number(o, "presence_penalty")) p.presence_penalty = float(*v);
  if (auto v = get_number(o, "repetition_penalty")) p.repetition_penalty = float(*v);
  try {
    check_sampling(p);
    for (const char* k : max_keys) {
      if (auto v = get_int(o, k)) {
        check_new_tokens(*v, 0, lim.max_context_len, k, allow_zero);  // before the prompt is known
        p.max_new_tokens = int32_t(std::min<int64_t>(*v, std::numeric_limits<int32_t>::max()));
        break;
      }
    }
  } catch (const InvalidRequest& e) {
    throw bad_request(e);
  }
  if (seed_key) {
    if (auto v = get_int(o, seed_key)) p.seed = uint64_t(*v);
  }
  if (auto v = get_bool(o, "ignore_eos")) p.ignore_eos = *v;
  if (auto v = get_bool(o, "skip_special_tokens")) s.skip_special_tokens = *v;
  if (auto v = get_int(o, "n")) {
    if (*v < 1 || *v > lim.max_n)
      bad_request("n", fmt::format("'n' must be between 1 and {}, got {}", lim.max_n, *v));
    s.n = int32_t(*v);
  }
  if (const json* v = field(o, "stop")) {
    std::vector<std::string> stops;
    if (v->is_string()) {
      stops.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const json& x : *v) {
        if (!x.is_string()) bad_request("stop", fmt::format("'stop' must contain only strings, got {}", type_name(x)));
        stops.push_back(x.get<std::string>());
      }
    } else {
      bad_request("stop", fmt::format("'stop' must be a string or an array of strings, got {}", type_name(*v)));
    }
    if (int(stops.size()) > lim.max_stop_strings)
      bad_request("stop", fmt::format("at most {} stop strings are allowed, got {}", lim.max_stop_strings, stops.size()));
    for (auto& x : stops)
      if (x.empty()) bad_request("stop", "stop strings must not be empty");
    s.stop = std::move(stops);
  }
  if (const json* v = field(o, "stop_token_ids")) {
    if (!v->is_array()) bad_request("stop_token_ids", "'stop_token_ids' must be an array of integers");
    p.stop_token_ids = token_ids(*v, "stop_token_ids", lim);
  }
}

std::vector<Prompt> parse_prompt_field(const json& v, const std::string& name, const ProtocolLimits& lim,
                                       bool& batch) {
  std::vector<Prompt> out;
  batch = false;
  if (v.is_string()) {
    out.push_back({v.get<std::string>(), {}});
    return out;
  }
  if (!v.is_array())
    bad_request(name, fmt::format("'{}' must be a string, an array of strings, an array of token ids "
                                  "or an array of arrays of token ids; got {}", name, type_name(v)));
  if (v.empty()) bad_request(name, fmt::format("'{}' must not be empty", name));
  if (v[0].is_number()) {
    Prompt p;
    p.ids = token_ids(v, name, lim);
    out.push_back(std::move(p));
    return out;
  }
  batch = true;
  for (const json& x : v) {
    if (x.is_string()) {
      out.push_back({x.get<std::string>(), {}});
    } else if (x.is_array()) {
      if (x.empty()) bad_request(name, fmt::format("'{}' contains an empty token list", name));
      Prompt p;
      p.ids = token_ids(x, name, lim);
      out.push_back(std::move(p));
    } else {
      bad_request(name, fmt::format("'{}' items must be strings or arrays of token ids, got {}", name, type_name(x)));
    }
  }
  return out;
}

bool parse_stream_options(const json& o, bool stream) {
  const json* so = field(o, "stream_options");
  if (!so) return false;
  if (!so->is_object()) bad_request("stream_options", "'stream_options' must be an object");
  if (!stream) bad_request("stream_options", "'stream_options' is only allowed when 'stream' is true");
  return get_bool(*so, "include_usage").value_or(false);
}

void refuse_openai_unsupported(const json& o) {
  refuse_if_present(o, "functions", "function calling is not implemented");
  if (auto v = get_int(o, "best_of"); v && *v != 1)
    bad_request("best_of", "'best_of' other than 1 is not supported");
}

}  // namespace

// ---------------------------------------------------------------- request parsers

GenerateRequest parse_generate(const json& body, const ProtocolLimits& lim) {
  GenerateRequest r;
  r.sampling.params.max_new_tokens = 128;  // SGLang's default
  const json* text = field(body, "text");
  const json* ids = field(body, "input_ids");
  if (text && ids) bad_request("text", "give either 'text' or 'input_ids', not both");
  if (!text && !ids) bad_request("text", "one of 'text' or 'input_ids' is required");
  if (field(body, "input_embeds")) bad_request("input_embeds", "'input_embeds' is not supported");
  if (text) {
    if (!text->is_string() && !text->is_array())
      bad_request("text", fmt::format("'text' must be a string or an array of strings, got {}", type_name(*text)));
    if (text->is_array())
      for (const json& x : *text)
        if (!x.is_string()) bad_request("text", "'text' items must be strings");
    r.prompts = parse_prompt_field(*text, "text", lim, r.batch);
  } else {
    if (!ids->is_array()) bad_request("input_ids", "'input_ids' must be an array of token ids or of arrays of token ids");
    if (!ids->empty() && ids->at(0).is_string()) bad_request("input_ids", "'input_ids' must contain token ids, not strings");
    r.prompts = parse_prompt_field(*ids, "input_ids", lim, r.batch);
  }
  if (const json* sp = field(body, "sampling_params")) {
    if (sp->is_array()) bad_request("sampling_params", "per-prompt 'sampling_params' lists are not supported; give one object");
    if (!sp->is_object()) bad_request("sampling_params", fmt::format("'sampling_params' must be an object, got {}", type_name(*sp)));
    parse_sampling(*sp, {"max_new_tokens"}, "sampling_seed", lim, r.sampling, /*allow_zero=*/true);
    if (!field(*sp, "sampling_seed")) {
      if (auto v = get_int(*sp, "seed")) r.sampling.params.seed = uint64_t(*v);
    }
    parse_generate_extras(*sp, lim, r.sampling);
  }
  refuse_generate_unsupported(body);
  r.stream = get_bool(body, "stream").value_or(false);
  parse_generate_logprobs(body, r.sampling.logprobs);
  if (auto rid = field(body, "rid")) {
    if (rid->is_string()) r.rid = rid->get<std::string>();
  }
  if (r.sampling.n > 1) {  // parallel sampling: n copies of each prompt, answered as a list
    std::vector<Prompt> expanded;
    for (auto& p : r.prompts)
      for (int i = 0; i < r.sampling.n; ++i) expanded.push_back(p);
    r.prompts = std::move(expanded);
    r.batch = true;
  }
  if (int64_t(r.prompts.size()) > int64_t(lim.max_n) * 16)
    bad_request("text", fmt::format("at most {} prompts per request", int64_t(lim.max_n) * 16));
  return r;
}

ChatRequest parse_chat(const json& body, const ProtocolLimits& lim) {
  ChatRequest r;
  r.sampling.params.max_new_tokens = -1;  // until the context is full (OpenAI's default)
  r.model = get_string(body, "model").value_or("");
  const json* msgs = field(body, "messages");
  if (!msgs) bad_request("messages", "'messages' is required");
  if (!msgs->is_array()) bad_request("messages", fmt::format("'messages' must be an array, got {}", type_name(*msgs)));
  if (msgs->empty()) bad_request("messages", "'messages' must contain at least one message");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_request(where, fmt::format("'{}' must be an object, got {}", where, type_name(m)));
    const json* role = field(m, "role");
    if (!role || !role->is_string()) bad_request(where + ".role", fmt::format("'{}.role' must be a string", where));
    std::string rs = role->get<std::string>();
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool" && rs != "developer")
      bad_request(where + ".role", fmt::format("'{}.role' must be one of system, user, assistant, tool, developer; got '{}'", where, rs));
    std::string content;
    const json* c = field(m, "content");
    if (!c) {
      if (rs != "assistant") bad_request(where + ".content", fmt::format("'{}.content' is required", where));
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      for (const json& part : *c) {
        if (!part.is_object() || get_string(part, "type").value_or("") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          bad_request(where + ".content", fmt::format("'{}.content' parts must be {{\"type\": \"text\", \"text\": string}}; "
                                                      "other content types are not supported", where));
        if (!content.empty()) content += "\n";
        content += part["text"].get<std::string>();
      }
    } else {
      bad_request(where + ".content", fmt::format("'{}.content' must be a string or an array of text parts, got {}", where, type_name(*c)));
    }
    ChatMessage msg;
    msg.role = rs;
    msg.content = std::move(content);
    r.messages.push_back(std::move(msg));
    parse_message_tool_fields(m, where, r.messages.back());
  }
  refuse_openai_unsupported(body);
  parse_chat_logprobs(body, r.sampling.logprobs);
  parse_sampling(body, {"max_completion_tokens", "max_tokens"}, "seed", lim, r.sampling);
  r.stream = get_bool(body, "stream").value_or(false);
  r.include_usage = parse_stream_options(body, r.stream);
  if (const json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) bad_request("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r.template_kwargs = *k;
  }
  parse_openai_extras(body, lim, /*chat=*/true, r.sampling);
  parse_chat_extras(body, r);
  parse_tools(body, r);  // after response_format: tool_choice "required" cannot have both
  return r;
}

CompletionRequest parse_completion(const json& body, const ProtocolLimits& lim) {
  CompletionRequest r;
  r.sampling.params.max_new_tokens = 16;  // OpenAI's default for completions
  r.model = get_string(body, "model").value_or("");
  const json* prompt = field(body, "prompt");
  if (!prompt) bad_request("prompt", "'prompt' is required");
  bool batch = false;
  r.prompts = parse_prompt_field(*prompt, "prompt", lim, batch);
  refuse_openai_unsupported(body);
  refuse_if_present(body, "suffix", "suffix insertion is not implemented");
  r.echo = get_bool(body, "echo").value_or(false);
  parse_completion_logprobs(body, r.echo, r.sampling.logprobs);
  // max_tokens 0 with echo: the prompt alone, scored (lm-evaluation-harness' loglikelihood).
  parse_sampling(body, {"max_tokens"}, "seed", lim, r.sampling, /*allow_zero=*/r.echo);
  if (int64_t(r.prompts.size()) * r.sampling.n > int64_t(lim.max_n) * 16)
    bad_request("prompt", "too many prompts x n in one request");
  r.stream = get_bool(body, "stream").value_or(false);
  r.include_usage = parse_stream_options(body, r.stream);
  parse_openai_extras(body, lim, /*chat=*/false, r.sampling);
  return r;
}

// ---------------------------------------------------------------- responses

std::string openai_finish_reason(const SeqResult& r) {
  if (r.finish == "stop" || r.finish == "length") return r.finish;
  return "abort";
}

json sglang_finish_reason(const SeqResult& r) {
  if (!r.finished) return nullptr;
  if (r.finish == "length") return {{"type", "length"}, {"length", r.completion_tokens}};
  if (r.finish == "stop") {
    json m = nullptr;
    if (r.matched_str) m = *r.matched_str;
    else if (r.matched_token) m = *r.matched_token;
    return {{"type", "stop"}, {"matched", m}};
  }
  return {{"type", "abort"}, {"message", r.abort_message}};
}

json generate_result(const SeqResult& r, const std::string& id, bool with_index) {
  json meta = {{"id", id},
               {"finish_reason", sglang_finish_reason(r)},
               {"prompt_tokens", r.prompt_tokens},
               {"completion_tokens", r.completion_tokens},
               {"cached_tokens", 0}};
  if (r.finished) meta["e2e_latency"] = r.e2e_latency;
  json out = {{"text", r.text}, {"meta_info", std::move(meta)}};
  if (with_index) out["index"] = r.index;
  return out;
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {
json matched_stop(const SeqResult& r) {
  if (r.matched_str) return *r.matched_str;
  if (r.matched_token) return *r.matched_token;
  return nullptr;
}
}  // namespace

json chat_response(const std::string& id, const std::string& model, int64_t created,
                   const std::vector<SeqResult>& seqs, const json& usage) {
  json choices = json::array();
  for (const auto& s : seqs)
    choices.push_back({{"index", s.index},
                       {"message", {{"role", "assistant"}, {"content", s.text}}},
                       {"logprobs", nullptr},
                       {"finish_reason", openai_finish_reason(s)},
                       {"matched_stop", matched_stop(s)}});
  return {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
          {"choices", std::move(choices)}, {"usage", usage}};
}

json chat_chunk(const std::string& id, const std::string& model, int64_t created, int32_t index,
                const std::optional<std::string>& delta, bool role_only,
                const std::optional<std::string>& finish_reason) {
  json d = json::object();
  if (role_only) {
    d["role"] = "assistant";
    d["content"] = "";
  } else if (delta) {
    d["content"] = *delta;
  }
  json choice = {{"index", index}, {"delta", std::move(d)}, {"logprobs", nullptr},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}};
  return {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
          {"choices", json::array({std::move(choice)})}};
}

json completion_response(const std::string& id, const std::string& model, int64_t created,
                         const std::vector<SeqResult>& seqs, const json& usage) {
  json choices = json::array();
  for (const auto& s : seqs)
    choices.push_back({{"index", s.index}, {"text", s.text}, {"logprobs", nullptr},
                       {"finish_reason", openai_finish_reason(s)}, {"matched_stop", matched_stop(s)}});
  return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
          {"choices", std::move(choices)}, {"usage", usage}};
}

json completion_chunk(const std::string& id, const std::string& model, int64_t created,
                      int32_t index, const std::string& text,
                      const std::optional<std::string>& finish_reason) {
  json choice = {{"index", index}, {"text", text}, {"logprobs", nullptr},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}};
  return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
          {"choices", json::array({std::move(choice)})}};
}

json usage_chunk(const std::string& object, const std::string& id, const std::string& model,
                 int64_t created, int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model},
          {"choices", json::array()}, {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

}  // namespace sala::server
