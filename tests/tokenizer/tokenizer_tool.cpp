// Test driver for the tokenizer parity tests (tests/tokenizer/parity.py).
//   tokenizer_tool MODEL_DIR CASES.jsonl OUT.jsonl   one result line per case line
//   tokenizer_tool MODEL_DIR --bench FILE [REPEAT]   encode timing of FILE's text
// Case kinds:
//   {"kind":"encode","text":S | "bytes":[..],"add_special":B}      -> {"ids":[..]}
//   {"kind":"decode","ids":[..],"skip":B}                           -> {"text":S}
//   {"kind":"stream","ids":[..],"skip":B,"stops":[..]?}             -> {"text":S,"valid":B,
//        "stop_text":S,"stopped":B,"matched":S}   (stream = IncrementalDetokenizer pieces,
//        stop_* = the pieces run through a StopStringMatcher)
//   {"kind":"chat","messages":[{role,content}],"add_generation_prompt":B,"kwargs":{}} -> {"text":S}
//   {"kind":"info"} -> {"vocab_size","bos_id","eos_ids","special":[..]}
#include <chrono>
#include <fmt/core.h>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using json = nlohmann::json;

int main(int argc, char** argv) {
  if (argc < 4) {
    fmt::print(stderr, "usage: {} MODEL_DIR CASES.jsonl OUT.jsonl | MODEL_DIR --bench FILE [REPEAT]\n", argv[0]);
    return 2;
  }
  try {
    auto tok = sala::Tokenizer::load(argv[1]);
    if (std::string(argv[2]) == "--bench") {
      std::ifstream f(argv[3], std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      std::string text = ss.str();
      int repeat = argc > 4 ? std::atoi(argv[4]) : 5;
      double best = 1e9;
      size_t n = 0;
      for (int r = 0; r < repeat; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        auto ids = tok->encode(text, true);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, s);
        n = ids.size();
      }
      fmt::print("{{\"bytes\": {}, \"tokens\": {}, \"seconds\": {:.6f}, \"mb_per_s\": {:.2f}}}\n", text.size(), n,
                 best, text.size() / best / 1e6);
      return 0;
    }
    std::unique_ptr<sala::ChatTemplate> tmpl;
    std::string tmpl_error;
    try {
      tmpl = sala::ChatTemplate::load(argv[1], *tok);
    } catch (const sala::Error& e) {
      tmpl_error = e.what();
    }
    std::ifstream in(argv[2]);
    std::ofstream out(argv[3]);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      json c = json::parse(line), r = json::object();
      std::string kind = c.at("kind");
      if (kind == "encode") {
        std::string text;
        if (c.contains("bytes"))
          for (auto& b : c["bytes"]) text += static_cast<char>(b.get<int>());
        else
          text = c.at("text").get<std::string>();
        r["ids"] = tok->encode(text, c.value("add_special", true));
      } else if (kind == "decode") {
        r["text"] = tok->decode(c.at("ids").get<std::vector<int32_t>>(), c.value("skip", false));
      } else if (kind == "stream") {
        sala::IncrementalDetokenizer det(*tok, c.value("skip", false));
        sala::StopStringMatcher stop(c.value("stops", std::vector<std::string>{}));
        std::string all, stopped_text;
        bool valid = true, stopped = false;
        std::string matched;
        auto feed = [&](const std::string& piece) {
          valid = valid && sala::utf8::is_valid(piece);
          all += piece;
          if (stopped) return;
          auto res = stop.push(piece);
          stopped_text += res.emit;
          if (res.stopped) {
            stopped = true;
            matched = res.matched;
          }
        };
        for (auto& id : c.at("ids")) feed(det.push(id.get<int32_t>()));
        feed(det.flush());
        if (!stopped) stopped_text += stop.flush();
        r["text"] = all;
        r["valid"] = valid;
        r["stop_text"] = stopped_text;
        r["stopped"] = stopped;
        r["matched"] = matched;
      } else if (kind == "chat") {
        if (!tmpl) {
          r["error"] = tmpl_error;
        } else {
          std::vector<sala::ChatMessage> msgs;
          for (auto& m : c.at("messages")) msgs.push_back({m.at("role"), m.at("content")});
          r["text"] = tmpl->render(msgs, c.value("add_generation_prompt", false), c.value("kwargs", json::object()));
        }
      } else if (kind == "info") {
        r["vocab_size"] = tok->vocab_size();
        r["bos_id"] = tok->bos_id();
        r["eos_ids"] = tok->eos_ids();
        std::vector<int32_t> sp;
        for (int32_t i = 0; i < tok->vocab_size(); ++i)
          if (tok->is_special(i)) sp.push_back(i);
        r["special"] = sp;
      } else {
        r["error"] = "unknown kind " + kind;
      }
      out << r.dump() << "\n";
    }
  } catch (const sala::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
