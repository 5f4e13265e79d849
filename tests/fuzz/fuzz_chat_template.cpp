// libFuzzer harness: chat templates. The template text comes from the model directory
// (chat_template.jinja / tokenizer_config.json), so any text must either load (known ChatML or
// the Jinja-subset interpreter, jinja.h) or be refused with a sala::Error; a loaded template
// is rendered on a fixed conversation with and without the generation prompt, with the
// kwargs a request can pass (chat_template_kwargs), and cut for continue_final_message.
// Messages and kwargs from requests are fuzzed through the bundled template by fuzz_protocol.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace sala;

namespace {
const Tokenizer& tok() {
  static std::unique_ptr<Tokenizer> t = Tokenizer::load(fuzz::tiny_model_dir());
  return *t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "Which is larger, 3 or 5?"}, {"assistant", "5"}, {"user", "Why?"}};
  const nlohmann::json kwargs = {{"enable_thinking", false}, {"tools", nullptr}, {"n", 3}};
  fuzz::expect_clear_error([&] {
    auto t = ChatTemplate::from_text(text, tok(), "fuzz");
    for (bool gen : {true, false}) {
      (void)t->render(msgs, gen);
      const std::string r = t->render(msgs, gen, kwargs);
      (void)cut_after_final_message(r, msgs.back().content);
    }
  });
  return 0;
}
