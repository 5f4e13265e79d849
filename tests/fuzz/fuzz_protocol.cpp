// libFuzzer harness: HTTP request bodies through the server's parser (protocol*.cpp), as the
// routes run it: parse_body, then the route's parse_* with the limits of a running server; a
// chat request is also rendered through the bundled model's chat template and tokenized, as
// handle_chat does. The first input byte picks the route, the rest is the body.
// Expected outcomes: success, ApiError (the 4xx the client gets) or sala::Error.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_common.h"
#include "server/protocol.h"
#include "server/routes_extra.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace sala;
using namespace sala::server;

namespace {
struct TinyModel {
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(fuzz::tiny_model_dir());
  std::unique_ptr<ChatTemplate> tmpl = ChatTemplate::load(fuzz::tiny_model_dir(), *tok);
};
const TinyModel& model() {
  static TinyModel m;
  return m;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const TinyModel& m = model();
  const int route = data[0] % 3;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  // The tiny model's limits (sala serve's defaults on it).
  ProtocolLimits lim;
  lim.max_context_len = 4096;
  lim.vocab_size = m.tok->vocab_size();
  fuzz::expect_clear_error([&] {
    try {
      const json j = parse_body(body);
      if (route == 0) {
        GenerateRequest g = parse_generate(j, lim);
        for (auto& p : g.prompts)
          if (p.text) (void)m.tok->encode(*p.text, true);
      } else if (route == 1) {
        ChatRequest c = parse_chat(j, lim);
        (void)m.tok->encode(server::detail::chat_prompt_text(c, m.tmpl.get()), c.add_special_tokens);
        (void)server::detail::chat_echo_text(c);
      } else {
        CompletionRequest c = parse_completion(j, lim);
        for (auto& p : c.prompts)
          if (p.text) (void)m.tok->encode(*p.text, true);
      }
    } catch (const ApiError&) {
    }
  });
  return 0;
}
