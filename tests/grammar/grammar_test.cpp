// The xgrammar wrapper (src/grammar) on a small synthetic vocabulary: every printable ASCII
// character, a few multi-character tokens, byte tokens, a special token and a stop token.
// Random walks through the allowed tokens must always give outputs of the grammar.
#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>

namespace sala::grammar {
namespace {

constexpr int32_t kStop = 0, kSpecial = 1;

VocabInfo test_vocab() {
  VocabInfo v;
  v.token_bytes = {"", ""};  // 0: stop (</s>), 1: a special token
  for (char c = 32; c < 127; ++c) v.token_bytes.emplace_back(1, c);
  for (const char* t : {"\"name\"", "true", "false", "{\"", "\":", "ab", "abc", "12", "  "})
    v.token_bytes.emplace_back(t);
  v.vocab_size = int32_t(v.token_bytes.size()) + 5;  // padded logits row: never allowed
  v.stop_ids = {kStop};
  return v;
}

bool allowed(const std::vector<uint32_t>& mask, int32_t id) { return (mask[id / 32] >> (id % 32)) & 1; }

// Samples uniformly among the allowed tokens until only the stop token is left, or the stop
// token is drawn; returns the text. Fails the test if a drawn token is refused.
std::string random_walk(GrammarCompiler& c, const GrammarSpec& spec, uint64_t seed, int max_tokens = 400) {
  GrammarMatcher m(c.compile(spec));
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(size_t(mask_words(m.vocab_size())));
  std::string out;
  for (int i = 0; i < max_tokens; ++i) {
    m.fill_next_mask(mask.data());
    if (m.only_stop_allowed(mask.data())) return out;
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < m.vocab_size(); ++id)
      if (allowed(mask, id)) ids.push_back(id);
    EXPECT_FALSE(allowed(mask, kSpecial));
    EXPECT_FALSE(allowed(mask, m.vocab_size() - 1));
    const int32_t tok = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
    if (tok == kStop) {
      EXPECT_TRUE(m.is_completed());
      return out;
    }
    EXPECT_TRUE(m.accept(tok));
    out += c.vocab().token_bytes[size_t(tok)];
  }
  ADD_FAILURE() << "no end after " << max_tokens << " tokens: " << out;
  return out;
}

TEST(Grammar, JsonSchemaWalksGiveValidObjects) {
  GrammarCompiler c(test_vocab());
  const GrammarSpec spec{GrammarSpec::Kind::JsonSchema, R"({"type": "object",
      "properties": {"name": {"type": "string", "maxLength": 5}, "ok": {"type": "boolean"},
                     "n": {"type": "integer", "minimum": 0, "maximum": 99}},
      "required": ["name", "ok", "n"]})"};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::string out = random_walk(c, spec, seed);
    const auto j = nlohmann::json::parse(out);  // throws (fails) on invalid JSON
    ASSERT_TRUE(j.is_object()) << out;
    EXPECT_TRUE(j["name"].is_string() && j["name"].get<std::string>().size() <= 5) << out;
    EXPECT_TRUE(j["ok"].is_boolean()) << out;
    EXPECT_TRUE(j["n"].is_number_integer() && j["n"] >= 0 && j["n"] <= 99) << out;
    EXPECT_EQ(j.size(), 3u) << out;  // strict: no other properties
  }
}

TEST(Grammar, JsonObjectIsAnObject) {
  GrammarCompiler c(test_vocab());
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const std::string out = random_walk(c, {GrammarSpec::Kind::JsonObject, ""}, seed, 2000);
    if (::testing::Test::HasFailure()) return;
    // A random walk writes numbers like 8E04229 that no double holds: exponents are cut to 0
    // first (inside strings that changes nothing about the syntax either).
    const std::string finite = std::regex_replace(out, std::regex("[eE][-+]?[0-9]+"), "e0");
    EXPECT_TRUE(nlohmann::json::parse(finite).is_object()) << out;
  }
}

TEST(Grammar, RegexWalksFullmatch) {
  GrammarCompiler c(test_vocab());
  const std::string re = "(ab|c)+[0-9]{2}";
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::string out = random_walk(c, {GrammarSpec::Kind::Regex, re}, seed);
    EXPECT_TRUE(std::regex_match(out, std::regex(re))) << out;
  }
}

TEST(Grammar, EbnfWalksParse) {
  GrammarCompiler c(test_vocab());
  const GrammarSpec spec{GrammarSpec::Kind::Ebnf, R"(root ::= "yes" | "no" | "n=" [0-9] [0-9]?)"};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::string out = random_walk(c, spec, seed);
    EXPECT_TRUE(std::regex_match(out, std::regex("yes|no|n=[0-9][0-9]?"))) << out;
  }
}

