// Unit tests of the tokenizer library (parity with Hugging Face is in parity.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/token_bytes.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string asset(const char* name) { return std::string(SALA_TOKENIZER_ASSETS) + "/" + name; }

std::vector<std::string> run_stops(std::vector<std::string> stops, std::vector<std::string> pieces,
                                   bool* stopped = nullptr, std::string* matched = nullptr) {
  sala::StopStringMatcher m(std::move(stops));
  std::string out;
  std::vector<std::string> emits;
  for (auto& p : pieces) {
    auto r = m.push(p);
    emits.push_back(r.emit);
    if (r.stopped) {
      if (stopped) *stopped = true;
      if (matched) *matched = r.matched;
      return emits;
    }
  }
  emits.push_back(m.flush());
  if (stopped) *stopped = false;
  return emits;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += x;
  return s;
}

TEST(StopStrings, CutBeforeMatchAcrossPieces) {
  bool stopped = false;
  std::string matched;
  auto e = run_stops({"STOP"}, {"hello S", "TO", "P world"}, &stopped, &matched);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(matched, "STOP");
  EXPECT_EQ(join(e), "hello ");
  EXPECT_EQ(e[0], "hello ");  // "S" held back
  EXPECT_EQ(e[1], "");
}

TEST(StopStrings, HeldTextReleasedWhenDisambiguated) {
  auto e = run_stops({"</s>"}, {"a<", "/x", "y"});
  EXPECT_EQ(e[0], "a");
  EXPECT_EQ(e[1], "</x");
  EXPECT_EQ(join(e), "a</xy");
}

TEST(StopStrings, FlushReleasesPartialMatch) {
  bool stopped = true;
  auto e = run_stops({"<|im_end|>"}, {"done <|im_"}, &stopped);
  EXPECT_FALSE(stopped);
  EXPECT_EQ(join(e), "done <|im_");
}

TEST(StopStrings, EarliestMatchWins) {
  bool stopped = false;
  std::string matched;
  auto e = run_stops({"b", "abc"}, {"xxabc"}, &stopped, &matched);
  EXPECT_EQ(matched, "abc");
  EXPECT_EQ(join(e), "xx");
}

TEST(StopStrings, NoStops) {
  auto e = run_stops({}, {"a", "b"});
  EXPECT_EQ(join(e), "ab");
  EXPECT_EQ(e[0], "a");
}

TEST(StopStrings, NeverSplitsUtf8) {
  // "中" = E4 B8 AD; stop "\xE4\xB8X" shares two bytes with it.
  auto e = run_stops({"\xE4\xB8X"}, {"a\xE4\xB8\xAD", "b"});
  EXPECT_EQ(join(e), "a\xE4\xB8\xAD" "b");
}

TEST(Tokenizer, LoadErrorsNameTheFile) {
  try {
    sala::Tokenizer::load("/nonexistent/dir");
    FAIL();
  } catch (const sala::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir"), std::string::npos);
  }
  auto tmp = std::filesystem::temp_directory_path() /
             ("sala_tok_test_bad_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  std::ofstream(tmp / "tokenizer.json") << "{not json";
  try {
    sala::Tokenizer::load(tmp.string());
    FAIL();
  } catch (const sala::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos);
  }
  std::filesystem::remove_all(tmp);
}

TEST(Tokenizer, BasicsSpm1200) {
  auto tok = sala::Tokenizer::load(asset("spm-1200"));
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_ids(), std::vector<int32_t>{2});
  EXPECT_EQ(tok->vocab_size(), 1208);
  EXPECT_EQ(tok->token_to_id("<|im_end|>").value(), 1200);
  EXPECT_EQ(tok->token_to_id("<|im_start|>").value(), 1201);
  EXPECT_EQ(tok->id_to_token(1201), "<|im_start|>");
  EXPECT_TRUE(tok->is_special(1200));
  EXPECT_FALSE(tok->token_to_id("definitely-not-a-token").has_value());
  auto ids = tok->encode("<|im_start|>user\nhi 123<|im_end|>");
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids[1], 1201);
  EXPECT_EQ(ids.back(), 1200);
  EXPECT_EQ(tok->decode(ids, true), "user\nhi 123");
  EXPECT_EQ(tok->decode(ids, false), "<s><|im_start|> user\nhi 123<|im_end|>");
  // invalid UTF-8 is replaced by U+FFFD (Python errors="replace")
  EXPECT_EQ(tok->encode("a\xff" "b"), tok->encode("a\xEF\xBF\xBD" "b"));
}

