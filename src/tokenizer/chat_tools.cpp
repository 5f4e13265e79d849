#include "tokenizer/chat_tools.h"

namespace sala {

namespace {

// transformers' tojson: ensure_ascii=False, Python's ", " and ": " separators, keys in order.
std::string tojson(const nlohmann::ordered_json& j) {
  if (j.is_object()) {
    std::string out = "{";
    for (auto it = j.begin(); it != j.end(); ++it)
      out += (it == j.begin() ? "" : ", ") + nlohmann::ordered_json(it.key()).dump() + ": " + tojson(it.value());
    return out + "}";
  }
  if (j.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + tojson(j[i]);
    return out + "]";
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::ordered_json arguments_value(const std::string& text) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return text;  // not JSON: the template sees the string
  }
}

}  // namespace

std::string hermes_call_json(const std::string& name, const std::string& arguments) {
  nlohmann::ordered_json args = arguments_value(arguments);
  return "{\"name\": " + tojson(name) + ", \"arguments\": " + (args.is_string() ? tojson(args) : arguments) + "}";
}

std::vector<ChatMessage> hermes_tool_messages(const std::vector<ChatMessage>& messages,
                                              const nlohmann::ordered_json& tools) {
  std::vector<ChatMessage> out;
  size_t first = 0;
  if (tools.is_array() && !tools.empty()) {
    std::string sys;
    if (!messages.empty() && messages[0].role == "system") {
      sys = messages[0].content + "\n\n";
      first = 1;
    }
    sys += "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
           "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const auto& t : tools) sys += "\n" + tojson(t);
    sys += "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
           "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
           "\"arguments\": <args-json-object>}\n</tool_call>";
    out.push_back({"system", sys});
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      std::string body;
      for (; i < messages.size() && messages[i].role == "tool"; ++i)
        body += (body.empty() ? "" : "\n") + std::string("<tool_response>\n") + messages[i].content + "\n</tool_response>";
      --i;
      out.push_back({"user", body});
      continue;
    }
    ChatMessage plain{m.role, m.content};
    if (m.tool_calls.is_array())
      for (const auto& call : m.tool_calls) {
        const auto& f = call.at("function");
        if (!plain.content.empty()) plain.content += "\n";
        plain.content += "<tool_call>\n" +
                         hermes_call_json(f.at("name").get<std::string>(), f.at("arguments").get<std::string>()) +
                         "\n</tool_call>";
      }
    out.push_back(std::move(plain));
  }
  return out;
}

nlohmann::ordered_json template_message(const ChatMessage& m) {
  nlohmann::ordered_json j = {{"role", m.role}, {"content", m.content}};
  if (m.tool_calls.is_array()) {
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();
    for (const auto& call : m.tool_calls) {
      nlohmann::ordered_json c = nlohmann::ordered_json::parse(call.dump());
      if (c.contains("function") && c["function"].contains("arguments") && c["function"]["arguments"].is_string())
        c["function"]["arguments"] = arguments_value(c["function"]["arguments"].get<std::string>());
      calls.push_back(std::move(c));
    }
    j["tool_calls"] = std::move(calls);
  }
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  if (!m.name.empty()) j["name"] = m.name;
  return j;
}

}  // namespace sala
