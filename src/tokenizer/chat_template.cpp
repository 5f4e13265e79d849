#include "tokenizer/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "tokenizer/chat_tools.h"
#include "tokenizer/jinja.h"

namespace sala {
namespace {

namespace fs = std::filesystem;

struct Known {
  const char* name;
  const char* text;
  bool bos, think;
};

const Known kKnown[] = {
    {"chatml-bos",
     "{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
     "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|im_start|>assistant\n' }}{% endif %}",
     true, false},
    {"chatml",
     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
     "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|im_start|>assistant\n' }}{% endif %}",
     false, false},
    {"chatml-think",
     "{%- for message in messages %}\n"
     "    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
     "{%- endfor %}\n"
     "{%- if add_generation_prompt %}\n"
     "    {{- '<|im_start|>assistant\\n' }}\n"
     "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
     "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
     "    {%- endif %}\n"
     "{%- endif %}",
     false, true},
};

std::string rtrim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

std::unique_ptr<ChatTemplate> ChatTemplate::from_text(const std::string& text, const Tokenizer& tok,
                                                      const std::string& origin) {
  std::string norm = rtrim(text);
  for (auto& k : kKnown) {
    if (norm == k.text) {
      std::unique_ptr<ChatTemplate> t(new ChatTemplate());
      t->name_ = k.name;
      t->source_ = text;
      t->with_bos_ = k.bos;
      t->with_think_ = k.think;
      t->bos_ = tok.bos_token();
      return t;
    }
  }
  std::shared_ptr<const jinja::Template> parsed;
  try {
    parsed = jinja::Template::parse(text);
  } catch (const Error& e) {
    fail("{}: unsupported chat template (only the ChatML templates chatml, chatml-bos and "
         "chatml-think are rendered natively, and the Jinja interpreter refused it: {}; "
         "refusing to guess how this one renders)",
         origin, e.what());
  }
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  t->name_ = "jinja";
  t->source_ = text;
  t->jinja_ = std::move(parsed);
  t->renders_tools_ = text.find("tools") != std::string::npos || text.find("tool_calls") != std::string::npos;
  t->bos_ = tok.bos_token();
  t->eos_ = tok.eos_token();
  return t;
}

std::unique_ptr<ChatTemplate> ChatTemplate::load(const std::string& model_dir, const Tokenizer& tok) {
  fs::path dir(model_dir);
  fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja)) {
    std::ifstream f(jinja, std::ios::binary);
    if (!f) fail("cannot read {}", jinja.string());
    std::ostringstream ss;
    ss << f.rdbuf();
    return from_text(ss.str(), tok, jinja.string());
  }
  fs::path cfgp = dir / "tokenizer_config.json";
  if (fs::exists(cfgp)) {
    std::ifstream f(cfgp, std::ios::binary);
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", cfgp.string(), e.what());
    }
    if (cfg.contains("chat_template")) {
      const auto& ct = cfg["chat_template"];
      if (ct.is_string()) return from_text(ct.get<std::string>(), tok, cfgp.string());
      if (ct.is_array()) {
        for (auto& e : ct)
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template"))
            return from_text(e["template"].get<std::string>(), tok, cfgp.string());
      }
      fail("{}: chat_template has no default template", cfgp.string());
    }
  }
  fail("no chat template in {} (neither chat_template.jinja nor tokenizer_config.json \"chat_template\")",
       model_dir);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages_in, bool add_generation_prompt,
                                 const nlohmann::json& kwargs, const nlohmann::ordered_json& tools) const {
  const bool has_tools = tools.is_array() && !tools.empty();
  // A role "tool" message alone (no tools, no calls) renders as the template has it.
  const bool has_calls = std::any_of(messages_in.begin(), messages_in.end(),
                                     [](const ChatMessage& m) { return !m.tool_calls.is_null(); });
  std::vector<ChatMessage> folded;
  if ((has_tools || has_calls) && !renders_tools_) folded = hermes_tool_messages(messages_in, tools);
  const std::vector<ChatMessage>& messages = folded.empty() ? messages_in : folded;
  if (jinja_) {
    // Same globals as transformers' apply_chat_template: the template kwargs, the
    // special tokens, then messages / tools / documents / add_generation_prompt.
    nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
    if (!bos_.empty()) ctx["bos_token"] = bos_;
    if (!eos_.empty()) ctx["eos_token"] = eos_;
    if (kwargs.is_object())
      for (auto& [k, v] : kwargs.items()) ctx[k] = nlohmann::ordered_json::parse(v.dump());
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    for (auto& m : messages) msgs.push_back(template_message(m));
    ctx["messages"] = std::move(msgs);
    ctx["tools"] = has_tools && renders_tools_ ? tools : nlohmann::ordered_json(nullptr);
    ctx["documents"] = nullptr;
    ctx["add_generation_prompt"] = add_generation_prompt;
    return jinja_->render(ctx);
  }
  std::string out;
  if (with_bos_) out += bos_;
  for (auto& m : messages) {
    out += "<|im_start|>";
    out += m.role;
    out += '\n';
    out += m.content;
    out += "<|im_end|>\n";
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (with_think_ && kwargs.is_object() && kwargs.contains("enable_thinking") &&
        kwargs["enable_thinking"].is_boolean() && !kwargs["enable_thinking"].get<bool>())
      out += "<think>\n\n</think>\n\n";
  }
  return out;
}

std::string cut_after_final_message(const std::string& rendered, const std::string& final_content) {
  auto cut = [&](const std::string& c) -> std::optional<std::string> {
    if (c.empty()) return std::nullopt;
    const size_t at = rendered.rfind(c);
    if (at == std::string::npos) return std::nullopt;
    return rendered.substr(0, at + c.size());
  };
  if (auto r = cut(final_content)) return *r;
  size_t b = final_content.find_first_not_of(" \t\r\n"), e = final_content.find_last_not_of(" \t\r\n");
  if (b != std::string::npos)
    if (auto r = cut(final_content.substr(b, e - b + 1))) return *r;
  fail("continue_final_message: the final message's content does not appear in the rendered chat "
       "(an empty final message cannot be continued)");
}

}  // namespace sala
