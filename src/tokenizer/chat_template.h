// Chat template rendering identical to transformers' apply_chat_template for the ChatML
// family of templates.
//
// Rather than interpreting arbitrary Jinja, the template text of the model directory is
// compared (after trimming trailing whitespace) with the known ChatML templates below,
// each rendered natively. Any other template is parsed by the Jinja-subset interpreter
// (jinja.h, same output as transformers' jinja2 setup) and rendered by it (name "jinja").
// A template the interpreter refuses (unsupported construct) is refused at load with a
// sala::Error: rendering a template we do not understand would silently change what the
// model sees. Known templates:
//   chatml-bos    {{ bos_token }} + ChatML (MiniCPM-SALA demo / sala-tiny-chat)
//   chatml        ChatML without BOS (the classic HF ChatML template)
//   chatml-think  ChatML, generation prompt followed by "<think>\n\n</think>\n\n" when
//                 enable_thinking is false (Qwen3 / MiniCPM4.1 convention)
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sala {

namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role;
  std::string content;
  // Tool calling (OpenAI shapes): an assistant message's tool_calls ([{id, type, function:
  // {name, arguments}}], arguments a JSON text) or null; a tool message's tool_call_id / name.
  nlohmann::json tool_calls = nullptr;
  std::string tool_call_id{}, name{};  // {}: a {role, content} aggregate sets nothing more
};

class ChatTemplate {
 public:
  // chat_template.jinja, else tokenizer_config.json "chat_template".
  static std::unique_ptr<ChatTemplate> load(const std::string& model_dir, const Tokenizer& tok);
  // Builds a template from its text (throws sala::Error if unsupported); `origin` names
  // where it came from in error messages.
  static std::unique_ptr<ChatTemplate> from_text(const std::string& text, const Tokenizer& tok,
                                                 const std::string& origin = "chat template");

  // tools: OpenAI's tools array (null: none). A Jinja template that renders tools itself
  // (its text names `tools` or `tool_calls`) gets them, and the messages' tool calls, as
  // transformers' apply_chat_template passes them (arguments as objects, as vLLM does); any
  // other template (the native ChatML ones) gets the Hermes / Qwen2.5 rendering of
  // chat_tools.h folded into plain messages, so the model sees the tools either way.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::json& template_kwargs = nlohmann::json::object(),
                     const nlohmann::ordered_json& tools = nullptr) const;
  // The template renders tools and tool calls itself.
  bool renders_tools() const { return renders_tools_; }
  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }  // the template text (/tokenizer_info)

 private:
  ChatTemplate() = default;
  std::string name_;
  std::string source_;
  std::string bos_;
  bool with_bos_ = false, with_think_ = false, renders_tools_ = false;
  std::string eos_;
  std::shared_ptr<const jinja::Template> jinja_;  // non-null: rendered by the interpreter
};

// transformers' continue_final_message: `rendered` cut right after the last occurrence of the
// final message's content (whitespace-trimmed if the template trimmed it), dropping its
// end-of-turn tokens so that generation continues the message. sala::Error if the content is
// not in the rendered text.
std::string cut_after_final_message(const std::string& rendered, const std::string& final_content);

}  // namespace sala
