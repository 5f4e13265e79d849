// Chat templates that the fuzzer (tests/fuzz/fuzz_chat_template) found to end the process or
// hit undefined behaviour: each must now load and render, or be refused with sala::Error.
// Under the ASan/UBSan build (.ci/run) the old code fails these tests with a sanitizer report;
// in a plain build the stoll case threw std::out_of_range, which is not a sala::Error.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

const sala::Tokenizer& tiny_tok() {
  static std::unique_ptr<sala::Tokenizer> t =
      sala::Tokenizer::load(std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat");
  return *t;
}

std::string render(const std::string& text) {
  auto t = sala::ChatTemplate::from_text(text, tiny_tok(), "test");
  return t->render({{"user", "hi"}}, true);
}

TEST(ChatTemplateHostile, IntegerLiteralPast64BitsIsAClearError) {
  // The fuzzer's input: a 90-digit literal made std::stoll throw std::out_of_range.
  const std::string lit(90, '1');
  EXPECT_THROW(render("{{ " + lit + " }}"), sala::Error);
  EXPECT_EQ(render("{{ 9223372036854775807 }}"), "9223372036854775807");
}

TEST(ChatTemplateHostile, FloatLiteralPastDoubleIsInf) {
  EXPECT_EQ(render("{{ 1e999 > 1 }}"), "True");  // Python: float('1e999') == inf
}

TEST(ChatTemplateHostile, IntegerOverflowIsAClearError) {
  EXPECT_THROW(render("{{ 9223372036854775807 + 1 }}"), sala::Error);
  EXPECT_THROW(render("{{ -9223372036854775807 - 2 }}"), sala::Error);
  EXPECT_THROW(render("{{ 4294967296 * 4294967296 }}"), sala::Error);
  EXPECT_EQ(render("{{ 7 // -2 }} {{ 7 % -2 }} {{ 3 * 4 }}"), "-4 -1 12");
}

TEST(ChatTemplateHostile, FloatToIntOutOfRangeIsAClearError) {
  EXPECT_THROW(render("{{ 1e300|int }}"), sala::Error);
  EXPECT_EQ(render("{{ 3.7|int }} {{ (0.0/1)|int }}"), "3 0");
  EXPECT_THROW(render("{{ 'abc'.replace('a', 'b', 1e300) }}"), sala::Error);
}

TEST(ChatTemplateHostile, HugeRangeAndSliceStepsEnd) {
  EXPECT_EQ(render("{{ range(9223372036854775800, 9223372036854775807, 5)|list }}"),
            "[9223372036854775800, 9223372036854775805]");
  EXPECT_EQ(render("{{ 'abcdef'[1::9223372036854775807] }}"), "b");
  EXPECT_EQ(render("{{ 'abcdef'[-2::-9223372036854775807] }}"), "e");
}

TEST(ChatTemplateHostile, HugeRepetitionIsRefused) {
  EXPECT_THROW(render("{{ 'ab' * 1000000000000 }}"), sala::Error);
  EXPECT_EQ(render("{{ 'ab' * 3 }}"), "ababab");
}

}  // namespace
