// Streaming detokenizer and stop-string matcher.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sala {

// Feed generated ids one at a time; get back only new, complete UTF-8 text. The
// concatenation of everything push() and flush() return equals
// tok.decode(all ids, skip_special_tokens) (HF semantics: leading-space stripping of the
// first token, byte-fallback runs — a run of <0xXX> tokens is decoded as a whole and
// becomes one U+FFFD per byte if invalid, so text of a run is held until the run ends).
//
// Cost per push is O(1) amortised: only the tokens since the last emitted point are
// decoded, behind one fixed "context" token that absorbs the start-of-text rules.
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens = true);
  std::string push(int32_t id);
  std::string flush();  // end of generation: whatever is still held

 private:
  std::string decode_window() const;

  const Tokenizer& tok_;
  bool skip_special_;
  bool at_start_ = true;      // no text emitted yet: decode the window without context
  std::vector<int32_t> win_;  // ids not yet folded into emitted text (context excluded)
  size_t emitted_ = 0;        // bytes of decode_window() already returned
  std::string ctx_text_;      // decode([ctx])
};

// Stop strings with OpenAI/SGLang semantics: output is cut before the first match (the
// stop string itself is not returned); text that may be the start of a stop string is
// held back until disambiguated.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);
  struct Result {
    std::string emit;
    bool stopped = false;
    std::string matched;
  };
  Result push(std::string_view new_text);  // new decoded text in, safe text out
  std::string flush();                     // end without a match: release held text
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace sala
