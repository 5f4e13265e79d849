#include "server/structured_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "server/protocol_fields.h"
#include "server/tool_calls.h"
#include "tokenizer/token_bytes.h"

namespace sala::server {

using namespace fields;
using Kind = grammar::GrammarSpec::Kind;

namespace {

void set_grammar(Sampling& s, Kind kind, std::string text, const std::string& param) {
  set_request_grammar(s, kind, std::move(text), param);
}

// A JSON schema given as an object, or as a string holding one (vLLM and SGLang accept both).
std::string schema_text(const json& v, const std::string& param) {
  if (v.is_object()) return v.dump();
  if (v.is_boolean() && v.get<bool>()) return "{}";  // JSON Schema's `true`: anything
  if (v.is_string()) {
    json parsed;
    try {
      parsed = json::parse(v.get<std::string>());
    } catch (const json::exception&) {
      bad_request(param, fmt::format("'{}' must be a JSON schema; its string is not valid JSON", param));
    }
    if (!parsed.is_object())
      bad_request(param, fmt::format("'{}' must be a JSON schema object", param));
    return parsed.dump();
  }
  bad_request(param, fmt::format("'{}' must be a JSON schema (an object), got {}", param, type_name(v)));
}

std::string string_of(const json& v, const std::string& param) {
  if (!v.is_string()) bad_request(param, fmt::format("'{}' must be a string, got {}", param, type_name(v)));
  if (v.get_ref<const std::string&>().empty()) bad_request(param, fmt::format("'{}' must not be empty", param));
  return v.get<std::string>();
}

std::vector<std::string> choices_of(const json& v, const std::string& param) {
  if (!v.is_array() || v.empty())
    bad_request(param, fmt::format("'{}' must be a non-empty array of strings", param));
  std::vector<std::string> out;
  for (const json& c : v) {
    if (!c.is_string()) bad_request(param, fmt::format("'{}' must contain only strings, got {}", param, type_name(c)));
    out.push_back(c.get<std::string>());
  }
  return out;
}

void parse_response_format(const json& rf, Sampling& s) {
  if (!rf.is_object()) bad_request("response_format", "'response_format' must be an object");
  const std::string type = get_string(rf, "type").value_or("");
  if (type == "text") return;
  if (type == "json_object") return set_grammar(s, Kind::JsonObject, "", "response_format");
  if (type == "json_schema") {
    const json* js = field(rf, "json_schema");
    if (!js || !js->is_object())
      bad_request("response_format", "response_format type 'json_schema' needs a 'json_schema' object "
                                     "({\"name\": ..., \"schema\": {...}})");
    (void)get_bool(*js, "strict");  // outputs always follow the schema strictly
    const json* schema = field(*js, "schema");
    if (!schema) return set_grammar(s, Kind::JsonObject, "", "response_format");
    set_grammar(s, Kind::JsonSchema, schema_text(*schema, "response_format.json_schema.schema"),
                "response_format");
    s.grammar_pointer = "/response_format/json_schema/schema";
    return;
  }
  bad_request("response_format", fmt::format("response_format type must be 'text', 'json_object' or "
                                              "'json_schema', got '{}'", type));
}

// vLLM's StructuredOutputsParams.
void parse_structured_outputs(const json& so, Sampling& s) {
  if (!so.is_object()) bad_request("structured_outputs", "'structured_outputs' must be an object");
  for (const auto& [k, v] : so.items()) {
    if (v.is_null()) continue;
    const std::string param = "structured_outputs." + k;
    if (k == "json") {
      set_grammar(s, Kind::JsonSchema, schema_text(v, param), "structured_outputs");
      s.grammar_pointer = "/structured_outputs/json";
    }
    else if (k == "regex") set_grammar(s, Kind::Regex, string_of(v, param), "structured_outputs");
    else if (k == "grammar") set_grammar(s, Kind::Ebnf, string_of(v, param), "structured_outputs");
    else if (k == "choice") set_grammar(s, Kind::Regex, choice_regex(choices_of(v, param)), "structured_outputs");
    else if (k == "json_object") {
      if (!v.is_boolean()) bad_request(param, fmt::format("'{}' must be a boolean", param));
      if (v.get<bool>()) set_grammar(s, Kind::JsonObject, "", "structured_outputs");
    } else if (k == "disable_any_whitespace" || k == "disable_fallback" || k == "disable_additional_properties") {
      (void)get_bool(so, k.c_str());  // what this server does anyway: compact, no fallback, strict
    } else {
      bad_request(param, fmt::format("'{}' is not supported by this server (json, regex, grammar, choice "
                                     "and json_object are)", param));
    }
  }
}

}  // namespace

// One constraint per request: a second one is refused rather than one silently winning.
void set_request_grammar(Sampling& s, Kind kind, std::string text, const std::string& param) {
  if (s.grammar)
    bad_request(param, fmt::format("'{}' cannot be combined with '{}': give one output constraint",
                                   param, s.grammar_param));
  s.grammar = grammar::GrammarSpec{kind, std::move(text)};
  s.grammar_param = param;
}

grammar::VocabInfo grammar_vocab(const Tokenizer& tok, int32_t vocab_size, std::vector<int32_t> eos_ids) {
  grammar::VocabInfo v;
  v.token_bytes = grammar_token_bytes(tok);
  v.token_bytes.resize(std::min(v.token_bytes.size(), size_t(vocab_size)));
  // Tokens with a raw control character other than \n and \r are never allowed under a
  // grammar: xgrammar 0.2.8's length-bounded JSON strings (maxLength / minLength) admit them
  // (json_schema_converter.cc, GenerateString: its class excludes only '"', '\\', CR, LF),
  // and JSON forbids them (json.loads refuses the output). Newlines, spaces and escapes remain.
  for (std::string& b : v.token_bytes)
    if (std::any_of(b.begin(), b.end(), [](char c) { return uint8_t(c) < 0x20 && c != '\n' && c != '\r'; }))
      b.clear();
  v.vocab_size = vocab_size;
  for (int32_t id : tok.eos_ids()) eos_ids.push_back(id);
  std::sort(eos_ids.begin(), eos_ids.end());
  eos_ids.erase(std::unique(eos_ids.begin(), eos_ids.end()), eos_ids.end());
  std::erase_if(eos_ids, [&](int32_t id) { return id < 0 || id >= vocab_size; });
  v.stop_ids = std::move(eos_ids);
  return v;
}

std::unique_ptr<grammar::GrammarCompiler> make_grammar_compiler(const Tokenizer& tok, int32_t vocab_size,
                                                                std::vector<int32_t> eos_ids) {
  grammar::VocabInfo v;
  try {
    v = grammar_vocab(tok, vocab_size, std::move(eos_ids));
  } catch (const Error& e) {
    std::fprintf(stderr, "sala serve: structured output is off: %s\n", e.what());
    return nullptr;
  }
  return std::make_unique<grammar::GrammarCompiler>(v);
}

std::string choice_regex(const std::vector<std::string>& choices) {
  std::string re;
  for (const std::string& c : choices) {
    if (!re.empty()) re += '|';
    re += '(';
    for (char ch : c) {
      if (std::string_view("\\^$.|?*+()[]{}").find(ch) != std::string_view::npos) re += '\\';
      re += ch;
    }
    re += ')';
  }
  return re;
}

void parse_openai_grammar(const json& body, Sampling& s) {
  if (const json* rf = field(body, "response_format")) parse_response_format(*rf, s);
  parse_generate_grammar(body, s, "");  // SGLang's OpenAI routes take regex / ebnf / json_schema too
  if (const json* v = field(body, "guided_json")) {
    set_grammar(s, Kind::JsonSchema, schema_text(*v, "guided_json"), "guided_json");
    s.grammar_pointer = "/guided_json";
  }
  if (const json* v = field(body, "guided_regex")) set_grammar(s, Kind::Regex, string_of(*v, "guided_regex"), "guided_regex");
  if (const json* v = field(body, "guided_grammar")) set_grammar(s, Kind::Ebnf, string_of(*v, "guided_grammar"), "guided_grammar");
  if (const json* v = field(body, "guided_choice"))
    set_grammar(s, Kind::Regex, choice_regex(choices_of(*v, "guided_choice")), "guided_choice");
  if (const json* v = field(body, "structured_outputs")) parse_structured_outputs(*v, s);
  if (auto b = get_string(body, "guided_decoding_backend"); b && *b != "xgrammar" && *b != "auto")
    bad_request("guided_decoding_backend", fmt::format("'guided_decoding_backend' must be 'xgrammar' or "
                                                       "'auto' (this server's grammar engine), got '{}'", *b));
}

void parse_generate_grammar(const json& sp, Sampling& s, const std::string& pointer_prefix) {
  if (const json* v = field(sp, "regex")) set_grammar(s, Kind::Regex, string_of(*v, "regex"), "regex");
  if (const json* v = field(sp, "ebnf")) set_grammar(s, Kind::Ebnf, string_of(*v, "ebnf"), "ebnf");
  if (const json* v = field(sp, "json_schema")) {
    set_grammar(s, Kind::JsonSchema, schema_text(*v, "json_schema"), "json_schema");
    s.grammar_pointer = pointer_prefix + "/json_schema";
  }
}

void restore_client_order(const std::string& raw_body, Sampling& s, ToolRequest* tools) {
  const bool schema = s.grammar && s.grammar->kind == Kind::JsonSchema && !s.grammar_pointer.empty();
  const bool has_tools = tools && tools->tools.is_array() && !tools->tools.empty();
  if (!schema && !has_tools) return;
  nlohmann::ordered_json body;
  try {
    body = nlohmann::ordered_json::parse(raw_body);  // parsed before: cannot fail
  } catch (const nlohmann::json::exception&) {
    return;
  }
  if (schema) {
    const auto& v = body.at(nlohmann::ordered_json::json_pointer(s.grammar_pointer));
    s.grammar->text = v.is_string() ? nlohmann::ordered_json::parse(v.get<std::string>()).dump() : v.dump();
  }
  if (has_tools) {
    const auto& given = body.at("tools");  // validated: same length, each with a function
    for (size_t i = 0; i < tools->tools.size(); ++i) tools->tools[i]["function"] = given.at(i).at("function");
    if (s.grammar && s.grammar_param == "tool_choice") s.grammar->text = tool_call_structural_tag(*tools);
  }
}

std::shared_ptr<const grammar::CompiledGrammar> compile_request_grammar(
    grammar::GrammarCompiler* compiler, const Sampling& s) {
  if (!s.grammar) return nullptr;
  if (!compiler)
    bad_request(s.grammar_param, fmt::format("'{}': structured output is not available for this model's "
                                             "tokenizer", s.grammar_param));
  try {
    return compiler->compile(*s.grammar);
  } catch (const grammar::GrammarError& e) {
    throw ApiError(400, fmt::format("'{}': {}", s.grammar_param, e.what()), s.grammar_param,
                   "invalid_request_error", "invalid_grammar");
  }
}

}  // namespace sala::server
