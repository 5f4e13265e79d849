// Expression and statement nodes (evaluation) (internal to the Jinja interpreter; see jinja.h).
#pragma once

#include "tokenizer/jinja_value.h"

namespace sala::jinja::detail {

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

inline Value get_item(const Value& obj, const Value& key) {
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
    if (is_int(j)) {
      if (as_int(j) == INT64_MIN) rt_fail("integer overflow (past 64 bits)");
      return Value::of(-as_int(j));
    }
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
        // Python would build any size; a template must not take the process's memory.
        const size_t unit = x.is_string() ? x.get_ref<const std::string&>().size() : x.size();
        if (as_int(y) > 0 && unit > 0 && uint64_t(as_int(y)) > kMaxRepeat / unit)
          rt_fail("sequence repetition too large");
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
      int64_t p = as_int(x), q = as_int(y), out = 0;
      // Python ints are unbounded; ours are 64-bit: overflow is refused, never wrapped (UB).
      if (op == "+" || op == "-" || op == "*") {
        const bool ovf = op == "+"   ? __builtin_add_overflow(p, q, &out)
                         : op == "-" ? __builtin_sub_overflow(p, q, &out)
                                     : __builtin_mul_overflow(p, q, &out);
        if (ovf) rt_fail("integer overflow (past 64 bits) in " + op);
        return Value::of(out);
      }
      if (q == 0) rt_fail("division by zero");
      if (p == INT64_MIN && q == -1) rt_fail("integer overflow (past 64 bits) in " + op);
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


}  // namespace sala::jinja::detail

#include "tokenizer/jinja_builtins.h"

namespace sala::jinja::detail {

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
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        r.push_back(i);
        if (r.size() > 1000000) rt_fail("range() too large");
        if (__builtin_add_overflow(i, step, &i)) break;  // past 64 bits: past stop too
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

inline void render_body(const Body& b, Context& c, std::string& out) {
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


}  // namespace sala::jinja::detail
