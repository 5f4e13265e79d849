#include "tokenizer/token_bytes.h"

#include <cstdlib>

#include "core/error.h"

namespace sala {

std::vector<std::string> grammar_token_bytes(const Tokenizer& tok) {
  const int32_t n = tok.vocab_size();
  const int32_t ctx = tok.context_token_id();
  const std::string ctx_text = tok.decode({ctx});
  std::vector<std::string> out(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    if (tok.is_special(id)) continue;
    if (tok.is_byte_token(id)) {
      // "<0xAB>": decoding it alone would give U+FFFD for a byte that is part of a character.
      const std::string piece = tok.id_to_token(id);
      if (piece.size() != 6) fail("byte token {} is '{}', not <0xXX>", id, piece);
      out[size_t(id)] = std::string(1, char(std::strtol(piece.substr(3, 2).c_str(), nullptr, 16)));
      continue;
    }
    const std::string both = tok.decode({ctx, id});
    if (both.compare(0, ctx_text.size(), ctx_text) != 0)
      fail("decoding token {} after the context token changes the context's text", id);
    out[size_t(id)] = both.substr(ctx_text.size());
  }
  return out;
}

}  // namespace sala
