// Small UTF-8 helpers shared by the tokenizer pieces.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace sala::utf8 {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if the bytes there are not a
// valid sequence (overlong, surrogate, > U+10FFFF, truncated, stray continuation byte).
inline size_t valid_len(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  size_t n = s.size();
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return (i + 1 < n && (b(i + 1) & 0xC0) == 0x80) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (i + 2 >= n) return 0;
    uint8_t c1 = b(i + 1);
    uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    if (c1 < lo || c1 > hi || (b(i + 2) & 0xC0) != 0x80) return 0;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (i + 3 >= n) return 0;
    uint8_t c1 = b(i + 1);
    uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    if (c1 < lo || c1 > hi || (b(i + 2) & 0xC0) != 0x80 || (b(i + 3) & 0xC0) != 0x80) return 0;
    return 4;
  }
  return 0;
}

// Number of bytes of the maximal invalid subpart starting at s[i] (Unicode "maximal subpart"
// rule, as Python's errors="replace"): a prefix of a valid sequence counts as one unit.
inline size_t invalid_len(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  size_t n = s.size();
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else
    return 1;
  size_t k = 1;
  for (; k <= need && i + k < n; ++k) {
    uint8_t ck = b(i + k);
    if (k == 1 ? (ck < lo || ck > hi) : ((ck & 0xC0) != 0x80)) break;
  }
  return k;
}

inline bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t l = valid_len(s, i);
    if (!l) return false;
    i += l;
  }
  return true;
}

// Replaces invalid sequences with U+FFFD (one per maximal invalid subpart).
inline std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t l = valid_len(s, i);
    if (l) {
      out.append(s.substr(i, l));
      i += l;
    } else {
      out += "\xEF\xBF\xBD";
      i += invalid_len(s, i);
    }
  }
  return out;
}

// Decodes the valid sequence at s[i] (caller guarantees validity), advancing i.
inline uint32_t next_cp(std::string_view s, size_t& i) {
  auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k])); };
  uint32_t c = b(i);
  if (c < 0x80) { i += 1; return c; }
  if (c < 0xE0) { uint32_t r = ((c & 0x1F) << 6) | (b(i + 1) & 0x3F); i += 2; return r; }
  if (c < 0xF0) {
    uint32_t r = ((c & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    i += 3;
    return r;
  }
  uint32_t r = ((c & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F);
  i += 4;
  return r;
}

inline size_t char_len(uint8_t lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

inline void append_cp(std::string& out, uint32_t cp) {
  if (cp < 0x80) out += static_cast<char>(cp);
  else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Rust's char::is_whitespace (what tokenizers uses for lstrip/rstrip/single_word).
inline bool is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace sala::utf8
