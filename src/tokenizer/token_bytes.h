// The bytes each token id adds to the output, as a grammar engine needs them
// (src/grammar VocabInfo::token_bytes).
#pragma once
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sala {

// Per id < tok.vocab_size(): a byte-fallback token <0xXX> gives its one byte; a special token
// gives "" (no grammar may produce it: it would vanish from the text); any other token gives
// what decoding it after a plain context token appends (so SentencePiece's "▁" is the space it
// stands for, also where decode() alone would strip it at the start). sala::Error for a
// tokenizer where a token's bytes cannot be told this way.
std::vector<std::string> grammar_token_bytes(const Tokenizer& tok);

}  // namespace sala
