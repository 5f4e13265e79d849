// Tool calling in chat prompts (chat_template.cpp uses these).
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

#include "tokenizer/chat_template.h"

namespace sala {

// For templates that do not render tools themselves: the messages with the tools and tool
// calls folded in as Qwen2.5's template (the Hermes format) renders them:
//   * the tool list, one JSON per line inside <tools></tools>, and the instruction to answer
//     with <tool_call>{"name": ..., "arguments": ...}</tool_call>, at the end of the system
//     message (a system message is added first when there is none);
//   * an assistant message's tool calls after its content, each
//     <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>;
//   * a run of tool messages as one user message of <tool_response>\n...\n</tool_response> parts.
std::vector<ChatMessage> hermes_tool_messages(const std::vector<ChatMessage>& messages,
                                              const nlohmann::ordered_json& tools);

// A message as a template sees it: role, content, and where given tool_calls (arguments as a
// JSON object when their text is one, as vLLM passes them), tool_call_id, name.
nlohmann::ordered_json template_message(const ChatMessage& m);

// The text of one tool call in the Hermes format (the server's tool-call grammar produces
// exactly this, and the parser reads it back): {"name": NAME, "arguments": ARGS}.
std::string hermes_call_json(const std::string& name, const std::string& arguments);

}  // namespace sala
