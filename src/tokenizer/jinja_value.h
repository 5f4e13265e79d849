// Values with Python semantics, the render context, call arguments (internal to the Jinja interpreter; see jinja.h).
#pragma once
#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace sala::jinja::detail {

using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------- values

struct Value;
using NsData = std::map<std::string, Value>;

struct Value {
  enum class K { Undef, Json, Ns } k = K::Undef;
  // Shared and immutable: sub-values alias into their parent (no deep copies on access).
  std::shared_ptr<const ojson> p;
  std::shared_ptr<NsData> ns;
  static Value undef() { return Value{}; }
  static Value of(ojson v) {
    Value r;
    r.k = K::Json;
    r.p = std::make_shared<const ojson>(std::move(v));
    return r;
  }
  // A sub-value of `parent` (an element or member of parent.j()).
  static Value sub(const Value& parent, const ojson& child) {
    Value r;
    r.k = K::Json;
    r.p = std::shared_ptr<const ojson>(parent.p, &child);
    return r;
  }
  const ojson& j() const { return *p; }
  bool is_undef() const { return k == K::Undef; }
  bool is_json() const { return k == K::Json; }
};

[[noreturn]] inline void rt_fail(const std::string& msg) { throw Error("chat template: " + msg); }
// Largest string / list a repetition ('x' * n) may build: far beyond any real prompt.
constexpr uint64_t kMaxRepeat = uint64_t(64) << 20;

inline const ojson& J(const Value& v, const char* what) {
  if (v.k != Value::K::Json) rt_fail(fmt::format("{} of an undefined value or namespace", what));
  return v.j();
}

// UTF-8 <-> code points, for Python string indexing / slicing / length.
inline std::vector<std::string> cps(const std::string& s) {
  std::vector<std::string> r;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = s.size() - i;
    r.push_back(s.substr(i, n));
    i += n;
  }
  return r;
}

inline std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  // Python writes 1e+16 and 1e-05; fmt writes 1e+16 and 1e-05 too.
  return s;
}

inline std::string py_repr_str(const std::string& s) {
  // Python repr of a str: single quotes unless it contains ' and no ".
  bool sq = s.find('\'') != std::string::npos, dq = s.find('"') != std::string::npos;
  char q = (sq && !dq) ? '"' : '\'';
  std::string r(1, q);
  for (unsigned char c : s) {
    if (c == '\\') r += "\\\\";
    else if (c == static_cast<unsigned char>(q)) { r += '\\'; r += q; }
    else if (c == '\n') r += "\\n";
    else if (c == '\r') r += "\\r";
    else if (c == '\t') r += "\\t";
    else if (c < 0x20 || c == 0x7f) r += fmt::format("\\x{:02x}", c);
    else r += static_cast<char>(c);
  }
  r += q;
  return r;
}

inline std::string py_str(const ojson& v, bool repr = false) {
  switch (v.type()) {
    case ojson::value_t::null: return "None";
    case ojson::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case ojson::value_t::number_integer: return std::to_string(v.get<int64_t>());
    case ojson::value_t::number_unsigned: return std::to_string(v.get<uint64_t>());
    case ojson::value_t::number_float: return py_float(v.get<double>());
    case ojson::value_t::string: return repr ? py_repr_str(v.get_ref<const std::string&>()) : v.get<std::string>();
    case ojson::value_t::array: {
      std::string r = "[";
      bool first = true;
      for (auto& e : v) {
        if (!first) r += ", ";
        first = false;
        r += py_str(e, true);
      }
      return r + "]";
    }
    case ojson::value_t::object: {
      std::string r = "{";
      bool first = true;
      for (auto& [k, e] : v.items()) {
        if (!first) r += ", ";
        first = false;
        r += py_repr_str(k) + ": " + py_str(e, true);
      }
      return r + "}";
    }
    default: return "";
  }
}

inline std::string to_str(const Value& v) {
  if (v.is_undef()) return "";
  if (v.k == Value::K::Ns) return "<Namespace>";
  return py_str(v.j());
}

