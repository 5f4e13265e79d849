#include "tokenizer/detokenizer.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace sala {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens) {
  ctx_text_ = tok_.decode({tok_.context_token_id()}, false);
}

std::string IncrementalDetokenizer::decode_window() const {
  if (at_start_) return tok_.decode(win_, skip_special_);
  std::vector<int32_t> ids;
  ids.reserve(win_.size() + 1);
  ids.push_back(tok_.context_token_id());
  ids.insert(ids.end(), win_.begin(), win_.end());
  std::string s = tok_.decode(ids, skip_special_);
  // decode([ctx] + w) == decode([ctx]) + continuation(w) for the supported decoders.
  if (s.compare(0, ctx_text_.size(), ctx_text_) == 0) return s.substr(ctx_text_.size());
  return s;
}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (id < 0 || id >= tok_.vocab_size()) return "";
  if (skip_special_ && tok_.is_special(id)) return "";  // skipped tokens do not exist for decode
  win_.push_back(id);
  // A byte-fallback run is decoded as a whole (invalid => one U+FFFD per byte), so its text
  // is final only once a non-byte token ends it.
  if (tok_.is_byte_token(id)) return "";
  std::string text = decode_window();
  std::string out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
  emitted_ = std::max(emitted_, text.size());
  // Leading-strip rules only touch the start of the text: once something is emitted the
  // window can restart behind the context token. With clean_up_tokenization_spaces the
  // output of a token depends on the next one, so keep the whole window then.
  if (!text.empty() && !tok_.cleans_up_tokenization_spaces()) {
    at_start_ = false;
    win_.clear();
    emitted_ = 0;
  }
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string text = decode_window();
  std::string out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
  if (!text.empty()) at_start_ = false;
  win_.clear();
  emitted_ = 0;
  return out;
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view new_text) {
  Result r;
  if (stopped_) {
    r.stopped = true;
    return r;
  }
  held_.append(new_text);
  // Earliest match over all stop strings (ties: the longest).
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (auto& s : stops_) {
    size_t k = held_.find(s);
    if (k != std::string::npos && (k < best || (k == best && s.size() > which->size()))) {
      best = k;
      which = &s;
    }
  }
  if (which) {
    r.emit = held_.substr(0, best);
    r.stopped = true;
    r.matched = *which;
    stopped_ = true;
    held_.clear();
    return r;
  }
  // Hold back the longest suffix of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (auto& s : stops_) {
    size_t maxk = std::min(s.size() - 1, held_.size());
    for (size_t k = maxk; k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  // Never split a UTF-8 character: extend the hold to the character start.
  size_t cut = held_.size() - keep;
  while (cut > 0 && cut < held_.size() && (static_cast<uint8_t>(held_[cut]) & 0xC0) == 0x80) --cut;
  r.emit = held_.substr(0, cut);
  held_.erase(0, cut);
  return r;
}

std::string StopStringMatcher::flush() {
  if (stopped_) return "";
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace sala
