// OpenAI tool calling in the Hermes / Qwen2.5 format (`--tool-call-parser hermes`, the format
// ChatML-family models use): the model answers with
//   <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
// blocks, which the server turns into the response's `tool_calls` (streamed as OpenAI's
// tool_calls deltas). tool_choice "required" or a named function is enforced with a grammar
// (an xgrammar structural tag: one or more such blocks, arguments following each function's
// parameter schema).
#pragma once
#include <string>

#include "server/protocol.h"

namespace sala::server {

// The request's tools, tool_choice and parallel_tool_calls into r.tools (400 naming each bad
// field); "required" / a named function set r.sampling's grammar.
void parse_tools(const json& body, ChatRequest& r);
// A message's tool fields: an assistant's tool_calls, a tool message's tool_call_id / name
// (`where`: "messages[i]" for errors).
void parse_message_tool_fields(const json& m, const std::string& where, ChatMessage& out);

// The structural tag (xgrammar JSON) of tool_choice required / named: Hermes blocks separated
// by "\n", at least one, only one unless parallel, arguments per the function's parameters.
std::string tool_call_structural_tag(const ToolRequest& t);

// Reads a (streamed) answer for Hermes tool-call blocks. Text outside blocks is content
// (whitespace between calls is dropped); a block whose JSON is not {"name": string,
// "arguments": object} stays content, as written.
class ToolCallParser {
 public:
  struct Out {
    std::string content;              // new content text
    json calls = json::array();       // new OpenAI tool_calls entries: {index, id, type, function}
  };
  Out push(const std::string& text);  // more of the answer
  Out finish();                       // the answer ended (an unclosed block is tried as a call)
  int calls() const { return calls_; }

 private:
  void close_block(const std::string& body, bool closed, Out& out);
  void emit_content(const std::string& text, Out& out) const;
  std::string pending_;
  bool inside_ = false;
  int calls_ = 0;
};

// A non-streamed chat choice with its tool calls taken out of the content: message.content
// (null when only calls remain), message.tool_calls, finish_reason "tool_calls" when the model
// called a tool and stopped by itself.
void apply_tool_calls(json& choice, const std::string& text);

}  // namespace sala::server
