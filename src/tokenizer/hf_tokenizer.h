// The tokenizer.json tokenizer (HfTokenizer) and its helpers; internal to src/tokenizer.
#pragma once
#include "tokenizer/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/check.h"
#include "core/error.h"
#include "tokenizer/utf8.h"

namespace sala::tokenizer_detail {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline constexpr uint32_t kMetaspace = 0x2581;  // ▁

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StrMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

inline std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot read {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline json read_json(const fs::path& p) {
  try {
    return json::parse(read_file(p));
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", p.string(), e.what());
  }
}

// tokenizer_config.json token entries are either "tok" or {"content": "tok", ...}.
inline std::string token_string(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

inline std::string cp_str(uint32_t cp) {
  std::string s;
  utf8::append_cp(s, cp);
  return s;
}

inline void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  bool any = false;
  while (true) {
    size_t k = s.find(from, pos);
    if (k == std::string::npos) break;
    if (!any) out.reserve(s.size());
    any = true;
    out.append(s, pos, k - pos);
    out.append(to);
    pos = k + from.size();
  }
  if (!any) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

// Unicode "numeric" (Rust char::is_numeric) for the Digits pre-tokenizer: ASCII and the
// common decimal-digit blocks, superscripts, vulgar fractions, circled/roman numerals.
inline bool is_numeric(uint32_t c) {
  if (c >= '0' && c <= '9') return true;
  if (c < 0xB2) return false;
  return c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0xBC && c <= 0xBE) || (c >= 0x660 && c <= 0x669) ||
         (c >= 0x6F0 && c <= 0x6F9) || (c >= 0x966 && c <= 0x96F) || (c >= 0x2070 && c <= 0x2079 && c != 0x2071 && c != 0x2072 && c != 0x2073) ||
         (c >= 0x2080 && c <= 0x2089) || (c >= 0x2150 && c <= 0x2189) || (c >= 0x2460 && c <= 0x249B) ||
         (c >= 0x24EA && c <= 0x24FF) || (c >= 0x2776 && c <= 0x2793) || c == 0x3007 ||
         (c >= 0x3021 && c <= 0x3029) || (c >= 0x3038 && c <= 0x303A) || (c >= 0x3192 && c <= 0x3195) ||
         (c >= 0x3220 && c <= 0x3229) || (c >= 0x3248 && c <= 0x324F) || (c >= 0x3251 && c <= 0x325F) ||
         (c >= 0x3280 && c <= 0x3289) || (c >= 0x32B1 && c <= 0x32BF) || (c >= 0xFF10 && c <= 0xFF19);
}

inline constexpr const char* kHexDigits = "0123456789ABCDEF";

// Parses "<0xXX>" (what tokenizers' ByteFallback accepts: 6 chars, hex digits).
inline int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int h = hex(t[3]), l = hex(t[4]);
  if (h < 0 || l < 0) return -1;
  return h * 16 + l;
}

// Python's transformers clean_up_tokenization.
inline std::string clean_up_tokenization(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto& [a, b] : kRules) replace_all(s, a, b);
  return s;
}

// ------------------------------------------------------------------------------------------
// tokenizer.json

struct AddedTok {
  int32_t id;
  std::string content;
  bool special, lstrip, rstrip, single_word, normalized;
};

struct NormOp {
  enum Kind { kPrepend, kReplace } kind = kPrepend;
  std::string a, b;
};

enum class Prepend { kAlways, kFirst, kNever };

struct PreOp {
  enum Kind { kMetaspace, kDigits } kind = kMetaspace;
  std::string replacement;
  Prepend scheme = Prepend::kAlways;
  bool split = true;
  bool individual = false;
};

struct DecOp {
  enum Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind = kReplace;
  std::string a, b;
  uint32_t content = ' ';
  int start = 0, stop = 0;
  std::string replacement;
  Prepend scheme = Prepend::kAlways;
};

struct Piece {  // a pre-tokenized piece and whether it starts at offset 0 of the input
  std::string text;
  bool at_origin;
  int32_t added_id = -1;  // >= 0: a matched added token, not text
};

inline Prepend parse_scheme(const json& j) {
  if (j.contains("prepend_scheme")) {
    auto s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return Prepend::kAlways;
    if (s == "first") return Prepend::kFirst;
    if (s == "never") return Prepend::kNever;
    fail("unsupported Metaspace prepend_scheme '{}'", s);
  }
  if (j.contains("add_prefix_space")) return j["add_prefix_space"].get<bool>() ? Prepend::kAlways : Prepend::kNever;
  return Prepend::kAlways;
}

inline std::string string_pattern(const json& j, const char* what) {
  const json& p = j.at("pattern");
  if (p.contains("String")) return p["String"].get<std::string>();
  fail("unsupported {} pattern {} (only String patterns are supported)", what, p.dump());
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const fs::path& dir);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_tok_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  std::vector<int32_t> eos_ids() const override { return eos_ids_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    if (auto it = added_by_content_.find(token); it != added_by_content_.end()) return it->second;
    if (auto it = vocab_.find(token); it != vocab_.end()) return it->second;
    return std::nullopt;
  }
  std::string id_to_token(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return "";
    return id_to_tok_[id];
  }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < vocab_size() && special_[id];
  }
  bool is_byte_token(int32_t id) const override {
    return id >= 0 && id < vocab_size() && !added_[id] && has_byte_fallback_decoder_ &&
           parse_byte_token(id_to_tok_[id]) >= 0;
  }
  int32_t context_token_id() const override { return ctx_id_; }
  bool cleans_up_tokenization_spaces() const override { return cleanup_; }
  std::string bos_token() const override { return bos_token_; }
  std::string eos_token() const override { return eos_token_; }

 private:
  struct Scratch;
  void parse(const json& j, const std::string& file);
  void encode_segment(std::string_view seg, bool at_origin, std::vector<int32_t>& out, Scratch& sc) const;
  void bpe_word(std::string_view word, std::vector<int32_t>& out, Scratch& sc) const;
  void bpe_merge(std::string_view word, std::vector<int32_t>& out, Scratch& sc) const;
  std::vector<std::string> run_decoders(std::vector<std::string> tokens) const;

  StrMap vocab_;                                  // model vocabulary
  std::unordered_map<uint32_t, int32_t> cp_id_;   // single-codepoint tokens of the model
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a,b) -> (rank, new id)
  std::vector<std::string> id_to_tok_;
  std::vector<char> special_, added_;
  std::vector<AddedTok> added_tokens_;
  StrMap added_by_content_;
  std::vector<const AddedTok*> raw_added_, norm_added_;  // normalized=false / true
  int32_t byte_ids_[256];
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  std::vector<NormOp> norm_;
  std::vector<PreOp> pre_;
  std::vector<DecOp> dec_;
  bool has_decoder_ = false, has_byte_fallback_decoder_ = false;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // post-processor (single sequence)
  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;
  std::string bos_token_, eos_token_;
  int32_t ctx_id_ = -1;
  bool cleanup_ = false;
  // BPE segmentation: a word may be cut before a ▁ whose left neighbour cannot take part
  // in any merge with a ▁-initial right side (see bpe_word).
  bool split_at_metaspace_ = false;
  std::unordered_set<uint32_t> joins_metaspace_;
};

}  // namespace sala::tokenizer_detail
