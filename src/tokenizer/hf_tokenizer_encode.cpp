// HfTokenizer: normalize, pre-tokenize, BPE with byte fallback, decode.
#include "tokenizer/hf_tokenizer.h"

namespace sala::tokenizer_detail {

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


}  // namespace sala::tokenizer_detail
