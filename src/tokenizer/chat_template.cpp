#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

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
      t->with_bos_ = k.bos;
      t->with_think_ = k.think;
      t->bos_ = tok.bos_token();
      return t;
    }
  }
  fail("{}: unsupported chat template (only the ChatML templates chatml, chatml-bos and "
       "chatml-think are rendered; refusing to guess how this one renders)",
       origin);
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

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const nlohmann::json& kwargs) const {
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

}  // namespace sala