// json.dumps(x, ensure_ascii=False, indent=indent, separators=None, sort_keys=False)
inline std::string json_str(const std::string& s) {
  std::string r = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': r += "\\\""; break;
      case '\\': r += "\\\\"; break;
      case '\n': r += "\\n"; break;
      case '\r': r += "\\r"; break;
      case '\t': r += "\\t"; break;
      case '\b': r += "\\b"; break;
      case '\f': r += "\\f"; break;
      default:
        if (c < 0x20) r += fmt::format("\\u{:04x}", c);
        else r += static_cast<char>(c);
    }
  }
  return r + "\"";
}

inline void py_dumps(const ojson& v, int indent, int level, std::string& out) {
  auto nl = [&](int lv) {
    out += '\n';
    out.append(static_cast<size_t>(indent * lv), ' ');
  };
  switch (v.type()) {
    case ojson::value_t::null: out += "null"; return;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case ojson::value_t::number_float: {
      double d = v.get<double>();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float(d);
      return;
    }
    case ojson::value_t::string: out += json_str(v.get_ref<const std::string&>()); return;
    case ojson::value_t::array:
    case ojson::value_t::object: {
      bool obj = v.is_object();
      if (v.empty()) {
        out += obj ? "{}" : "[]";
        return;
      }
      out += obj ? '{' : '[';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) nl(level + 1);
        if (obj) {
          out += json_str(it.key());
          out += ": ";
        }
        py_dumps(*it, indent, level + 1, out);
      }
      if (indent >= 0) nl(level);
      out += obj ? '}' : ']';
      return;
    }
    default: out += v.dump(); return;
  }
}

inline bool truthy(const Value& v) {
  if (v.is_undef()) return false;
  if (v.k == Value::K::Ns) return true;
  const ojson& j = v.j();
  switch (j.type()) {
    case ojson::value_t::null: return false;
    case ojson::value_t::boolean: return j.get<bool>();
    case ojson::value_t::number_integer: return j.get<int64_t>() != 0;
    case ojson::value_t::number_unsigned: return j.get<uint64_t>() != 0;
    case ojson::value_t::number_float: return j.get<double>() != 0;
    case ojson::value_t::string: return !j.get_ref<const std::string&>().empty();
    case ojson::value_t::array:
    case ojson::value_t::object: return !j.empty();
    default: return false;
  }
}

inline bool is_int(const ojson& j) { return j.is_number_integer() || j.is_boolean(); }
// Truncates a float as Python's int() does; one outside 64 bits (or NaN / inf) is refused
// (a cast would be UB).
inline int64_t float_to_int(double d) {
  if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0)) rt_fail("float out of integer range");
  return static_cast<int64_t>(d);
}
inline int64_t as_int(const ojson& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
  if (j.is_number_float()) return float_to_int(j.get<double>());
  if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX)) rt_fail("integer out of 64-bit range");
  return j.get<int64_t>();
}
inline double as_num(const ojson& j) { return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<double>(); }
inline bool is_num(const ojson& j) { return j.is_number() || j.is_boolean(); }

inline bool py_eq(const Value& a, const Value& b) {
  if (a.is_undef() || b.is_undef()) return a.is_undef() && b.is_undef();
  if (a.k == Value::K::Ns || b.k == Value::K::Ns) return a.ns == b.ns;
  if (is_num(a.j()) && is_num(b.j())) {
    if (is_int(a.j()) && is_int(b.j())) return as_int(a.j()) == as_int(b.j());
    return as_num(a.j()) == as_num(b.j());
  }
  return a.j() == b.j();
}

