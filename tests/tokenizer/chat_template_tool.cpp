// Test driver for the Jinja chat-template parity test (tests/tokenizer/chat_template_parity.py).
//   chat_template_tool TEMPLATE_FILE MODEL_DIR CASES.jsonl OUT.jsonl
// The template is parsed once with sala::jinja::Template and once through
// sala::ChatTemplate::from_text (with MODEL_DIR's tokenizer). Case kinds:
//   {"kind":"jinja","context":{...}}  -> {"text":S} | {"error":S}   (interpreter, full context)
//   {"kind":"chat","messages":[{role,content[,tool_calls,tool_call_id]}],"add_generation_prompt":B,
//    "kwargs":{}[,"tools":[...]]}    -> {"text":S,"name":S} | {"error":S}  (ChatTemplate, the
//                                        server's path; tool_calls' arguments as JSON text)
// A template the interpreter refuses gives {"error":...} for every case.
#include <fmt/core.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

using ojson = nlohmann::ordered_json;

int main(int argc, char** argv) {
  if (argc != 5) {
    fmt::print(stderr, "usage: {} TEMPLATE_FILE MODEL_DIR CASES.jsonl OUT.jsonl\n", argv[0]);
    return 2;
  }
  try {
    std::ifstream tf(argv[1], std::ios::binary);
    if (!tf) sala::fail("cannot read {}", argv[1]);
    std::stringstream ss;
    ss << tf.rdbuf();
    std::string text = ss.str();
    auto tok = sala::Tokenizer::load(argv[2]);
    std::shared_ptr<const sala::jinja::Template> jt;
    std::unique_ptr<sala::ChatTemplate> ct;
    std::string jt_err, ct_err;
    try {
      jt = sala::jinja::Template::parse(text);
    } catch (const sala::Error& e) {
      jt_err = e.what();
    }
    try {
      ct = sala::ChatTemplate::from_text(text, *tok, argv[1]);
    } catch (const sala::Error& e) {
      ct_err = e.what();
    }
    std::ifstream in(argv[3]);
    std::ofstream out(argv[4]);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      ojson c = ojson::parse(line), r = ojson::object();
      std::string kind = c.at("kind");
      try {
        if (kind == "jinja") {
          if (!jt) sala::fail("{}", jt_err);
          r["text"] = jt->render(c.at("context"));
        } else if (kind == "chat") {
          if (!ct) sala::fail("{}", ct_err);
          std::vector<sala::ChatMessage> msgs;
          for (auto& m : c.at("messages")) {
            msgs.push_back({m.at("role"), m.at("content").is_null() ? "" : m.at("content")});
            if (m.contains("tool_calls")) msgs.back().tool_calls = nlohmann::json::parse(m["tool_calls"].dump());
            if (m.contains("tool_call_id")) msgs.back().tool_call_id = m["tool_call_id"];
          }
          const ojson tools = c.contains("tools") ? c["tools"] : ojson();
          r["text"] = ct->render(msgs, c.value("add_generation_prompt", false),
                                 nlohmann::json::parse(c.value("kwargs", ojson::object()).dump()), tools);
          r["name"] = ct->name();
        } else {
          r["error"] = "unknown kind " + kind;
        }
      } catch (const sala::Error& e) {
        r = ojson::object();
        r["error"] = e.what();
      }
      out << r.dump() << "\n";
    }
  } catch (const sala::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
