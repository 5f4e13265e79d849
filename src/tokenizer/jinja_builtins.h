// Filters, tests and string/dict methods (internal to the Jinja interpreter; see jinja.h).
#pragma once

#include "tokenizer/jinja_value.h"

namespace sala::jinja::detail {

inline std::string need_str(const Value* v, const char* what) {
  if (!v || !v->is_json() || !v->j().is_string()) rt_fail(std::string(what) + " expects a string argument");
  return v->j().get<std::string>();
}
inline std::optional<std::string> opt_str(const Value* v, const char* what) {
  if (!v || (v->is_json() && v->j().is_null())) return std::nullopt;
  return need_str(v, what);
}
inline int64_t opt_int(const Value* v, int64_t dflt) {
  if (!v || (v->is_json() && v->j().is_null())) return dflt;
  if (!v->is_json() || !is_int(v->j())) rt_fail("expected an integer argument");
  return as_int(v->j());
}

inline const std::set<std::string> kFilters = {"trim", "length", "count", "tojson", "upper", "lower", "default", "d",
                                        "first", "last", "join", "replace", "string", "list", "int", "float",
                                        "abs", "capitalize", "items", "reverse"};
inline const std::set<std::string> kTests = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                      "boolean", "true", "false", "mapping", "iterable", "sequence", "odd",
                                      "even", "eq", "equalto", "ne", "in"};
inline const std::set<std::string> kMethods = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split",
                                        "replace", "upper", "lower", "items", "keys", "values", "get",
                                        "title", "capitalize"};
inline const std::set<std::string> kFunctions = {"namespace", "raise_exception", "range"};

inline Value apply_filter(const std::string& f, const Value& v, const Args& a) {
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
    if (v.is_json() && is_num(v.j())) {
      if (std::isnan(as_num(v.j()))) return Value::of(opt_int(a.get(0, "default"), 0));  // jinja2: ValueError
      return Value::of(as_int(v.j()));
    }
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

inline bool apply_test(const std::string& t, const Value& v, const Args& a) {
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

inline Value call_method(const Value& obj, const std::string& m, const Args& a) {
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


}  // namespace sala::jinja::detail