TEST(Detokenizer, StreamEqualsDecode) {
  auto tok = sala::Tokenizer::load(asset("spm-1200"));
  std::string text = " Hello  world 中文 😀 <|im_end|> x\n\n  end ";
  auto ids = tok->encode(text, true);
  for (bool skip : {false, true}) {
    sala::IncrementalDetokenizer det(*tok, skip);
    std::string all;
    for (auto id : ids) all += det.push(id);
    all += det.flush();
    EXPECT_EQ(all, tok->decode(ids, skip));
  }
}

TEST(Detokenizer, HoldsIncompleteBytes) {
  auto tok = sala::Tokenizer::load(asset("spm-1200"));
  auto b = [&](int x) { return tok->token_to_id(fmt::format("<0x{:02X}>", x)).value(); };
  sala::IncrementalDetokenizer det(*tok, true);
  EXPECT_EQ(det.push(b(0xF0)), "");
  EXPECT_EQ(det.push(b(0x9F)), "");
  EXPECT_EQ(det.push(b(0x98)), "");
  EXPECT_EQ(det.push(b(0x80)), "");  // run may still continue
  EXPECT_EQ(det.flush(), "\xF0\x9F\x98\x80");
  sala::IncrementalDetokenizer det2(*tok, true);
  det2.push(b(0xE4));
  EXPECT_EQ(det2.flush(), "\xEF\xBF\xBD");  // incomplete => U+FFFD like HF
}

TEST(ChatTemplate, RendersAndRefuses) {
  auto tok = sala::Tokenizer::load(asset("hfbpe-3000"));
  auto t = sala::ChatTemplate::load(asset("hfbpe-3000"), *tok);
  EXPECT_EQ(t->name(), "chatml-think");
  std::vector<sala::ChatMessage> msgs{{"user", "hi"}};
  EXPECT_EQ(t->render(msgs, true, {{"enable_thinking", false}}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(t->render(msgs, true, nlohmann::json::object()), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  // Not a known ChatML template: rendered by the Jinja-subset interpreter.
  auto j = sala::ChatTemplate::from_text("{{ messages[0]['content'] | upper }}", *tok);
  EXPECT_EQ(j->name(), "jinja");
  EXPECT_EQ(j->render(msgs, false), "HI");
  // Constructs the interpreter does not support are still refused at load.
  EXPECT_THROW(sala::ChatTemplate::from_text("{% macro f() %}x{% endmacro %}{{ f() }}", *tok), sala::Error);
  EXPECT_THROW(sala::ChatTemplate::from_text("{{ messages | dictsort }}", *tok), sala::Error);
}

}  // namespace

// The grammar engine's view of the vocabulary: the bytes of a text's tokens, concatenated, are
// the text (after the normalizer's leading space), byte-fallback tokens included; special
// tokens are empty (no grammar may produce them).
TEST(TokenBytes, ConcatenationIsTheText) {
  for (const std::string dir : {std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat", asset("spm-1200"),
                                asset("hfbpe-3000")}) {
    auto tok = sala::Tokenizer::load(dir);
    const std::vector<std::string> bytes = sala::grammar_token_bytes(*tok);
    ASSERT_EQ(bytes.size(), size_t(tok->vocab_size())) << dir;
    for (const std::string text : {"Hello world, 123!", "{\"a\": [1, 2.5e3]}", "caf\xc3\xa9 \xe2\x82\xac\xf0\x9f\x99\x82 ok"}) {
      const std::vector<int32_t> ids = tok->encode(text, /*add_special_tokens=*/false);
      std::string joined;
      for (int32_t id : ids) joined += bytes[size_t(id)];
      // SentencePiece-style normalizers prepend a space that decode strips.
      EXPECT_TRUE(joined == text || joined == " " + text) << dir << ": '" << joined << "'";
    }
    for (int32_t id = 0; id < tok->vocab_size(); ++id)
      if (tok->is_special(id)) EXPECT_EQ(bytes[size_t(id)], "") << dir << " special token " << id;
  }
}
