#include "tokenizer/jinja.h"

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace sala::jinja {
namespace {

using namespace detail;

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
