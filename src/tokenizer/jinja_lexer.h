// Splitting template source into text and tag tokens (internal to the Jinja interpreter; see jinja.h).
#pragma once

#include "tokenizer/jinja_value.h"

namespace sala::jinja::detail {

// ---------------------------------------------------------------- lexer

struct Tok {
  enum T { Name, Str, Int, Float, Op, End } t;
  std::string s;
  int64_t i = 0;
  double f = 0;
};

[[noreturn]] inline void syn_fail(const std::string& msg) { throw Error("chat template: " + msg); }

// Tokenizes the inside of a tag starting at `pos`; stops at the closing delimiter and
// returns the tokens; `pos` is left after the delimiter. `strip_after` is set for '-'.
inline std::vector<Tok> lex_tag(const std::string& src, size_t& pos, const std::string& close, bool& strip_after,
                         bool& plus_after) {
  std::vector<Tok> toks;
  int depth = 0;
  strip_after = plus_after = false;
  while (true) {
    while (pos < src.size() && std::isspace(static_cast<unsigned char>(src[pos]))) ++pos;
    if (pos >= src.size()) syn_fail("unterminated tag (missing '" + close + "')");
    if (depth == 0) {
      if (src.compare(pos, close.size() + 1, "-" + close) == 0) {
        strip_after = true;
        pos += close.size() + 1;
        break;
      }
      if (src.compare(pos, close.size() + 1, "+" + close) == 0) {
        plus_after = true;
        pos += close.size() + 1;
        break;
      }
      if (src.compare(pos, close.size(), close) == 0) {
        pos += close.size();
        break;
      }
    }
    char c = src[pos];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos;
      while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
      toks.push_back({Tok::Name, src.substr(pos, e - pos)});
      pos = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = pos;
      bool flt = false;
      while (e < src.size() && (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
      if (e + 1 < src.size() && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
        flt = true;
        ++e;
        while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
      }
      if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
        size_t k = e + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) {
          flt = true;
          e = k;
          while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
        }
      }
      std::string num;
      for (size_t k = pos; k < e; ++k)
        if (src[k] != '_') num += src[k];
      Tok t{flt ? Tok::Float : Tok::Int, num};
      // strtod / from_chars, not stod / stoll: those throw std::out_of_range (not a clear
      // error) for 1e999 or a 30-digit literal. A float literal past double is inf as in
      // Python; an integer literal past 64 bits is refused.
      if (flt) {
        t.f = std::strtod(num.c_str(), nullptr);
      } else {
        auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), t.i);
        if (ec != std::errc() || end != num.data() + num.size())
          syn_fail("integer literal " + num + " out of 64-bit range");
      }
      toks.push_back(t);
      pos = e;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t k = pos + 1;
      while (true) {
        if (k >= src.size()) syn_fail("unterminated string literal");
        char d = src[k];
        if (d == c) break;
        if (d == '\\' && k + 1 < src.size()) {
          char e = src[k + 1];
          k += 2;
          switch (e) {
            case 'n': s += '\n'; break;
            case 't': s += '\t'; break;
            case 'r': s += '\r'; break;
            case '\\': s += '\\'; break;
            case '\'': s += '\''; break;
            case '"': s += '"'; break;
            case '0': s += '\0'; break;
            case '\n': break;
            case 'a': s += '\a'; break;
            case 'b': s += '\b'; break;
            case 'f': s += '\f'; break;
            case 'v': s += '\v'; break;
            case 'x':
            case 'u':
            case 'U': {
              size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
              if (k + n > src.size()) syn_fail("truncated string escape");
              uint32_t cp = 0;
              for (size_t q = 0; q < n; ++q) {
                char h = src[k + q];
                if (!std::isxdigit(static_cast<unsigned char>(h))) syn_fail("bad string escape");
                cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
              }
              k += n;
              if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) syn_fail("unsupported string escape (surrogate / out of range)");
              if (cp < 0x80) {
                s += static_cast<char>(cp);
              } else if (cp < 0x800) {
                s += static_cast<char>(0xC0 | (cp >> 6));
                s += static_cast<char>(0x80 | (cp & 0x3F));
              } else if (cp < 0x10000) {
                s += static_cast<char>(0xE0 | (cp >> 12));
                s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                s += static_cast<char>(0x80 | (cp & 0x3F));
              } else {
                s += static_cast<char>(0xF0 | (cp >> 18));
                s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
                s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                s += static_cast<char>(0x80 | (cp & 0x3F));
              }
              break;
            }
            case 'N': syn_fail("unsupported string escape \\N{...}");
            default:
              s += '\\';
              s += e;
          }
          continue;
        }
        s += d;
        ++k;
      }
      toks.push_back({Tok::Str, s});
      pos = k + 1;
    } else {
      static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                  "(", ")", "[", "]", "{", "}", ".", ",", ":", "|", "=", "!"};
      bool found = false;
      for (const char* op : ops) {
        size_t n = std::char_traits<char>::length(op);
        if (src.compare(pos, n, op) == 0) {
          std::string o(op);
          if (o == "!") syn_fail("unexpected character '!'");
          if (o == "(" || o == "[" || o == "{") ++depth;
          if (o == ")" || o == "]" || o == "}") --depth;
          toks.push_back({Tok::Op, o});
          pos += n;
          found = true;
          break;
        }
      }
      if (!found) syn_fail(fmt::format("unexpected character '{}'", c));
    }
  }
  toks.push_back({Tok::End, ""});
  return toks;
}

