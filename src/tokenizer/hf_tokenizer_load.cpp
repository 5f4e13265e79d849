// HfTokenizer: reading tokenizer.json, tokenizer_config.json and the special tokens.
#include "tokenizer/hf_tokenizer.h"

namespace sala::tokenizer_detail {

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


}  // namespace sala::tokenizer_detail
