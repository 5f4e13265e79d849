#include "tokenizer/jinja.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <map>
#include <set>
#include <vector>

#include "core/error.h"

namespace sala::jinja {
namespace {

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

[[noreturn]] void rt_fail(const std::string& msg) { throw Error("chat template: " + msg); }

const ojson& J(const Value& v, const char* what) {
  if (v.k != Value::K::Json) rt_fail(fmt::format("{} of an undefined value or namespace", what));
  return v.j();
}

// UTF-8 <-> code points, for Python string indexing / slicing / length.
std::vector<std::string> cps(const std::string& s) {
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

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  // Python writes 1e+16 and 1e-05; fmt writes 1e+16 and 1e-05 too.
  return s;
}

std::string py_repr_str(const std::string& s) {
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

std::string py_str(const ojson& v, bool repr = false) {
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

std::string to_str(const Value& v) {
  if (v.is_undef()) return "";
  if (v.k == Value::K::Ns) return "<Namespace>";
  return py_str(v.j());
}

// json.dumps(x, ensure_ascii=False, indent=indent, separators=None, sort_keys=False)
std::string json_str(const std::string& s) {
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

void py_dumps(const ojson& v, int indent, int level, std::string& out) {
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

bool truthy(const Value& v) {
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

bool is_int(const ojson& j) { return j.is_number_integer() || j.is_boolean(); }
int64_t as_int(const ojson& j) { return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<int64_t>(); }
double as_num(const ojson& j) { return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<double>(); }
bool is_num(const ojson& j) { return j.is_number() || j.is_boolean(); }

bool py_eq(const Value& a, const Value& b) {
  if (a.is_undef() || b.is_undef()) return a.is_undef() && b.is_undef();
  if (a.k == Value::K::Ns || b.k == Value::K::Ns) return a.ns == b.ns;
  if (is_num(a.j()) && is_num(b.j())) {
    if (is_int(a.j()) && is_int(b.j())) return as_int(a.j()) == as_int(b.j());
    return as_num(a.j()) == as_num(b.j());
  }
  return a.j() == b.j();
}

int py_cmp(const Value& a, const Value& b, const std::string& op) {
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

bool py_in(const Value& item, const Value& container) {
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

std::vector<Value> iterate(const Value& v) {
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
std::vector<int64_t> slice_indices(int64_t n, const std::optional<int64_t>& a, const std::optional<int64_t>& b,
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
    for (int64_t i = s; i < e; i += step) idx.push_back(i);
  } else {
    int64_t s = norm(a, n - 1, true), e = norm(b, -1, true);
    for (int64_t i = s; i > e; i += step) idx.push_back(i);
  }
  return idx;
}

std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  std::string ws = chars ? *chars : std::string(" \t\n\r\v\f");
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && ws.find(s[b]) != std::string::npos) ++b;
  if (right)
    while (e > b && ws.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
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

ojson py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
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

std::string ascii_case(std::string s, bool up) {
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

// ---------------------------------------------------------------- expressions

struct Expr {
  virtual ~Expr() = default;
  virtual Value eval(Context& c) const = 0;
};
using ExprP = std::unique_ptr<Expr>;

struct Literal : Expr {
  ojson v;
  Value eval(Context&) const override { return Value::of(v); }
};
struct Name : Expr {
  std::string n;
  Value eval(Context& c) const override { return c.get(n); }
};
struct ListE : Expr {
  std::vector<ExprP> items;
  Value eval(Context& c) const override {
    ojson a = ojson::array();
    for (auto& e : items) {
      Value v = e->eval(c);
      a.push_back(v.is_json() ? v.j() : ojson());
    }
    return Value::of(a);
  }
};
struct DictE : Expr {
  std::vector<std::pair<ExprP, ExprP>> items;
  Value eval(Context& c) const override {
    ojson o = ojson::object();
    for (auto& [k, e] : items) {
      Value kv = k->eval(c);
      if (!kv.is_json() || !kv.j().is_string()) rt_fail("dict keys must be strings");
      Value v = e->eval(c);
      o[kv.j().get<std::string>()] = v.is_json() ? v.j() : ojson();
    }
    return Value::of(o);
  }
};

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undef()) rt_fail("subscript/attribute of an undefined value");
  if (obj.k == Value::K::Ns) {
    if (key.is_json() && key.j().is_string()) {
      auto it = obj.ns->find(key.j().get<std::string>());
      if (it != obj.ns->end()) return it->second;
    }
    return Value::undef();
  }
  const ojson& o = obj.j();
  if (!key.is_json()) return Value::undef();
  const ojson& k = key.j();
  if (o.is_object()) {
    if (k.is_string()) {
      auto it = o.find(k.get<std::string>());
      if (it != o.end()) return Value::sub(obj, *it);
    }
    return Value::undef();
  }
  if ((o.is_array() || o.is_string()) && is_int(k) && !k.is_boolean()) {
    int64_t i = as_int(k);
    if (o.is_array()) {
      int64_t n = static_cast<int64_t>(o.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undef();
      return Value::sub(obj, o[static_cast<size_t>(i)]);
    }
    auto cs = cps(o.get<std::string>());
    int64_t n = static_cast<int64_t>(cs.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undef();
    return Value::of(cs[static_cast<size_t>(i)]);
  }
  return Value::undef();
}

struct GetAttr : Expr {
  ExprP obj;
  std::string attr;
  Value eval(Context& c) const override { return get_item(obj->eval(c), Value::of(attr)); }
};
struct GetItem : Expr {
  ExprP obj, key;
  Value eval(Context& c) const override { return get_item(obj->eval(c), key->eval(c)); }
};
struct Slice : Expr {
  ExprP obj, a, b, s;
  Value eval(Context& c) const override {
    Value o = obj->eval(c);
    auto opt = [&](const ExprP& e) -> std::optional<int64_t> {
      if (!e) return std::nullopt;
      Value v = e->eval(c);
      if (v.is_json() && v.j().is_null()) return std::nullopt;
      if (!v.is_json() || !is_int(v.j())) rt_fail("slice indices must be integers");
      return as_int(v.j());
    };
    auto x = opt(a), y = opt(b), z = opt(s);
    const ojson& j = J(o, "slice");
    if (j.is_array()) {
      ojson r = ojson::array();
      for (auto i : slice_indices(static_cast<int64_t>(j.size()), x, y, z)) r.push_back(j[static_cast<size_t>(i)]);
      return Value::of(r);
    }
    if (j.is_string()) {
      auto cs = cps(j.get<std::string>());
      std::string r;
      for (auto i : slice_indices(static_cast<int64_t>(cs.size()), x, y, z)) r += cs[static_cast<size_t>(i)];
      return Value::of(r);
    }
    rt_fail("value cannot be sliced");
  }
};

struct Unary : Expr {
  std::string op;
  ExprP e;
  Value eval(Context& c) const override {
    Value v = e->eval(c);
    if (op == "not") return Value::of(!truthy(v));
    const ojson& j = J(v, "unary operator");
    if (!is_num(j)) rt_fail("bad operand type for unary " + op);
    if (op == "+") return Value::of(j);
    if (is_int(j)) return Value::of(-as_int(j));
    return Value::of(-as_num(j));
  }
};

struct Binary : Expr {
  std::string op;
  ExprP l, r;
  Value eval(Context& c) const override {
    if (op == "and") {
      Value a = l->eval(c);
      return truthy(a) ? r->eval(c) : a;
    }
    if (op == "or") {
      Value a = l->eval(c);
      return truthy(a) ? a : r->eval(c);
    }
    Value a = l->eval(c), b = r->eval(c);
    if (op == "~") return Value::of(to_str(a) + to_str(b));
    if (op == "==") return Value::of(py_eq(a, b));
    if (op == "!=") return Value::of(!py_eq(a, b));
    if (op == "<") return Value::of(py_cmp(a, b, op) < 0);
    if (op == ">") return Value::of(py_cmp(a, b, op) > 0);
    if (op == "<=") return Value::of(py_cmp(a, b, op) <= 0);
    if (op == ">=") return Value::of(py_cmp(a, b, op) >= 0);
    if (op == "in") return Value::of(py_in(a, b));
    if (op == "not in") return Value::of(!py_in(a, b));
    const ojson& x = J(a, "arithmetic");
    const ojson& y = J(b, "arithmetic");
    if (op == "+") {
      if (x.is_string() && y.is_string()) return Value::of(x.get<std::string>() + y.get<std::string>());
      if (x.is_array() && y.is_array()) {
        ojson r = x;
        for (auto& e : y) r.push_back(e);
        return Value::of(r);
      }
    }
    if (op == "*") {
      if ((x.is_string() || x.is_array()) && is_int(y)) {
        ojson r = x.is_string() ? ojson("") : ojson::array();
        std::string s;
        for (int64_t i = 0; i < as_int(y); ++i) {
          if (x.is_string()) s += x.get<std::string>();
          else for (auto& e : x) r.push_back(e);
        }
        return x.is_string() ? Value::of(s) : Value::of(r);
      }
    }
    if (!is_num(x) || !is_num(y)) rt_fail("unsupported operand types for " + op);
    bool ints = is_int(x) && is_int(y);
    if (op == "/") {
      if (as_num(y) == 0) rt_fail("division by zero");
      return Value::of(as_num(x) / as_num(y));
    }
    if (ints) {
      int64_t p = as_int(x), q = as_int(y);
      if (op == "+") return Value::of(p + q);
      if (op == "-") return Value::of(p - q);
      if (op == "*") return Value::of(p * q);
      if (q == 0) rt_fail("division by zero");
      int64_t d = p / q, m = p % q;
      if (m != 0 && ((m < 0) != (q < 0))) {
        d -= 1;
        m += q;
      }
      if (op == "//") return Value::of(d);
      if (op == "%") return Value::of(m);
    } else {
      double p = as_num(x), q = as_num(y);
      if (op == "+") return Value::of(p + q);
      if (op == "-") return Value::of(p - q);
      if (op == "*") return Value::of(p * q);
      if (q == 0) rt_fail("division by zero");
      if (op == "//") return Value::of(std::floor(p / q));
      if (op == "%") return Value::of(p - std::floor(p / q) * q);
    }
    rt_fail("unsupported operator " + op);
  }
};

struct CondE : Expr {
  ExprP cond, a, b;  // b may be null -> undefined
  Value eval(Context& c) const override {
    if (truthy(cond->eval(c))) return a->eval(c);
    return b ? b->eval(c) : Value::undef();
  }
};

struct ArgExprs {
  std::vector<ExprP> pos;
  std::vector<std::pair<std::string, ExprP>> kw;
  Args eval(Context& c) const {
    Args a;
    for (auto& e : pos) a.pos.push_back(e->eval(c));
    for (auto& [k, e] : kw) a.kw.emplace_back(k, e->eval(c));
    return a;
  }
};

std::string need_str(const Value* v, const char* what) {
  if (!v || !v->is_json() || !v->j().is_string()) rt_fail(std::string(what) + " expects a string argument");
  return v->j().get<std::string>();
}
std::optional<std::string> opt_str(const Value* v, const char* what) {
  if (!v || (v->is_json() && v->j().is_null())) return std::nullopt;
  return need_str(v, what);
}
int64_t opt_int(const Value* v, int64_t dflt) {
  if (!v || (v->is_json() && v->j().is_null())) return dflt;
  if (!v->is_json() || !is_int(v->j())) rt_fail("expected an integer argument");
  return as_int(v->j());
}

const std::set<std::string> kFilters = {"trim", "length", "count", "tojson", "upper", "lower", "default", "d",
                                        "first", "last", "join", "replace", "string", "list", "int", "float",
                                        "abs", "capitalize", "items", "reverse"};
const std::set<std::string> kTests = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                      "boolean", "true", "false", "mapping", "iterable", "sequence", "odd",
                                      "even", "eq", "equalto", "ne", "in"};
const std::set<std::string> kMethods = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split",
                                        "replace", "upper", "lower", "items", "keys", "values", "get",
                                        "title", "capitalize"};
const std::set<std::string> kFunctions = {"namespace", "raise_exception", "range"};

Value apply_filter(const std::string& f, const Value& v, const Args& a) {
  if (f == "default" || f == "d") {
    const Value* dv = a.get(0, "default_value");
    bool boolean = a.get(1, "boolean") && truthy(*a.get(1, "boolean"));
    if (v.is_undef() || (boolean && !truthy(v))) return dv ? *dv : Value::of("");
    return v;
  }
  if (f == "length" || f == "count") {
    if (v.is_undef()) return Value::of(0);
    const ojson& j = J(v, "length");
    if (j.is_string()) return Value::of(static_cast<int64_t>(cps(j.get<std::string>()).size()));
    if (j.is_array() || j.is_object()) return Value::of(static_cast<int64_t>(j.size()));
    rt_fail("object has no length");
  }
  if (f == "string") return Value::of(to_str(v));
  if (f == "tojson") {
    const Value* ind = a.get(0, "indent");
    int indent = ind && ind->is_json() && !ind->j().is_null() ? static_cast<int>(opt_int(ind, -1)) : -1;
    std::string out;
    py_dumps(v.is_json() ? v.j() : ojson(), indent, 0, out);
    return Value::of(out);
  }
  if (f == "trim") return Value::of(py_strip(to_str(v), opt_str(a.get(0, "chars"), "trim"), true, true));
  if (f == "upper") return Value::of(ascii_case(to_str(v), true));
  if (f == "lower") return Value::of(ascii_case(to_str(v), false));
  if (f == "capitalize") {
    std::string s = ascii_case(to_str(v), false);
    if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return Value::of(s);
  }
  if (f == "first" || f == "last") {
    auto items = iterate(v);
    if (items.empty()) return Value::undef();
    return f == "first" ? items.front() : items.back();
  }
  if (f == "list" || f == "reverse") {
    auto items = iterate(v);
    if (f == "reverse") {
      if (v.is_json() && v.j().is_string()) {
        std::string s;
        for (auto it = items.rbegin(); it != items.rend(); ++it) s += it->j().get<std::string>();
        return Value::of(s);
      }
      std::reverse(items.begin(), items.end());
    }
    ojson r = ojson::array();
    for (auto& e : items) r.push_back(e.j());
    return Value::of(r);
  }
  if (f == "items") {
    const ojson& j = J(v, "items");
    if (!j.is_object()) rt_fail("items filter expects a mapping");
    ojson r = ojson::array();
    for (auto& [k, e] : j.items()) r.push_back(ojson::array({k, e}));
    return Value::of(r);
  }
  if (f == "join") {
    std::string sep = a.get(0, "d") ? need_str(a.get(0, "d"), "join") : "";
    std::string r;
    bool first = true;
    for (auto& e : iterate(v)) {
      if (!first) r += sep;
      first = false;
      r += to_str(e);
    }
    return Value::of(r);
  }
  if (f == "replace") {
    return Value::of(py_replace(to_str(v), need_str(a.get(0, "old"), "replace"), need_str(a.get(1, "new"), "replace"),
                                opt_int(a.get(2, "count"), -1)));
  }
  if (f == "int") {
    if (v.is_json() && is_num(v.j())) return Value::of(static_cast<int64_t>(as_num(v.j())));
    try {
      return Value::of(static_cast<int64_t>(std::stoll(to_str(v))));
    } catch (...) {
      return Value::of(opt_int(a.get(0, "default"), 0));
    }
  }
  if (f == "float") {
    if (v.is_json() && is_num(v.j())) return Value::of(as_num(v.j()));
    try {
      return Value::of(std::stod(to_str(v)));
    } catch (...) {
      return Value::of(0.0);
    }
  }
  if (f == "abs") {
    const ojson& j = J(v, "abs");
    if (is_int(j)) return Value::of(std::llabs(as_int(j)));
    return Value::of(std::fabs(as_num(j)));
  }
  rt_fail("unknown filter " + f);
}

bool apply_test(const std::string& t, const Value& v, const Args& a) {
  if (t == "defined") return !v.is_undef();
  if (t == "undefined") return v.is_undef();
  if (v.k == Value::K::Ns) return t == "iterable" ? false : false;
  const ojson* j = v.is_json() ? &v.j() : nullptr;
  if (t == "none") return j && j->is_null();
  if (t == "string") return j && j->is_string();
  if (t == "number") return j && j->is_number();
  if (t == "integer") return j && j->is_number_integer();
  if (t == "float") return j && j->is_number_float();
  if (t == "boolean") return j && j->is_boolean();
  if (t == "true") return j && j->is_boolean() && j->get<bool>();
  if (t == "false") return j && j->is_boolean() && !j->get<bool>();
  if (t == "mapping") return j && j->is_object();
  if (t == "iterable") return v.is_undef() || (j && (j->is_array() || j->is_object() || j->is_string()));
  if (t == "sequence") return j && (j->is_array() || j->is_object() || j->is_string());
  if (t == "odd" || t == "even") {
    if (!j || !is_int(*j)) rt_fail("odd/even test expects an integer");
    int64_t x = as_int(*j);
    return (((x % 2) + 2) % 2 == 1) == (t == "odd");
  }
  const Value* o = a.get(0, "other");
  if (!o) rt_fail("test " + t + " needs an argument");
  if (t == "eq" || t == "equalto") return py_eq(v, *o);
  if (t == "ne") return !py_eq(v, *o);
  if (t == "in") return py_in(v, *o);
  rt_fail("unknown test " + t);
}

Value call_method(const Value& obj, const std::string& m, const Args& a) {
  const ojson& j = J(obj, ("method " + m).c_str());
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    if (m == "startswith" || m == "endswith") {
      const Value* p = a.get(0, "prefix");
      std::vector<std::string> cands;
      if (p && p->is_json() && p->j().is_array())
        for (auto& e : p->j()) cands.push_back(e.get<std::string>());
      else
        cands.push_back(need_str(p, m.c_str()));
      for (auto& x : cands) {
        if (x.size() > s.size()) continue;
        if (m == "startswith" ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0)
          return Value::of(true);
      }
      return Value::of(false);
    }
    if (m == "strip" || m == "lstrip" || m == "rstrip")
      return Value::of(py_strip(s, opt_str(a.get(0, "chars"), m.c_str()), m != "rstrip", m != "lstrip"));
    if (m == "split") return Value::of(py_split(s, opt_str(a.get(0, "sep"), "split"), opt_int(a.get(1, "maxsplit"), -1)));
    if (m == "replace")
      return Value::of(py_replace(s, need_str(a.get(0, "old"), "replace"), need_str(a.get(1, "new"), "replace"),
                                  opt_int(a.get(2, "count"), -1)));
    if (m == "upper") return Value::of(ascii_case(s, true));
    if (m == "lower") return Value::of(ascii_case(s, false));
    if (m == "capitalize") return apply_filter("capitalize", obj, Args{});
    if (m == "title") {
      std::string r = s;
      bool prev_alpha = false;
      for (auto& ch : r) {
        unsigned char c = static_cast<unsigned char>(ch);
        bool alpha = std::isalpha(c);
        ch = static_cast<char>(alpha ? (prev_alpha ? std::tolower(c) : std::toupper(c)) : c);
        prev_alpha = alpha;
      }
      return Value::of(r);
    }
  }
  if (j.is_object()) {
    if (m == "items") return apply_filter("items", obj, Args{});
    if (m == "keys" || m == "values") {
      ojson r = ojson::array();
      for (auto& [k, e] : j.items()) r.push_back(m == "keys" ? ojson(k) : e);
      return Value::of(r);
    }
    if (m == "get") {
      std::string k = need_str(a.get(0, "key"), "get");
      auto it = j.find(k);
      if (it != j.end()) return Value::sub(obj, *it);
      const Value* d = a.get(1, "default");
      return d ? *d : Value::of(nullptr);
    }
  }
  rt_fail("no method " + m + " on this value");
}

struct FilterE : Expr {
  ExprP e;
  std::string name;
  ArgExprs args;
  Value eval(Context& c) const override { return apply_filter(name, e->eval(c), args.eval(c)); }
};
struct TestE : Expr {
  ExprP e;
  std::string name;
  bool negate = false;
  ArgExprs args;
  Value eval(Context& c) const override { return Value::of(apply_test(name, e->eval(c), args.eval(c)) != negate); }
};
struct MethodCall : Expr {
  ExprP obj;
  std::string name;
  ArgExprs args;
  Value eval(Context& c) const override { return call_method(obj->eval(c), name, args.eval(c)); }
};
struct FuncCall : Expr {
  std::string name;
  ArgExprs args;
  Value eval(Context& c) const override {
    Args a = args.eval(c);
    if (name == "namespace") {
      Value r;
      r.k = Value::K::Ns;
      r.ns = std::make_shared<NsData>();
      for (auto& p : a.pos) {
        if (!p.is_json() || !p.j().is_object()) rt_fail("namespace() positional argument must be a mapping");
        for (auto& [k, e] : p.j().items()) (*r.ns)[k] = Value::of(e);
      }
      for (auto& [k, v] : a.kw) (*r.ns)[k] = v;
      return r;
    }
    if (name == "raise_exception") {
      std::string msg = a.pos.empty() ? "" : to_str(a.pos[0]);
      throw Error("chat template raised an exception: " + msg);
    }
    if (name == "range") {
      std::vector<int64_t> n;
      for (auto& p : a.pos) n.push_back(opt_int(&p, 0));
      int64_t start = 0, stop = 0, step = 1;
      if (n.size() == 1) stop = n[0];
      else if (n.size() >= 2) {
        start = n[0];
        stop = n[1];
        if (n.size() > 2) step = n[2];
      }
      if (step == 0) rt_fail("range() step must not be zero");
      ojson r = ojson::array();
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        r.push_back(i);
        if (r.size() > 1000000) rt_fail("range() too large");
      }
      return Value::of(r);
    }
    rt_fail("unknown function " + name);
  }
};

// ---------------------------------------------------------------- statements

struct BreakSignal {};
struct ContinueSignal {};

struct Node {
  virtual ~Node() = default;
  virtual void render(Context& c, std::string& out) const = 0;
};
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

void render_body(const Body& b, Context& c, std::string& out) {
  for (auto& n : b) n->render(c, out);
}

struct TextN : Node {
  std::string text;
  void render(Context&, std::string& out) const override { out += text; }
};
struct OutN : Node {
  ExprP e;
  void render(Context& c, std::string& out) const override { out += to_str(e->eval(c)); }
};
struct IfN : Node {
  std::vector<std::pair<ExprP, Body>> branches;  // null cond = else
  void render(Context& c, std::string& out) const override {
    for (auto& [cond, body] : branches) {
      if (!cond || truthy(cond->eval(c))) {
        render_body(body, c, out);
        return;
      }
    }
  }
};
struct ForN : Node {
  std::vector<std::string> vars;
  ExprP iter, filter;
  Body body, else_body;
  void render(Context& c, std::string& out) const override {
    std::vector<Value> items = iterate(iter->eval(c));
    if (filter) {
      std::vector<Value> kept;
      for (auto& it : items) {
        c.frames.emplace_back();
        bind(c, it);
        if (truthy(filter->eval(c))) kept.push_back(it);
        c.frames.pop_back();
      }
      items = std::move(kept);
    }
    size_t n = items.size();
    for (size_t i = 0; i < n; ++i) {
      c.frames.emplace_back();
      bind(c, items[i]);
      ojson loop = ojson::object();
      loop["index0"] = i;
      loop["index"] = i + 1;
      loop["revindex"] = n - i;
      loop["revindex0"] = n - i - 1;
      loop["first"] = i == 0;
      loop["last"] = i + 1 == n;
      loop["length"] = n;
      loop["depth"] = 1;
      loop["depth0"] = 0;
      if (i > 0 && items[i - 1].is_json()) loop["previtem"] = items[i - 1].j();
      if (i + 1 < n && items[i + 1].is_json()) loop["nextitem"] = items[i + 1].j();
      c.set("loop", Value::of(loop));
      bool brk = false;
      try {
        render_body(body, c, out);
      } catch (const BreakSignal&) {
        brk = true;
      } catch (const ContinueSignal&) {
      }
      c.frames.pop_back();
      if (brk) break;
    }
    if (n == 0) render_body(else_body, c, out);
  }
  void bind(Context& c, const Value& it) const {
    if (vars.size() == 1) {
      c.set(vars[0], it);
      return;
    }
    if (!it.is_json() || !it.j().is_array() || it.j().size() != vars.size())
      rt_fail("cannot unpack loop item into " + std::to_string(vars.size()) + " variables");
    for (size_t k = 0; k < vars.size(); ++k) c.set(vars[k], Value::of(it.j()[k]));
  }
};
struct SetN : Node {
  std::string name, attr;  // attr non-empty: ns.attr = ...
  ExprP e;
  Body body;  // block set
  void render(Context& c, std::string&) const override {
    Value v;
    if (e) {
      v = e->eval(c);
    } else {
      std::string s;
      render_body(body, c, s);
      v = Value::of(s);
    }
    if (attr.empty()) {
      c.set(name, v);
      return;
    }
    Value target = c.get(name);
    if (target.k != Value::K::Ns) rt_fail("cannot assign attribute on non-namespace object " + name);
    (*target.ns)[attr] = v;
  }
};
struct BreakN : Node {
  void render(Context&, std::string&) const override { throw BreakSignal{}; }
};
struct ContinueN : Node {
  void render(Context&, std::string&) const override { throw ContinueSignal{}; }
};

// ---------------------------------------------------------------- lexer

struct Tok {
  enum T { Name, Str, Int, Float, Op, End } t;
  std::string s;
  int64_t i = 0;
  double f = 0;
};

[[noreturn]] void syn_fail(const std::string& msg) { throw Error("chat template: " + msg); }

// Tokenizes the inside of a tag starting at `pos`; stops at the closing delimiter and
// returns the tokens; `pos` is left after the delimiter. `strip_after` is set for '-'.
std::vector<Tok> lex_tag(const std::string& src, size_t& pos, const std::string& close, bool& strip_after,
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
      if (flt) t.f = std::stod(num);
      else t.i = std::stoll(num);
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

// ---------------------------------------------------------------- parser

class ExprParser {
 public:
  explicit ExprParser(std::vector<Tok> t) : t_(std::move(t)) {}

  const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool is_op(const char* o, size_t k = 0) const { return peek(k).t == Tok::Op && peek(k).s == o; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).t == Tok::Name && peek(k).s == n; }
  bool at_end() const { return peek().t == Tok::End; }
  Tok next() { return t_[std::min(p_++, t_.size() - 1)]; }
  void expect_op(const char* o) {
    if (!is_op(o)) syn_fail(fmt::format("expected '{}' but found '{}'", o, peek().s));
    ++p_;
  }
  std::string expect_name() {
    if (peek().t != Tok::Name) syn_fail(fmt::format("expected a name but found '{}'", peek().s));
    return next().s;
  }
  void expect_end() {
    if (!at_end()) syn_fail(fmt::format("unexpected '{}' in tag", peek().s));
  }

  ExprP expr() { return cond_expr(); }

  ExprP cond_expr() {
    ExprP e = or_expr();
    while (is_name("if")) {
      ++p_;
      auto c = std::make_unique<CondE>();
      c->cond = or_expr();
      if (is_name("else")) {
        ++p_;
        c->b = cond_expr();
      }
      c->a = std::move(e);
      e = std::move(c);
    }
    return e;
  }
  ExprP bin(std::string op, ExprP l, ExprP r) {
    auto b = std::make_unique<Binary>();
    b->op = std::move(op);
    b->l = std::move(l);
    b->r = std::move(r);
    return b;
  }
  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) {
      ++p_;
      e = bin("or", std::move(e), and_expr());
    }
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) {
      ++p_;
      e = bin("and", std::move(e), not_expr());
    }
    return e;
  }
  ExprP not_expr() {
    if (is_name("not")) {
      ++p_;
      auto u = std::make_unique<Unary>();
      u->op = "not";
      u->e = not_expr();
      return u;
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = math1();
    while (true) {
      std::string op;
      if (peek().t == Tok::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                  peek().s == "<=" || peek().s == ">=")) {
        op = next().s;
      } else if (is_name("in")) {
        ++p_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        p_ += 2;
        op = "not in";
      } else {
        break;
      }
      e = bin(op, std::move(e), math1());
    }
    return e;
  }
  ExprP math1() {
    ExprP e = concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().s;
      e = bin(op, std::move(e), concat());
    }
    return e;
  }
  ExprP concat() {
    ExprP e = math2();
    while (is_op("~")) {
      ++p_;
      e = bin("~", std::move(e), math2());
    }
    return e;
  }
  ExprP math2() {
    ExprP e = pow_expr();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().s;
      e = bin(op, std::move(e), pow_expr());
    }
    return e;
  }
  ExprP pow_expr() {
    ExprP e = unary(true);
    if (is_op("**")) syn_fail("unsupported operator '**'");
    return e;
  }
  ExprP unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      auto u = std::make_unique<Unary>();
      u->op = next().s;
      u->e = unary(false);
      e = std::move(u);
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filters(std::move(e));
    return e;
  }
  ExprP primary() {
    Tok t = next();
    if (t.t == Tok::Str) {
      std::string s = t.s;
      while (peek().t == Tok::Str) s += next().s;  // implicit concatenation
      auto l = std::make_unique<Literal>();
      l->v = s;
      return l;
    }
    if (t.t == Tok::Int || t.t == Tok::Float) {
      auto l = std::make_unique<Literal>();
      if (t.t == Tok::Int) l->v = t.i;
      else l->v = t.f;
      return l;
    }
    if (t.t == Tok::Name) {
      auto l = std::make_unique<Literal>();
      if (t.s == "true" || t.s == "True") { l->v = true; return l; }
      if (t.s == "false" || t.s == "False") { l->v = false; return l; }
      if (t.s == "none" || t.s == "None") { l->v = nullptr; return l; }
      if (is_op("(")) {
        if (!kFunctions.count(t.s)) syn_fail("unsupported function '" + t.s + "()'");
        ++p_;
        auto f = std::make_unique<FuncCall>();
        f->name = t.s;
        f->args = call_args();
        return f;
      }
      auto n = std::make_unique<Name>();
      n->n = t.s;
      return n;
    }
    if (t.t == Tok::Op && t.s == "(") {
      ExprP e = expr();
      if (is_op(",")) syn_fail("unsupported construct: tuple literal");
      expect_op(")");
      return e;
    }
    if (t.t == Tok::Op && t.s == "[") {
      auto l = std::make_unique<ListE>();
      while (!is_op("]")) {
        l->items.push_back(expr());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("]");
      return l;
    }
    if (t.t == Tok::Op && t.s == "{") {
      auto d = std::make_unique<DictE>();
      while (!is_op("}")) {
        ExprP k = expr();
        expect_op(":");
        d->items.emplace_back(std::move(k), expr());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("}");
      return d;
    }
    syn_fail(fmt::format("unexpected '{}' in expression", t.s.empty() ? "end of tag" : t.s));
  }
  ArgExprs call_args() {  // after '('
    ArgExprs a;
    while (!is_op(")")) {
      if (peek().t == Tok::Name && is_op("=", 1)) {
        std::string k = next().s;
        ++p_;
        a.kw.emplace_back(k, expr());
      } else {
        if (is_op("*") || is_op("**")) syn_fail("unsupported construct: *args/**kwargs in call");
        a.pos.push_back(expr());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
    return a;
  }
  ExprP postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        ++p_;
        std::string attr;
        if (peek().t == Tok::Int) attr = std::to_string(next().i);
        else attr = expect_name();
        if (is_op("(")) {
          if (!kMethods.count(attr)) syn_fail("unsupported method '." + attr + "()'");
          ++p_;
          auto m = std::make_unique<MethodCall>();
          m->obj = std::move(e);
          m->name = attr;
          m->args = call_args();
          e = std::move(m);
        } else {
          auto g = std::make_unique<GetAttr>();
          g->obj = std::move(e);
          g->attr = attr;
          e = std::move(g);
        }
      } else if (is_op("[")) {
        ++p_;
        ExprP a, b, s;
        bool slice = false;
        if (!is_op(":")) a = expr();
        if (is_op(":")) {
          slice = true;
          ++p_;
          if (!is_op(":") && !is_op("]")) b = expr();
          if (is_op(":")) {
            ++p_;
            if (!is_op("]")) s = expr();
          }
        }
        expect_op("]");
        if (slice) {
          auto sl = std::make_unique<Slice>();
          sl->obj = std::move(e);
          sl->a = std::move(a);
          sl->b = std::move(b);
          sl->s = std::move(s);
          e = std::move(sl);
        } else {
          auto g = std::make_unique<GetItem>();
          g->obj = std::move(e);
          g->key = std::move(a);
          e = std::move(g);
        }
      } else if (is_op("(")) {
        syn_fail("unsupported construct: call of a non-builtin value");
      } else {
        return e;
      }
    }
  }
  ExprP filters(ExprP e) {
    while (true) {
      if (is_op("|")) {
        ++p_;
        std::string name = expect_name();
        if (!kFilters.count(name)) syn_fail("unsupported filter '" + name + "'");
        auto f = std::make_unique<FilterE>();
        f->e = std::move(e);
        f->name = name;
        if (is_op("(")) {
          ++p_;
          f->args = call_args();
        }
        e = std::move(f);
      } else if (is_name("is")) {
        ++p_;
        auto t = std::make_unique<TestE>();
        if (is_name("not")) {
          ++p_;
          t->negate = true;
        }
        std::string name = expect_name();
        if (!kTests.count(name)) syn_fail("unsupported test '" + name + "'");
        t->name = name;
        if (is_op("(")) {
          ++p_;
          t->args = call_args();
        } else if (name == "eq" || name == "equalto" || name == "ne" || name == "in") {
          t->args.pos.push_back(math1());
        }
        t->e = std::move(e);
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

 private:
  std::vector<Tok> t_;
  size_t p_ = 0;
};

struct Segment {
  enum K { Text, Out, Stmt } k;
  std::string text;
  std::vector<Tok> toks;
};

std::vector<Segment> split_source(std::string src) {
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

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Segment> s) : segs_(std::move(s)) {}

  Body parse_all() {
    std::string stop;
    Body b = parse_body({}, stop);
    if (!stop.empty()) syn_fail("unexpected '{% " + stop + " %}'");
    return b;
  }

 private:
  // Parses until a statement whose keyword is in `ends`; returns its name in `stop`
  // and leaves the parser positioned after it (its parser in cur_).
  Body parse_body(const std::set<std::string>& ends, std::string& stop) {
    Body body;
    while (i_ < segs_.size()) {
      Segment& s = segs_[i_++];
      if (s.k == Segment::Text) {
        auto t = std::make_unique<TextN>();
        t->text = s.text;
        body.push_back(std::move(t));
        continue;
      }
      ExprParser p(s.toks);
      if (s.k == Segment::Out) {
        auto o = std::make_unique<OutN>();
        o->e = p.expr();
        p.expect_end();
        body.push_back(std::move(o));
        continue;
      }
      if (p.peek().t != Tok::Name) syn_fail("expected a statement name in {% %}");
      std::string kw = p.next().s;
      if (ends.count(kw)) {
        stop = kw;
        cur_ = std::make_unique<ExprParser>(std::move(p));
        return body;
      }
      if (kw == "if") {
        auto n = std::make_unique<IfN>();
        ExprP cond = p.expr();
        p.expect_end();
        while (true) {
          std::string st;
          Body b = parse_body({"elif", "else", "endif"}, st);
          if (st.empty()) syn_fail("missing {% endif %}");
          n->branches.emplace_back(std::move(cond), std::move(b));
          if (st == "endif") {
            cur_->expect_end();
            break;
          }
          if (st == "elif") {
            cond = cur_->expr();
            cur_->expect_end();
          } else {
            cur_->expect_end();
            cond = nullptr;
            std::string st2;
            Body eb = parse_body({"endif"}, st2);
            if (st2.empty()) syn_fail("missing {% endif %}");
            cur_->expect_end();
            n->branches.emplace_back(nullptr, std::move(eb));
            break;
          }
        }
        body.push_back(std::move(n));
      } else if (kw == "for") {
        auto n = std::make_unique<ForN>();
        n->vars.push_back(p.expect_name());
        while (p.is_op(",")) {
          p.next();
          n->vars.push_back(p.expect_name());
        }
        if (!p.is_name("in")) syn_fail("expected 'in' in for statement");
        p.next();
        n->iter = p.or_expr();
        if (p.is_name("if")) {
          p.next();
          n->filter = p.or_expr();
        }
        if (p.is_name("recursive")) syn_fail("unsupported construct: recursive for loop");
        p.expect_end();
        ++loop_depth_;
        std::string st;
        n->body = parse_body({"else", "endfor"}, st);
        if (st.empty()) syn_fail("missing {% endfor %}");
        cur_->expect_end();
        if (st == "else") {
          --loop_depth_;
          n->else_body = parse_body({"endfor"}, st);
          if (st.empty()) syn_fail("missing {% endfor %}");
          cur_->expect_end();
          ++loop_depth_;
        }
        --loop_depth_;
        body.push_back(std::move(n));
      } else if (kw == "set") {
        auto n = std::make_unique<SetN>();
        n->name = p.expect_name();
        if (p.is_op(".")) {
          p.next();
          n->attr = p.expect_name();
        }
        if (p.is_op(",")) syn_fail("unsupported construct: tuple assignment in set");
        if (p.is_op("=")) {
          p.next();
          n->e = p.expr();
          p.expect_end();
        } else {
          if (p.is_op("|")) syn_fail("unsupported construct: filtered block set");
          p.expect_end();
          std::string st;
          n->body = parse_body({"endset"}, st);
          if (st.empty()) syn_fail("missing {% endset %}");
          cur_->expect_end();
        }
        body.push_back(std::move(n));
      } else if (kw == "break" || kw == "continue") {
        if (loop_depth_ == 0) syn_fail("'" + kw + "' outside of a loop");
        p.expect_end();
        if (kw == "break") body.push_back(std::make_unique<BreakN>());
        else body.push_back(std::make_unique<ContinueN>());
      } else {
        if (kw == "elif" || kw == "else" || kw.rfind("end", 0) == 0) syn_fail("unexpected '{% " + kw + " %}'");
        syn_fail("unsupported construct '{% " + kw + " %}'");
      }
    }
    stop.clear();
    return body;
  }

  std::vector<Segment> segs_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  std::unique_ptr<ExprParser> cur_;
};

}  // namespace

struct Template::Impl {
  Body body;
};

Template::Template(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Template::~Template() = default;

std::shared_ptr<const Template> Template::parse(const std::string& source) {
  auto impl = std::make_unique<Impl>();
  TemplateParser p(split_source(source));
  impl->body = p.parse_all();
  return std::make_shared<const Template>(std::move(impl));
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  Context c;
  c.frames.emplace_back();
  if (context.is_object())
    for (auto& [k, v] : context.items()) c.frames.back()[k] = Value::of(v);
  c.frames.emplace_back();
  std::string out;
  try {
    render_body(impl_->body, c, out);
  } catch (const BreakSignal&) {
  } catch (const ContinueSignal&) {
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("chat template: ") + e.what());
  }
  return out;
}

std::string Template::render(const nlohmann::json& context) const {
  return render(nlohmann::ordered_json::parse(context.dump()));
}

}  // namespace sala::jinja
