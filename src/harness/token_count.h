// The one place where the harness counts tokens: `len(tokenizer.encode(text))` as HF
// transformers does it for the served model (BOS included), which is how
// sglang.bench_serving derives prompt_len and max_new_tokens from the speed data.
// Backed by the engine's tokenizer (sala_tokenizer); tests may supply their own counter.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace sala::harness {

class TokenCounter {
 public:
  virtual ~TokenCounter() = default;
  // Loads the tokenizer of a model directory (tokenizer.json / tokenizer.model); throws
  // sala::Error.
  static std::unique_ptr<TokenCounter> load(const std::string& model_dir);
  // Token count of `text` with special tokens added (BOS), as HF tokenizer.encode(text).
  virtual int64_t count(std::string_view text) const = 0;
};

}  // namespace sala::harness
