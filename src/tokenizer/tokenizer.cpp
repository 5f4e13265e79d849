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

namespace sala {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uint32_t kMetaspace = 0x2581;  // ▁

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StrMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot read {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json read_json(const fs::path& p) {
  try {
    return json::parse(read_file(p));
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", p.string(), e.what());
  }
}

// tokenizer_config.json token entries are either "tok" or {"content": "tok", ...}.
std::string token_string(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

std::string cp_str(uint32_t cp) {
  std::string s;
  utf8::append_cp(s, cp);
  return s;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
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
bool is_numeric(uint32_t c) {
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

const char* kHexDigits = "0123456789ABCDEF";

// Parses "<0xXX>" (what tokenizers' ByteFallback accepts: 6 chars, hex digits).
int parse_byte_token(std::string_view t) {
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
std::string clean_up_tokenization(std::string s) {
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

Prepend parse_scheme(const json& j) {
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

std::string string_pattern(const json& j, const char* what) {
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

HfTokenizer::HfTokenizer(const fs::path& dir) {
  fs::path tj = dir / "tokenizer.json";
  json j = read_json(tj);
  try {
    parse(j, tj.string());
  } catch (const json::exception& e) {
    fail("{}: unexpected content: {}", tj.string(), e.what());
  }

  // tokenizer_config.json: special tokens, add_bos_token / add_eos_token, cleanup flag.
  json cfg = json::object();
  if (fs::exists(dir / "tokenizer_config.json")) cfg = read_json(dir / "tokenizer_config.json");
  auto ensure_special = [&](const std::string& content) -> int32_t {
    if (content.empty()) return -1;
    if (auto it = added_by_content_.find(content); it != added_by_content_.end()) {
      special_[it->second] = 1;
      return it->second;
    }
    // HF registers special tokens named in the config as added tokens: an existing vocab
    // entry keeps its id, a new string gets the next id.
    int32_t id;
    if (auto it = vocab_.find(content); it != vocab_.end()) id = it->second;
    else {
      id = static_cast<int32_t>(id_to_tok_.size());
      id_to_tok_.push_back(content);
      special_.push_back(0);
      added_.push_back(0);
    }
    added_tokens_.push_back({id, content, true, false, false, false, false});
    added_by_content_[content] = id;
    special_[id] = 1;
    added_[id] = 1;
    id_to_tok_[id] = content;
    return id;
  };
  try {
    bos_token_ = cfg.contains("bos_token") ? token_string(cfg["bos_token"]) : "";
    eos_token_ = cfg.contains("eos_token") ? token_string(cfg["eos_token"]) : "";
    std::string unk = cfg.contains("unk_token") ? token_string(cfg["unk_token"]) : "";
    bos_id_ = ensure_special(bos_token_);
    int32_t eos = ensure_special(eos_token_);
    if (eos >= 0) eos_ids_.push_back(eos);
    ensure_special(unk);
    for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
      if (cfg.contains(key) && cfg[key].is_array())
        for (auto& t : cfg[key]) ensure_special(token_string(t));
    }
    if (cfg.contains("clean_up_tokenization_spaces") && cfg["clean_up_tokenization_spaces"].is_boolean())
      cleanup_ = cfg["clean_up_tokenization_spaces"].get<bool>();
    bool has_bos_key = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean();
    bool has_eos_key = cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean();
    if (has_bos_key || has_eos_key) {
      // transformers' Llama tokenizers rebuild the post-processor from these flags.
      bool add_bos = has_bos_key ? cfg["add_bos_token"].get<bool>()
                                 : std::find(prefix_ids_.begin(), prefix_ids_.end(), bos_id_) != prefix_ids_.end();
      bool add_eos = has_eos_key && cfg["add_eos_token"].get<bool>();
      prefix_ids_.clear();
      suffix_ids_.clear();
      if (add_bos && bos_id_ >= 0) prefix_ids_.push_back(bos_id_);
      if (add_eos && eos >= 0) suffix_ids_.push_back(eos);
    }
    // transformers >= 5 ignores tokenizer.json's normalizer / pre-tokenizer / decoder for
    // the Llama tokenizer class and builds its own (Metaspace, split=False, prepend scheme
    // "always" if legacy else "first"); transformers 4.x, tokenizers and SGLang use
    // tokenizer.json as is. Default: tokenizer.json as is; SALA_TOKENIZER_COMPAT=transformers5
    // reproduces the transformers 5 behaviour.
    const char* compat = std::getenv("SALA_TOKENIZER_COMPAT");
    std::string cls = cfg.value("tokenizer_class", "");
    if (compat && std::string(compat) == "transformers5" && (cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast")) {
      bool legacy = cfg.contains("legacy") && cfg["legacy"].is_boolean() ? cfg["legacy"].get<bool>() : false;
      bool prefix = cfg.contains("add_prefix_space") && cfg["add_prefix_space"].is_boolean()
                        ? cfg["add_prefix_space"].get<bool>() : true;
      norm_.clear();
      pre_.clear();
      PreOp ms;
      ms.kind = PreOp::kMetaspace;
      ms.replacement = cp_str(kMetaspace);
      ms.scheme = !prefix ? Prepend::kNever : legacy ? Prepend::kAlways : Prepend::kFirst;
      ms.split = false;
      pre_.push_back(ms);
      dec_.clear();
      DecOp d;
      d.kind = DecOp::kReplace;
      d.a = cp_str(kMetaspace);
      d.b = " ";
      dec_.push_back(d);
      d = DecOp();
      d.kind = DecOp::kByteFallback;
      dec_.push_back(d);
      has_byte_fallback_decoder_ = true;
      d.kind = DecOp::kFuse;
      dec_.push_back(d);
      if (prefix) {
        d.kind = DecOp::kStrip;
        d.content = ' ';
        d.start = 1;
        d.stop = 0;
        dec_.push_back(d);
      }
    }
  } catch (const json::exception& e) {
    fail("{}: unexpected content: {}", (dir / "tokenizer_config.json").string(), e.what());
  }
  if (bos_id_ < 0 && !bos_token_.empty()) bos_id_ = token_to_id(bos_token_).value_or(-1);

  raw_added_.clear();
  norm_added_.clear();
  for (auto& t : added_tokens_) (t.normalized && !t.special ? norm_added_ : raw_added_).push_back(&t);

  // Context token for streaming: a plain single-letter piece.
  for (const char* c : {"a", "e", "x", "A", "0", "."}) {
    if (auto it = vocab_.find(std::string_view(c)); it != vocab_.end() && !added_[it->second]) {
      if (decode({it->second}, false) == c) {
        ctx_id_ = it->second;
        break;
      }
    }
  }
  if (ctx_id_ < 0) {
    for (int32_t id = 0; id < vocab_size() && ctx_id_ < 0; ++id) {
      if (added_[id] || is_byte_token(id)) continue;
      std::string d = decode({id}, false);
      if (!d.empty() && d[0] != ' ' && d.find("\xEF\xBF\xBD") == std::string::npos) ctx_id_ = id;
    }
  }
  if (ctx_id_ < 0) fail("{}: no plain token in the vocabulary", tj.string());
}

void HfTokenizer::parse(const json& j, const std::string& file) {
  const json& m = j.at("model");
  std::string type = m.value("type", "BPE");
  if (type != "BPE") fail("{}: model type '{}' is not supported (only BPE)", file, type);
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    fail("{}: BPE dropout is not supported", file);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && !m[k].get<std::string>().empty())
      fail("{}: BPE {} is not supported", file, k);
  byte_fallback_ = m.value("byte_fallback", false);
  fuse_unk_ = m.value("fuse_unk", false);
  ignore_merges_ = m.value("ignore_merges", false);

  int32_t max_id = -1;
  for (auto& [tok, idj] : m.at("vocab").items()) {
    int32_t id = idj.get<int32_t>();
    vocab_[tok] = id;
    max_id = std::max(max_id, id);
  }
  for (auto& t : j.at("added_tokens")) max_id = std::max(max_id, t.at("id").get<int32_t>());
  id_to_tok_.assign(max_id + 1, "");
  special_.assign(max_id + 1, 0);
  added_.assign(max_id + 1, 0);
  for (auto& [tok, id] : vocab_) {
    id_to_tok_[id] = tok;
    size_t i = 0;
    if (!tok.empty() && utf8::valid_len(tok, 0) == tok.size()) cp_id_[utf8::next_cp(tok, i)] = id;
  }
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    auto it = vocab_.find(m["unk_token"].get<std::string>());
    if (it != vocab_.end()) unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[7] = {'<', '0', 'x', kHexDigits[b >> 4], kHexDigits[b & 15], '>', 0};
    auto it = vocab_.find(std::string_view(name, 6));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  int32_t rank = 0;
  bool byte_left_join = false;
  for (auto& mj : m.at("merges")) {
    std::string a, b;
    if (mj.is_array()) {
      a = mj.at(0).get<std::string>();
      b = mj.at(1).get<std::string>();
    } else {
      auto s = mj.get<std::string>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos) fail("{}: bad merge '{}'", file, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
      fail("{}: merge '{} {}' uses a token missing from the vocabulary", file, a, b);
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second);
    merges_.try_emplace(key, rank, iab->second);  // the first occurrence wins, as in tokenizers
    ++rank;
    size_t bi = 0;
    if (!b.empty() && utf8::valid_len(b, 0) && utf8::next_cp(b, bi) == kMetaspace) {
      if (parse_byte_token(a) >= 0 || ia->second == unk_id_) byte_left_join = true;
      // last codepoint of a
      size_t k = a.size();
      while (k > 0 && (static_cast<uint8_t>(a[k - 1]) & 0xC0) == 0x80) --k;
      if (k > 0) {
        size_t kk = k - 1;
        if (utf8::valid_len(a, kk)) joins_metaspace_.insert(utf8::next_cp(a, kk));
      }
    }
  }
  split_at_metaspace_ = !byte_left_join && vocab_.count(cp_str(kMetaspace));

  for (auto& t : j.at("added_tokens")) {
    AddedTok a{t.at("id").get<int32_t>(), t.at("content").get<std::string>(), t.value("special", false),
               t.value("lstrip", false), t.value("rstrip", false), t.value("single_word", false),
               t.value("normalized", false)};
    if (a.content.empty()) continue;
    id_to_tok_[a.id] = a.content;
    added_[a.id] = 1;
    special_[a.id] = a.special;
    added_by_content_[a.content] = a.id;
    added_tokens_.push_back(a);
  }

  // normalizer
  std::function<void(const json&)> add_norm = [&](const json& n) {
    if (n.is_null()) return;
    std::string t = n.at("type").get<std::string>();
    if (t == "Sequence") {
      for (auto& x : n.at("normalizers")) add_norm(x);
    } else if (t == "Prepend") {
      norm_.push_back({NormOp::kPrepend, n.at("prepend").get<std::string>(), ""});
    } else if (t == "Replace") {
      norm_.push_back({NormOp::kReplace, string_pattern(n, "Replace normalizer"), n.at("content").get<std::string>()});
    } else {
      fail("{}: normalizer '{}' is not supported", file, t);
    }
  };
  if (j.contains("normalizer")) add_norm(j["normalizer"]);

  std::function<void(const json&)> add_pre = [&](const json& p) {
    if (p.is_null()) return;
    std::string t = p.at("type").get<std::string>();
    if (t == "Sequence") {
      for (auto& x : p.at("pretokenizers")) add_pre(x);
    } else if (t == "Metaspace") {
      PreOp op;
      op.kind = PreOp::kMetaspace;
      op.replacement = p.at("replacement").get<std::string>();
      op.scheme = parse_scheme(p);
      op.split = p.value("split", true);
      pre_.push_back(op);
    } else if (t == "Digits") {
      PreOp op;
      op.kind = PreOp::kDigits;
      op.individual = p.value("individual_digits", false);
      pre_.push_back(op);
    } else {
      fail("{}: pre-tokenizer '{}' is not supported", file, t);
    }
  };
  if (j.contains("pre_tokenizer")) add_pre(j["pre_tokenizer"]);

  std::function<void(const json&)> add_dec = [&](const json& d) {
    if (d.is_null()) return;
    has_decoder_ = true;
    std::string t = d.at("type").get<std::string>();
    if (t == "Sequence") {
      for (auto& x : d.at("decoders")) add_dec(x);
    } else if (t == "Replace") {
      DecOp op;
      op.kind = DecOp::kReplace;
      op.a = string_pattern(d, "Replace decoder");
      op.b = d.at("content").get<std::string>();
      dec_.push_back(op);
    } else if (t == "ByteFallback") {
      {
        DecOp op;
        op.kind = DecOp::kByteFallback;
        dec_.push_back(op);
      }
      has_byte_fallback_decoder_ = true;
    } else if (t == "Fuse") {
      {
        DecOp op;
        op.kind = DecOp::kFuse;
        dec_.push_back(op);
      }
    } else if (t == "Strip") {
      DecOp op;
      op.kind = DecOp::kStrip;
      std::string c = d.at("content").get<std::string>();
      size_t i = 0;
      if (c.empty() || utf8::valid_len(c, 0) != c.size()) fail("{}: bad Strip decoder content", file);
      op.content = utf8::next_cp(c, i);
      op.start = d.value("start", 0);
      op.stop = d.value("stop", 0);
      dec_.push_back(op);
    } else if (t == "Metaspace") {
      DecOp op;
      op.kind = DecOp::kMetaspace;
      op.replacement = d.at("replacement").get<std::string>();
      op.scheme = parse_scheme(d);
      dec_.push_back(op);
    } else {
      fail("{}: decoder '{}' is not supported", file, t);
    }
  };
  if (j.contains("decoder")) add_dec(j["decoder"]);
  // Without a decoder tokenizers joins tokens with spaces; nothing Llama-like does that.
  if (!has_decoder_) fail("{}: a tokenizer without decoder is not supported", file);

  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    const json& pp = j["post_processor"];
    std::string t = pp.at("type").get<std::string>();
    if (t != "TemplateProcessing") fail("{}: post-processor '{}' is not supported", file, t);
    bool seen_a = false;
    for (auto& item : pp.at("single")) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const json& st = pp.at("special_tokens").at(name);
      for (auto& id : st.at("ids")) (seen_a ? suffix_ids_ : prefix_ids_).push_back(id.get<int32_t>());
    }
  }
}

struct HfTokenizer::Scratch {
  struct Sym {
    int32_t id;
    int32_t prev, next;
    uint32_t len;
  };
  struct Merge {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Merge& o) const {  // max-heap on "lower rank, then lower pos"
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Sym> syms;
  std::vector<Merge> heap;
  std::unordered_map<std::string, std::vector<int32_t>, SvHash, std::equal_to<>> cache;
};

std::vector<int32_t> HfTokenizer::encode(std::string_view text_in, bool add_special_tokens) const {
  std::string sanitized;
  std::string_view text = text_in;
  if (!utf8::is_valid(text)) {
    sanitized = utf8::sanitize(text);
    text = sanitized;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special_tokens) out.insert(out.end(), prefix_ids_.begin(), prefix_ids_.end());
  Scratch sc;

  // Added tokens (normalized=false) on the raw text, leftmost-longest.
  size_t start_offset = 0;
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n && !raw_added_.empty()) {
    const AddedTok* best = nullptr;
    for (const AddedTok* t : raw_added_) {
      if (t->content[0] == text[pos] && text.compare(pos, t->content.size(), t->content) == 0 &&
          (!best || t->content.size() > best->content.size()))
        best = t;
    }
    if (!best) {
      ++pos;
      continue;
    }
    size_t mstart = pos, mstop = pos + best->content.size();
    if (best->single_word) {
      auto word_char = [&](size_t at, bool before) {
        // alphanumeric or '_' (tokenizers' is_word_character)
        size_t k = at;
        if (before) {
          while (k > 0 && (static_cast<uint8_t>(text[k - 1]) & 0xC0) == 0x80) --k;
          --k;
        }
        size_t kk = k;
        uint32_t c = utf8::next_cp(text, kk);
        return c == '_' || (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : !utf8::is_whitespace(c));
      };
      bool ok_start = mstart == 0 || !word_char(mstart, true);
      bool ok_stop = mstop == n || !word_char(mstop, false);
      if (!ok_start || !ok_stop) {
        pos = mstop;  // aho-corasick resumes after the rejected match
        continue;
      }
    }
    size_t match_end = mstop;
    if (best->lstrip) {
      size_t k = mstart;
      while (k > start_offset) {
        size_t b = k - 1;
        while (b > 0 && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
        size_t bb = b;
        if (!utf8::is_whitespace(utf8::next_cp(text, bb))) break;
        k = b;
      }
      mstart = std::max(k, start_offset);
    }
    if (best->rstrip) {
      size_t k = mstop;
      while (k < n) {
        size_t kk = k;
        if (!utf8::is_whitespace(utf8::next_cp(text, kk))) break;
        k = kk;
      }
      mstop = k;
    }
    if (mstart > start_offset)
      encode_segment(text.substr(start_offset, mstart - start_offset), start_offset == 0, out, sc);
    out.push_back(best->id);
    start_offset = mstop;
    pos = std::max(match_end, mstop);
  }
  if (start_offset < n) encode_segment(text.substr(start_offset), start_offset == 0, out, sc);
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

void HfTokenizer::encode_segment(std::string_view seg, bool at_origin, std::vector<int32_t>& out,
                                 Scratch& sc) const {
  if (seg.empty()) return;
  std::string s(seg);
  for (auto& op : norm_) {
    if (op.kind == NormOp::kPrepend) {
      if (!s.empty()) s.insert(0, op.a);
    } else {
      replace_all(s, op.a, op.b);
    }
  }
  // Added tokens with normalized=true match the normalized text.
  std::vector<Piece> pieces;
  if (norm_added_.empty()) {
    pieces.push_back({std::move(s), at_origin});
  } else {
    size_t last = 0, pos = 0;
    while (pos < s.size()) {
      const AddedTok* best = nullptr;
      for (const AddedTok* t : norm_added_)
        if (s.compare(pos, t->content.size(), t->content) == 0 && (!best || t->content.size() > best->content.size()))
          best = t;
      if (!best) {
        ++pos;
        continue;
      }
      if (pos > last) pieces.push_back({s.substr(last, pos - last), at_origin && last == 0});
      pieces.push_back({"", false, best->id});
      pos += best->content.size();
      last = pos;
    }
    if (last < s.size()) pieces.push_back({s.substr(last), at_origin && last == 0});
  }

  for (auto& piece : pieces) {
    if (piece.added_id >= 0) {
      out.push_back(piece.added_id);
      continue;
    }
    std::vector<Piece> words{std::move(piece)};
    for (auto& op : pre_) {
      std::vector<Piece> next;
      for (auto& w : words) {
        if (op.kind == PreOp::kMetaspace) {
          std::string t = std::move(w.text);
          replace_all(t, " ", op.replacement);
          bool starts = t.compare(0, op.replacement.size(), op.replacement) == 0;
          if (!starts && (op.scheme == Prepend::kAlways || (op.scheme == Prepend::kFirst && w.at_origin)))
            t.insert(0, op.replacement);
          if (!op.split) {
            next.push_back({std::move(t), w.at_origin});
            continue;
          }
          size_t b = 0;
          for (size_t k = t.find(op.replacement, 1); k != std::string::npos; k = t.find(op.replacement, k + 1)) {
            if (k > b) next.push_back({t.substr(b, k - b), w.at_origin && b == 0});
            b = k;
          }
          if (b < t.size()) next.push_back({t.substr(b), w.at_origin && b == 0});
        } else {  // Digits, Isolated
          const std::string& t = w.text;
          size_t b = 0, i = 0;
          while (i < t.size()) {
            size_t k = i;
            uint32_t c = utf8::next_cp(t, k);
            if (is_numeric(c)) {
              if (i > b) next.push_back({t.substr(b, i - b), w.at_origin && b == 0});
              size_t e = k;
              if (!op.individual) {
                while (e < t.size()) {
                  size_t kk = e;
                  if (!is_numeric(utf8::next_cp(t, kk))) break;
                  e = kk;
                }
              }
              next.push_back({t.substr(i, e - i), w.at_origin && i == 0});
              b = i = e;
            } else {
              i = k;
            }
          }
          if (b < t.size()) next.push_back({t.substr(b), w.at_origin && b == 0});
        }
      }
      words = std::move(next);
    }
    for (auto& w : words) bpe_word(w.text, out, sc);
  }
}

void HfTokenizer::bpe_word(std::string_view word, std::vector<int32_t>& out, Scratch& sc) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Cut the word before each ▁ whose left neighbour never merges with a ▁-initial token:
  // no merge can span such a cut, so BPE on the parts gives the same result (and the parts
  // are short and repetitive, so they cache well).
  auto run = [&](std::string_view part) {
    if (part.size() <= 48) {
      if (auto it = sc.cache.find(part); it != sc.cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
      size_t before = out.size();
      bpe_merge(part, out, sc);
      if (sc.cache.size() < 200000) sc.cache.emplace(std::string(part), std::vector<int32_t>(out.begin() + before, out.end()));
      return;
    }
    bpe_merge(part, out, sc);
  };
  if (!split_at_metaspace_) {
    run(word);
    return;
  }
  size_t b = 0, i = 0;
  uint32_t prev = 0;
  while (i < word.size()) {
    size_t at = i;
    uint32_t c = utf8::next_cp(word, i);
    if (c == kMetaspace && at > b && !joins_metaspace_.count(prev)) {
      run(word.substr(b, at - b));
      b = at;
    }
    prev = c;
  }
  run(word.substr(b));
}

void HfTokenizer::bpe_merge(std::string_view w, std::vector<int32_t>& out, Scratch& sc) const {
  auto& syms = sc.syms;
  syms.clear();
  auto add = [&](int32_t id, uint32_t len) {
    int32_t k = static_cast<int32_t>(syms.size());
    syms.push_back({id, k - 1, -1, len});
    if (k > 0) syms[k - 1].next = k;
  };
  int32_t unk_pending = -1;
  uint32_t unk_len = 0;
  size_t i = 0;
  while (i < w.size()) {
    size_t at = i;
    uint32_t c = utf8::next_cp(w, i);
    uint32_t blen = static_cast<uint32_t>(i - at);
    auto it = cp_id_.find(c);
    if (it != cp_id_.end()) {
      if (unk_pending >= 0) {
        add(unk_pending, unk_len);
        unk_pending = -1;
      }
      add(it->second, blen);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (size_t k = at; k < i; ++k) all = all && byte_ids_[static_cast<uint8_t>(w[k])] >= 0;
      if (all) {
        for (size_t k = at; k < i; ++k) add(byte_ids_[static_cast<uint8_t>(w[k])], 1);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (unk_pending >= 0 && fuse_unk_) {
        unk_len += blen;
      } else {
        if (unk_pending >= 0) add(unk_pending, unk_len);
        unk_pending = unk_id_;
        unk_len = blen;
      }
    }
  }
  if (unk_pending >= 0) add(unk_pending, unk_len);

  auto& heap = sc.heap;
  heap.clear();
  auto lookup = [&](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t k = 0; k + 1 < syms.size(); ++k)
    if (auto m = lookup(syms[k].id, syms[k + 1].id)) heap.push_back({m->first, static_cast<int32_t>(k), m->second});
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    Scratch::Merge top = heap.back();
    heap.pop_back();
    auto& cur = syms[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    int32_t next_pos = cur.next;
    Scratch::Sym right = syms[next_pos];
    auto m = lookup(cur.id, right.id);
    if (!m || m->second != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    syms[next_pos].len = 0;
    if (right.next >= 0) syms[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (auto pm = lookup(syms[cur.prev].id, cur.id)) {
        heap.push_back({pm->first, cur.prev, pm->second});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (cur.next >= 0) {
      if (auto nm = lookup(cur.id, syms[cur.next].id)) {
        heap.push_back({nm->first, top.pos, nm->second});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (auto& s : syms)
    if (s.len != 0) out.push_back(s.id);
}

std::vector<std::string> HfTokenizer::run_decoders(std::vector<std::string> tokens) const {
  for (auto& op : dec_) {
    switch (op.kind) {
      case DecOp::kReplace:
        for (auto& t : tokens) replace_all(t, op.a, op.b);
        break;
      case DecOp::kByteFallback: {
        std::vector<std::string> res;
        res.reserve(tokens.size());
        std::string bytes;
        size_t nbytes = 0;
        auto flush = [&] {
          if (!nbytes) return;
          if (utf8::is_valid(bytes)) res.push_back(bytes);
          else
            for (size_t k = 0; k < nbytes; ++k) res.emplace_back("\xEF\xBF\xBD");
          bytes.clear();
          nbytes = 0;
        };
        for (auto& t : tokens) {
          int b = parse_byte_token(t);
          if (b >= 0) {
            bytes += static_cast<char>(b);
            ++nbytes;
          } else {
            flush();
            res.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(res);
        break;
      }
      case DecOp::kFuse: {
        std::string all;
        for (auto& t : tokens) all += t;
        tokens.clear();
        tokens.push_back(std::move(all));
        break;
      }
      case DecOp::kStrip:
        for (auto& t : tokens) {
          // strip up to `start` leading and `stop` trailing `content` chars (per token)
          std::vector<std::pair<size_t, uint32_t>> cps;  // (byte offset, cp)
          size_t i = 0;
          while (i < t.size()) {
            size_t at = i;
            uint32_t c = utf8::valid_len(t, i) ? utf8::next_cp(t, i) : (i++, 0xFFFD);
            cps.push_back({at, c});
          }
          size_t sc = 0, ec = cps.size();
          for (int k = 0; k < op.start && sc < cps.size() && cps[sc].second == op.content; ++k) ++sc;
          for (int k = 0; k < op.stop && ec > sc && cps[ec - 1].second == op.content; ++k) --ec;
          size_t b0 = sc < cps.size() ? cps[sc].first : t.size();
          size_t b1 = ec < cps.size() ? cps[ec].first : t.size();
          t = t.substr(b0, b1 - b0);
        }
        break;
      case DecOp::kMetaspace:
        for (size_t k = 0; k < tokens.size(); ++k) {
          if (k == 0 && op.scheme != Prepend::kNever) replace_all(tokens[k], op.replacement, "");
          else replace_all(tokens[k], op.replacement, " ");
        }
        break;
    }
  }
  return tokens;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special_tokens && special_[id]) continue;
    if (!added_[id] && id_to_tok_[id].empty()) continue;
    toks.push_back(id_to_tok_[id]);
  }
  std::string out;
  for (auto& t : run_decoders(std::move(toks))) out += t;
  if (cleanup_) out = clean_up_tokenization(std::move(out));
  return out;
}

// ------------------------------------------------------------------------------------------
// tokenizer.model through libsentencepiece (no tokenizer.json).

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(const fs::path& dir) {
    fs::path mp = dir / "tokenizer.model";
    auto st = sp_.Load(mp.string());
    if (!st.ok()) fail("{}: cannot load sentencepiece model: {}", mp.string(), st.ToString());
    json cfg = json::object();
    if (fs::exists(dir / "tokenizer_config.json")) cfg = read_json(dir / "tokenizer_config.json");
    add_bos_ = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean() ? cfg["add_bos_token"].get<bool>() : true;
    add_eos_ = cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean() && cfg["add_eos_token"].get<bool>();
    bos_id_ = sp_.bos_id();
    if (sp_.eos_id() >= 0) eos_ids_.push_back(sp_.eos_id());
    if (bos_id_ >= 0) bos_token_ = sp_.IdToPiece(bos_id_);
    if (sp_.eos_id() >= 0) eos_token_ = sp_.IdToPiece(sp_.eos_id());
    for (const char* c : {"a", "e", "x", "A", "0", "."}) {
      int id = sp_.PieceToId(c);
      if (id != sp_.unk_id() && !sp_.IsControl(id) && !sp_.IsByte(id)) {
        ctx_id_ = id;
        break;
      }
    }
    if (ctx_id_ < 0) fail("{}: no plain single-character piece in the model", mp.string());
  }
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    std::string s = utf8::is_valid(text) ? std::string(text) : utf8::sanitize(text);
    std::vector<int> ids;
    sp_.Encode(s, &ids).IgnoreError();
    std::vector<int32_t> out;
    if (add_special_tokens && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
    out.insert(out.end(), ids.begin(), ids.end());
    if (add_special_tokens && add_eos_ && sp_.eos_id() >= 0) out.push_back(sp_.eos_id());
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      std::string s;
      sp_.Decode(run, &s).IgnoreError();
      out += s;
      run.clear();
    };
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) continue;
      if (is_special(id)) {
        if (skip_special_tokens) continue;
        flush();
        out += sp_.IdToPiece(id);
        continue;
      }
      run.push_back(id);
    }
    flush();
    return out;
  }
  int32_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return bos_id_; }
  std::vector<int32_t> eos_ids() const override { return eos_ids_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    int id = sp_.PieceToId(token);
    if (id == sp_.unk_id() && token != sp_.IdToPiece(id)) return std::nullopt;
    return id;
  }
  std::string id_to_token(int32_t id) const override {
    return id >= 0 && id < vocab_size() ? sp_.IdToPiece(id) : "";
  }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < vocab_size() && (sp_.IsControl(id) || sp_.IsUnknown(id));
  }
  bool is_byte_token(int32_t id) const override { return id >= 0 && id < vocab_size() && sp_.IsByte(id); }
  int32_t context_token_id() const override { return ctx_id_; }
  std::string bos_token() const override { return bos_token_; }
  std::string eos_token() const override { return eos_token_; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_ = true, add_eos_ = false;
  int32_t bos_id_ = -1, ctx_id_ = -1;
  std::vector<int32_t> eos_ids_;
  std::string bos_token_, eos_token_;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  fs::path dir(model_dir);
  if (!fs::is_directory(dir)) fail("tokenizer: model directory {} does not exist", model_dir);
  if (fs::exists(dir / "tokenizer.json")) return std::make_unique<HfTokenizer>(dir);
  if (fs::exists(dir / "tokenizer.model")) return std::make_unique<SpmTokenizer>(dir);
  fail("tokenizer: neither {} nor {} exists", (dir / "tokenizer.json").string(), (dir / "tokenizer.model").string());
}

}  // namespace sala