inline int py_cmp(const Value& a, const Value& b, const std::string& op) {
  const ojson& x = J(a, "comparison");
  const ojson& y = J(b, "comparison");
  if (is_num(x) && is_num(y)) {
    double p = as_num(x), q = as_num(y);
    if (is_int(x) && is_int(y)) {
      int64_t i = as_int(x), k = as_int(y);
      return i < k ? -1 : i > k ? 1 : 0;
    }
    return p < q ? -1 : p > q ? 1 : 0;
  }
  if (x.is_string() && y.is_string()) {
    int c = x.get_ref<const std::string&>().compare(y.get_ref<const std::string&>());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  rt_fail("'" + op + "' not supported between these types");
}

inline bool py_in(const Value& item, const Value& container) {
  const ojson& c = J(container, "'in'");
  if (c.is_string()) {
    const ojson& i = J(item, "'in'");
    if (!i.is_string()) rt_fail("'in <string>' requires a string as left operand");
    return c.get_ref<const std::string&>().find(i.get_ref<const std::string&>()) != std::string::npos;
  }
  if (c.is_array()) {
    for (auto& e : c)
      if (py_eq(item, Value::sub(container, e))) return true;
    return false;
  }
  if (c.is_object()) {
    if (item.is_json() && item.j().is_string()) return c.contains(item.j().get<std::string>());
    return false;
  }
  rt_fail("'in' on a value that is not a container");
}

inline std::vector<Value> iterate(const Value& v) {
  std::vector<Value> r;
  if (v.is_undef()) return r;
  const ojson& j = J(v, "iteration");
  if (j.is_array())
    for (auto& e : j) r.push_back(Value::sub(v, e));
  else if (j.is_object())
    for (auto& [k, e] : j.items()) r.push_back(Value::of(k));
  else if (j.is_string())
    for (auto& c : cps(j.get<std::string>())) r.push_back(Value::of(c));
  else
    rt_fail("value is not iterable");
  return r;
}

// Python slice index normalisation.
inline std::vector<int64_t> slice_indices(int64_t n, const std::optional<int64_t>& a, const std::optional<int64_t>& b,
                                   const std::optional<int64_t>& c) {
  int64_t step = c.value_or(1);
  if (step == 0) rt_fail("slice step cannot be zero");
  auto norm = [&](std::optional<int64_t> x, int64_t dflt, bool neg) -> int64_t {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) v += n;
    if (neg) return std::clamp<int64_t>(v, -1, n - 1);
    return std::clamp<int64_t>(v, 0, n);
  };
  std::vector<int64_t> idx;
  if (step > 0) {
    int64_t s = norm(a, 0, false), e = norm(b, n, false);
    // A huge step would overflow i (UB): the loop ends when the next index is past the end.
    for (int64_t i = s; i < e;) {
      idx.push_back(i);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
  } else {
    int64_t s = norm(a, n - 1, true), e = norm(b, -1, true);
    for (int64_t i = s; i > e;) {
      idx.push_back(i);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
  }
  return idx;
}

inline std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  std::string ws = chars ? *chars : std::string(" \t\n\r\v\f");
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && ws.find(s[b]) != std::string::npos) ++b;
  if (right)
    while (e > b && ws.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

inline std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string r;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    auto cs = cps(s);
    int64_t done = 0;
    for (auto& c : cs) {
      if (count < 0 || done < count) {
        r += to;
        ++done;
      }
      r += c;
    }
    if (count < 0 || done < count) r += to;
    return r;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    r += s.substr(pos, f - pos);
    r += to;
    pos = f + from.size();
    ++done;
  }
  return r + s.substr(pos);
}

inline ojson py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  ojson r = ojson::array();
  if (!sep) {
    const std::string ws = " \t\n\r\v\f";
    size_t i = 0;
    int64_t done = 0;
    while (true) {
      while (i < s.size() && ws.find(s[i]) != std::string::npos) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && done >= maxsplit) {
        r.push_back(py_strip(s.substr(i), std::nullopt, false, true));
        break;
      }
      size_t e = i;
      while (e < s.size() && ws.find(s[e]) == std::string::npos) ++e;
      r.push_back(s.substr(i, e - i));
      ++done;
      i = e;
    }
    return r;
  }
  if (sep->empty()) rt_fail("split(): empty separator");
  size_t pos = 0;
  int64_t done = 0;
  while (maxsplit < 0 || done < maxsplit) {
    size_t f = s.find(*sep, pos);
    if (f == std::string::npos) break;
    r.push_back(s.substr(pos, f - pos));
    pos = f + sep->size();
    ++done;
  }
  r.push_back(s.substr(pos));
  return r;
}

inline std::string ascii_case(std::string s, bool up) {
  for (auto& c : s) c = up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                           : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// ---------------------------------------------------------------- context

struct Context {
  std::vector<std::map<std::string, Value>> frames;
  Value get(const std::string& n) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
      auto f = it->find(n);
      if (f != it->end()) return f->second;
    }
    return Value::undef();
  }
  void set(const std::string& n, Value v) { frames.back()[n] = std::move(v); }
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t i, const char* name) const {
    if (i < pos.size()) return &pos[i];
    for (auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};


}  // namespace sala::jinja::detail