TEST(Grammar, InvalidInputIsAGrammarError) {
  GrammarCompiler c(test_vocab());
  EXPECT_THROW(c.compile({GrammarSpec::Kind::JsonSchema, "{not json"}), GrammarError);
  EXPECT_THROW(c.compile({GrammarSpec::Kind::JsonSchema, R"({"type": "no-such-type"})"}), GrammarError);
  EXPECT_THROW(c.compile({GrammarSpec::Kind::Regex, "(ab"}), GrammarError);
  EXPECT_THROW(c.compile({GrammarSpec::Kind::Ebnf, "root ::= undefined_rule"}), GrammarError);
  EXPECT_THROW(c.compile({GrammarSpec::Kind::StructuralTag, "{}"}), GrammarError);
  EXPECT_EQ(c.compilations(), 0);
  try {  // the reason, without xgrammar's "[time] file.cc:line: " prefix
    c.compile({GrammarSpec::Kind::JsonSchema, R"({"type": "no-such-type"})"});
  } catch (const GrammarError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("invalid JSON schema: ", 0), 0u) << m;
    EXPECT_EQ(m.find(".cc:"), std::string::npos) << m;
    EXPECT_NE(m.find("no-such-type"), std::string::npos) << m;
  }
}

TEST(Grammar, CompiledGrammarsAreCachedByText) {
  GrammarCompiler c(test_vocab(), /*max_cached=*/2);
  const GrammarSpec a{GrammarSpec::Kind::Regex, "a+"}, b{GrammarSpec::Kind::Regex, "b+"},
      d{GrammarSpec::Kind::Regex, "d+"};
  auto ga = c.compile(a);
  EXPECT_EQ(c.compile(a), ga);
  EXPECT_EQ(c.compilations(), 1);
  // Same text, other kind: another grammar.
  c.compile({GrammarSpec::Kind::Ebnf, R"(root ::= "a")"});
  EXPECT_EQ(c.compilations(), 2);
  c.compile(b);
  c.compile(d);  // the cache holds 2: a was the least recently used
  EXPECT_EQ(c.compilations(), 4);
  EXPECT_NE(c.compile(a), ga);
  EXPECT_EQ(c.compilations(), 5);
}

TEST(Grammar, AcceptRefusesAndRollbackRestores) {
  GrammarCompiler c(test_vocab());
  const VocabInfo& v = c.vocab();
  auto id_of = [&](const std::string& s) {
    return int32_t(std::find(v.token_bytes.begin(), v.token_bytes.end(), s) - v.token_bytes.begin());
  };
  GrammarMatcher m(c.compile({GrammarSpec::Kind::Regex, "abc"}));
  std::vector<uint32_t> mask(size_t(mask_words(m.vocab_size())));
  m.fill_next_mask(mask.data());
  EXPECT_TRUE(allowed(mask, id_of("a")) && allowed(mask, id_of("ab")) && allowed(mask, id_of("abc")));
  EXPECT_FALSE(allowed(mask, id_of("b")) || allowed(mask, kStop));
  EXPECT_FALSE(m.accept(id_of("b")));
  EXPECT_FALSE(m.accept(m.vocab_size() + 3));
  ASSERT_TRUE(m.accept(id_of("ab")));
  EXPECT_FALSE(m.is_completed());
  ASSERT_TRUE(m.accept(id_of("c")));
  EXPECT_TRUE(m.is_completed());
  m.fill_next_mask(mask.data());
  EXPECT_TRUE(m.only_stop_allowed(mask.data()));
  EXPECT_TRUE(allowed(mask, kStop));
  m.rollback(2);  // back before "ab"
  EXPECT_FALSE(m.is_completed());
  m.fill_next_mask(mask.data());
  EXPECT_FALSE(m.only_stop_allowed(mask.data()));
  EXPECT_TRUE(allowed(mask, id_of("abc")));
  EXPECT_TRUE(m.accept(id_of("abc")));
  EXPECT_TRUE(m.is_completed());
}

TEST(Grammar, StructuralTagToolCall) {
  GrammarCompiler c(test_vocab());
  const std::string tag = R"({"type": "structural_tag", "format": {"type": "tags_with_separator",
      "separator": "\n", "at_least_one": true, "stop_after_first": true,
      "tags": [{"type": "tag", "begin": "<call>{\"name\": \"f\", \"arguments\": ",
                "content": {"type": "json_schema", "json_schema": {"type": "object",
                    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"]},
                "max_whitespace_cnt": 1},
                "end": "}</call>"}]}})";
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const std::string out = random_walk(c, {GrammarSpec::Kind::StructuralTag, tag}, seed);
    ASSERT_TRUE(out.rfind("<call>", 0) == 0 && out.size() > 14) << out;
    ASSERT_EQ(out.substr(out.size() - 7), "</call>") << out;
    EXPECT_EQ(out.find("  "), std::string::npos) << out;  // max_whitespace_cnt 1
    const auto j = nlohmann::json::parse(out.substr(6, out.size() - 13));
    EXPECT_EQ(j["name"], "f");
    EXPECT_TRUE(j["arguments"]["x"].is_number_integer()) << out;
  }
}

}  // namespace
}  // namespace sala::grammar
