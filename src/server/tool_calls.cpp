#include "server/tool_calls.h"

#include <fmt/format.h>

#include <random>

#include "server/protocol_fields.h"
#include "server/structured_output.h"
#include "tokenizer/chat_tools.h"

namespace sala::server {

using namespace fields;

namespace {

constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";

std::string call_id() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("call_{:016x}{:08x}", rng(), uint32_t(rng()));
}

bool has_tool(const nlohmann::ordered_json& tools, const std::string& name) {
  for (const auto& t : tools)
    if (t["function"]["name"] == name) return true;
  return false;
}

nlohmann::ordered_json validated_tools(const json& v) {
  if (!v.is_array()) bad_request("tools", fmt::format("'tools' must be an array, got {}", type_name(v)));
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    const std::string where = fmt::format("tools[{}]", i);
    if (!t.is_object() || get_string(t, "type").value_or("function") != "function")
      bad_request(where, fmt::format("'{}' must be {{\"type\": \"function\", \"function\": {{...}}}}", where));
    const json* f = field(t, "function");
    if (!f || !f->is_object()) bad_request(where + ".function", fmt::format("'{}.function' must be an object", where));
    auto name = get_string(*f, "name");
    if (!name || name->empty()) bad_request(where + ".function.name", fmt::format("'{}.function.name' is required", where));
    if (has_tool(out, *name)) bad_request(where + ".function.name", fmt::format("two tools are named '{}'", *name));
    (void)get_string(*f, "description");
    if (const json* p = field(*f, "parameters"); p && !p->is_object())
      bad_request(where + ".function.parameters", fmt::format("'{}.function.parameters' must be a JSON schema object", where));
    out.push_back({{"type", "function"}, {"function", nlohmann::ordered_json::parse(f->dump())}});
  }
  return out;
}

}  // namespace

void parse_tools(const json& body, ChatRequest& r) {
  ToolRequest& t = r.tools;
  if (const json* v = field(body, "tools")) t.tools = validated_tools(*v);
  t.parallel = get_bool(body, "parallel_tool_calls").value_or(true);
  const bool has_tools = t.tools.is_array() && !t.tools.empty();
  if (const json* c = field(body, "tool_choice")) {
    if (c->is_string()) {
      const std::string s = c->get<std::string>();
      if (s == "none") t.choice = ToolRequest::Choice::None;
      else if (s == "auto") t.choice = ToolRequest::Choice::Auto;
      else if (s == "required") t.choice = ToolRequest::Choice::Required;
      else bad_request("tool_choice", fmt::format("'tool_choice' must be 'none', 'auto', 'required' or "
                                                  "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got '{}'", s));
    } else if (c->is_object() && field(*c, "function") && (*c)["function"].is_object()) {
      t.choice = ToolRequest::Choice::Named;
      t.named = get_string((*c)["function"], "name").value_or("");
      if (!has_tools || !has_tool(t.tools, t.named))
        bad_request("tool_choice", fmt::format("'tool_choice' names function '{}', which is not in 'tools'", t.named));
    } else {
      bad_request("tool_choice", "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (t.choice == ToolRequest::Choice::Required && !has_tools)
    bad_request("tool_choice", "'tool_choice' is 'required' but no 'tools' were given");
  if (t.choice == ToolRequest::Choice::Required || t.choice == ToolRequest::Choice::Named)
    set_request_grammar(r.sampling, grammar::GrammarSpec::Kind::StructuralTag, tool_call_structural_tag(t),
                        "tool_choice");
}

void parse_message_tool_fields(const json& m, const std::string& where, ChatMessage& out) {
  if (auto id = get_string(m, "tool_call_id")) out.tool_call_id = *id;
  if (auto n = get_string(m, "name")) out.name = *n;
  const json* calls = field(m, "tool_calls");
  if (!calls) return;
  const std::string param = where + ".tool_calls";
  if (out.role != "assistant") bad_request(param, fmt::format("'{}' is only allowed in assistant messages", param));
  if (!calls->is_array()) bad_request(param, fmt::format("'{}' must be an array", param));
  for (const json& c : *calls) {
    const json* f = c.is_object() ? field(c, "function") : nullptr;
    if (!f || !f->is_object() || !get_string(*f, "name") || !field(*f, "arguments") || !(*f)["arguments"].is_string())
      bad_request(param, fmt::format("'{}' entries must be {{\"id\", \"type\": \"function\", \"function\": "
                                     "{{\"name\": string, \"arguments\": string}}}}", param));
  }
  out.tool_calls = *calls;
}

std::string tool_call_structural_tag(const ToolRequest& t) {
  using ojson = nlohmann::ordered_json;
  ojson tags = ojson::array();
  for (const auto& tool : t.tools) {
    const auto& f = tool["function"];
    const std::string name = f["name"].get<std::string>();
    if (t.choice == ToolRequest::Choice::Named && name != t.named) continue;
    ojson params = f.contains("parameters") && f["parameters"].is_object() ? f["parameters"]
                                                                             : ojson{{"type", "object"}};
    // The block up to the arguments is fixed text; the arguments follow the schema, with runs
    // of at most one whitespace character (a model cannot pad forever).
    tags.push_back({{"type", "tag"},
                    {"begin", "<tool_call>\n{\"name\": " + ojson(name).dump() + ", \"arguments\": "},
                    {"content", {{"type", "json_schema"}, {"json_schema", params}, {"max_whitespace_cnt", 1}}},
                    {"end", "}\n</tool_call>"}});
  }
  ojson format = {{"type", "tags_with_separator"}, {"tags", tags}, {"separator", "\n"},
                  {"at_least_one", true}, {"stop_after_first", !t.parallel || t.choice == ToolRequest::Choice::Named}};
  return ojson{{"type", "structural_tag"}, {"format", format}}.dump();
}

// ---------------------------------------------------------------- parsing the answer

void ToolCallParser::emit_content(const std::string& text, Out& out) const {
  // After a call, the separators between blocks are not content.
  if (calls_ > 0 && text.find_first_not_of(" \t\r\n") == std::string::npos) return;
  out.content += text;
}

void ToolCallParser::close_block(const std::string& body, bool closed, Out& out) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(body);
  } catch (const nlohmann::json::exception&) {
    j = nullptr;
  }
  const auto* args = j.is_object() ? (j.contains("arguments") ? &j["arguments"] : j.contains("parameters") ? &j["parameters"] : nullptr) : nullptr;
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !args || !args->is_object()) {
    emit_content(std::string(kOpen) + body + (closed ? std::string(kClose) : ""), out);
    return;
  }
  out.calls.push_back({{"index", calls_++}, {"id", call_id()}, {"type", "function"},
                       {"function", {{"name", j["name"].get<std::string>()}, {"arguments", args->dump()}}}});
}