struct Segment {
  enum K { Text, Out, Stmt } k;
  std::string text;
  std::vector<Tok> toks;
};

inline std::vector<Segment> split_source(std::string src) {
  // newline normalisation (jinja2 newline_sequence='\n') and keep_trailing_newline=False
  {
    std::string n;
    n.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        n += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        n += src[i];
      }
    }
    src = std::move(n);
  }
  std::vector<Segment> segs;
  size_t pos = 0;
  bool strip_next = false, trim_nl_next = false;
  while (pos <= src.size()) {
    size_t tag = std::string::npos;
    for (size_t k = pos; k + 1 < src.size(); ++k) {
      if (src[k] == '{' && (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#')) {
        tag = k;
        break;
      }
    }
    std::string text = src.substr(pos, (tag == std::string::npos ? src.size() : tag) - pos);
    size_t text_start = pos;
    if (strip_next) {
      size_t b = 0;
      while (b < text.size() && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
      text = text.substr(b);
      text_start += b;
    } else if (trim_nl_next && !text.empty() && text[0] == '\n') {
      text = text.substr(1);
      text_start += 1;
    }
    strip_next = trim_nl_next = false;
    if (tag == std::string::npos) {
      if (!text.empty() && text.back() == '\n') text.pop_back();  // keep_trailing_newline=False
      if (!text.empty()) segs.push_back({Segment::Text, text, {}});
      break;
    }
    char kind = src[tag + 1];
    size_t p = tag + 2;
    char sign = p < src.size() ? src[p] : 0;
    if (sign == '-') {
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
      ++p;
    } else if (sign == '+') {
      ++p;
    } else if (kind != '{') {
      // lstrip_blocks: strip spaces/tabs before a block/comment tag at line start
      size_t nl = text.rfind('\n');
      size_t l = nl == std::string::npos ? 0 : nl + 1;
      bool line_start = nl != std::string::npos || text_start == 0 || src[text_start - 1] == '\n';
      if (line_start && text.find_first_not_of(" \t", l) == std::string::npos) text.resize(l);
    }
    if (!text.empty()) segs.push_back({Segment::Text, text, {}});
    if (kind == '#') {
      size_t e = src.find("#}", p);
      if (e == std::string::npos) syn_fail("unterminated comment");
      bool minus = e > p && src[e - 1] == '-';
      pos = e + 2;
      if (minus) strip_next = true;
      else trim_nl_next = !(e > p && src[e - 1] == '+');
      continue;
    }
    bool strip_after = false, plus_after = false;
    std::string close = kind == '{' ? "}}" : "%}";
    size_t q = p;
    auto toks = lex_tag(src, q, close, strip_after, plus_after);
    pos = q;
    if (strip_after) strip_next = true;
    else if (kind == '%' && !plus_after) trim_nl_next = true;
    if (kind == '%' && toks.size() >= 2 && toks[0].t == Tok::Name && toks[0].s == "raw")
      syn_fail("unsupported construct '{% raw %}'");
    segs.push_back({kind == '{' ? Segment::Out : Segment::Stmt, "", std::move(toks)});
  }
  return segs;
}


}  // namespace sala::jinja::detail
