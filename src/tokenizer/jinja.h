// A small Jinja2-subset interpreter for chat templates that are not one of the natively
// rendered ChatML templates (see chat_template.h). It renders like transformers'
// apply_chat_template: jinja2 with trim_blocks=True, lstrip_blocks=True, loop controls,
// the transformers tojson filter and raise_exception().
//
// Supported: {{ }}, {% %}, {# #}, '-' / '+' whitespace control; for (loop.*, else,
// break/continue, unpacking of pairs), if/elif/else, set (names, namespace attributes,
// block set); literals, lists, dicts, attribute/subscript/slice access, arithmetic,
// ~, comparisons, in / not in, and/or/not, inline if/else, tests (defined, none, string,
// ...), a set of filters and string/dict methods, namespace(), range(), raise_exception().
// Everything else (macros, call blocks, includes, unknown filters/tests/methods/functions)
// is refused by parse() with a sala::Error naming the construct.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace sala::jinja {

class Template {
 public:
  // Throws sala::Error for syntax errors and unsupported constructs.
  static std::shared_ptr<const Template> parse(const std::string& source);
  // `context` is an object of global variables. Throws sala::Error on render errors
  // (including raise_exception()).
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::json& context) const;

  struct Impl;
  explicit Template(std::unique_ptr<Impl> impl);
  ~Template();

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sala::jinja