ToolCallParser::Out ToolCallParser::push(const std::string& text) {
  Out out;
  pending_ += text;
  for (;;) {
    if (inside_) {
      const size_t end = pending_.find(kClose);
      if (end == std::string::npos) return out;  // the block is still open
      close_block(pending_.substr(0, end), true, out);
      pending_.erase(0, end + kClose.size());
      inside_ = false;
      continue;
    }
    const size_t at = pending_.find(kOpen);
    if (at != std::string::npos) {
      emit_content(pending_.substr(0, at), out);
      pending_.erase(0, at + kOpen.size());
      inside_ = true;
      continue;
    }
    // Hold back a tail that may be the start of "<tool_call>"; the rest is content.
    size_t keep = 0;
    for (size_t n = std::min(pending_.size(), kOpen.size() - 1); n > 0; --n)
      if (pending_.compare(pending_.size() - n, n, kOpen.substr(0, n)) == 0) {
        keep = n;
        break;
      }
    // Whitespace after a call is held too: it is content only if text follows it.
    size_t cut = pending_.size() - keep;
    if (calls_ > 0) {
      const size_t last = pending_.find_last_not_of(" \t\r\n", cut == 0 ? std::string::npos : cut - 1);
      cut = last == std::string::npos ? 0 : std::min(cut, last + 1);
    }
    emit_content(pending_.substr(0, cut), out);
    pending_.erase(0, cut);
    return out;
  }
}

ToolCallParser::Out ToolCallParser::finish() {
  Out out;
  if (inside_) close_block(pending_, false, out);
  else emit_content(pending_, out);
  pending_.clear();
  inside_ = false;
  return out;
}

void apply_tool_calls(json& choice, const std::string& text) {
  ToolCallParser p;
  ToolCallParser::Out a = p.push(text), b = p.finish();
  if (p.calls() == 0) return;
  json calls = a.calls;
  for (auto& c : b.calls) calls.push_back(c);
  for (auto& c : calls) c.erase("index");
  std::string content = a.content + b.content;
  const size_t first = content.find_first_not_of(" \t\r\n"), last = content.find_last_not_of(" \t\r\n");
  json& msg = choice["message"];
  msg["content"] = first == std::string::npos ? json(nullptr) : json(content.substr(first, last - first + 1));
  msg["tool_calls"] = std::move(calls);
  if (choice["finish_reason"] == "stop") choice["finish_reason"] = "tool_calls";
}

}  // namespace sala::server
