// Tokenizer identical to Hugging Face `AutoTokenizer` for Llama/MiniCPM-style tokenizers.
//
// Loads `tokenizer.json` (what HF's fast tokenizer reads) and implements the pieces
// Llama-style tokenizers use: BPE with merges, byte fallback, fuse_unk, added tokens split
// out before normalisation (leftmost-longest, lstrip/rstrip/single_word/normalized flags),
// normalizers Sequence/Prepend/Replace, pre-tokenizers Sequence/Metaspace/Digits, decoders
// Sequence/Replace/ByteFallback/Fuse/Strip/Metaspace, post-processor TemplateProcessing
// (overridden by tokenizer_config.json add_bos_token/add_eos_token when present). Anything
// else in tokenizer.json is refused at load with a sala::Error naming the component.
// Without tokenizer.json, `tokenizer.model` is loaded through libsentencepiece.
//
// Invalid UTF-8 input: encode() replaces each maximal invalid subsequence with U+FFFD,
// exactly as Python's bytes.decode("utf-8", errors="replace") does (the HTTP layer rejects
// invalid UTF-8 before it gets here, so this only concerns CLI / internal callers).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sala {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // tokenizer.json, else tokenizer.model via sentencepiece; tokenizer_config.json for
  // special tokens / add_bos_token. Throws sala::Error naming the file on failure.
  static std::unique_ptr<Tokenizer> load(const std::string& model_dir);

  // == HF AutoTokenizer(...).encode(text, add_special_tokens=...)
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const = 0;
  // == HF decode(ids, skip_special_tokens=...). Ids outside the vocabulary are skipped (HF
  // does the same in tokenizers' decode).
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const = 0;

  virtual int32_t vocab_size() const = 0;  // len(tokenizer), added tokens included
  virtual int32_t bos_id() const = 0;      // -1 if none
  // eos_token of tokenizer_config.json / special tokens (config.json eos ids are added by
  // the engine).
  virtual std::vector<int32_t> eos_ids() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;  // "" for an unknown id
  virtual bool is_special(int32_t id) const = 0;

  // Extras used by the streaming detokenizer and the chat template.
  virtual bool is_byte_token(int32_t id) const = 0;  // <0xXX> byte-fallback piece
  // A plain, non-byte, non-special token whose decoded text is non-empty and starts with a
  // non-space character; decoding [ctx] + ids gives decode(ctx) + "continuation of ids".
  virtual int32_t context_token_id() const = 0;
  virtual bool cleans_up_tokenization_spaces() const { return false; }
  virtual std::string bos_token() const = 0;  // "" if none
  virtual std::string eos_token() const = 0;  // "" if none
};

}  // namespace sala
