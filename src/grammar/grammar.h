// Structured output: the engine's interface to xgrammar (its C++ core, built from the PyPI
// sdist by cmake/xgrammar.cmake). Nothing outside this part includes an xgrammar header.
//
//   HTTP thread:   GrammarCompiler::compile(spec)  → shared CompiledGrammar (cached by text)
//   engine thread: GrammarMatcher(compiled) per request: fill_next_mask → the step's logits
//                  mask (Backend::mask_logits), accept(token) after sampling
//
// Compiling a grammar can take milliseconds to seconds (a large JSON schema), so it never runs
// on the engine thread; matching costs one mask fill per generated token.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace sala::grammar {

// A user's grammar that cannot be compiled (invalid JSON schema, regex, EBNF, structural
// tag): the message says why, for a 400.
class GrammarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a request's output must match.
struct GrammarSpec {
  enum class Kind {
    JsonSchema,     // text: a JSON schema
    JsonObject,     // any JSON object (OpenAI's response_format json_object); text unused
    Regex,          // text: a regular expression the whole output matches
    Ebnf,           // text: xgrammar's EBNF (GBNF-like), root rule "root"
    StructuralTag,  // text: an xgrammar structural tag (tool calls)
  };
  Kind kind = Kind::JsonSchema;
  std::string text;
  bool operator==(const GrammarSpec&) const = default;
};

// The vocabulary as the grammar engine sees it: per token id the bytes it adds to the output
// ("" for special tokens, which no grammar produces), the logits row width (may exceed the
// tokenizer's vocabulary) and the stop tokens that end a complete output.
struct VocabInfo {
  std::vector<std::string> token_bytes;
  int32_t vocab_size = 0;
  std::vector<int32_t> stop_ids;
};

// Words of a token bitmask row: bit (id % 32) of word (id / 32) set means "allowed".
inline int32_t mask_words(int32_t vocab_size) { return (vocab_size + 31) / 32; }

struct CompiledGrammar;  // xgrammar's compiled grammar (grammar.cpp)

class GrammarCompiler {
 public:
  // max_cached: compiled grammars kept (least recently used dropped first).
  explicit GrammarCompiler(const VocabInfo& vocab, size_t max_cached = 128);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // Thread-safe. The same spec returns the same cached grammar. Throws GrammarError.
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec);
  int64_t compilations() const;  // cache misses so far (tests, /metrics)
  const VocabInfo& vocab() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One request's position in its grammar. Not thread-safe: built on the HTTP thread, then used
// only by the engine thread.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  int32_t vocab_size() const;
  // The tokens allowed next, into mask[mask_words(vocab_size())].
  void fill_next_mask(uint32_t* mask);
  // Advances by one sampled token; false (state unchanged) if the grammar does not allow it.
  bool accept(int32_t token);
  // Undoes the last n accepted tokens.
  void rollback(int n);
  // The output so far is a complete sentence of the grammar (a stop token may follow).
  bool is_completed() const;
  // A stop token was accepted: nothing more can follow (no further mask to fill).
  bool is_terminated() const;
  // A mask filled by fill_next_mask allows nothing but stop tokens: the output is complete
  // and cannot continue, so generation ends here.
  bool only_stop_allowed(const uint32_t* mask) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sala::grammar
