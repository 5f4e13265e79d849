// libFuzzer harness: the bundled model's tokenizer (models/sala-tiny-chat/tokenizer.json) on
// arbitrary bytes, and the decoders on arbitrary ids.
//   * encode(text) with and without special tokens (invalid UTF-8 included: encode replaces
//     it, tokenizer.h); decode of the result gives valid UTF-8.
//   * the same bytes read as token ids (out-of-vocabulary and negative ids included: a client
//     sends input_ids, and the engine's sampler only emits ids < vocab_size): decode and the
//     streaming IncrementalDetokenizer, whose concatenated output must equal decode (its
//     documented contract, detokenizer.h).
//   * StopStringMatcher over the decoded text split at fuzzed points with fuzzed stop strings.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

using namespace sala;

namespace {
const Tokenizer& tok() {
  static std::unique_ptr<Tokenizer> t = Tokenizer::load(fuzz::tiny_model_dir());
  return *t;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& t = tok();
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clear_error([&] {
    for (bool special : {true, false}) {
      const std::vector<int32_t> ids = t.encode(text, special);
      for (int32_t id : ids)
        if (id < 0 || id >= t.vocab_size()) fuzz::finding("encode gave an id outside the vocabulary", text);
      if (!valid_utf8(t.decode(ids, !special))) fuzz::finding("decode gave invalid UTF-8", text);
    }
    // The bytes as ids: 2 bytes per id, spread over [-64, vocab + 64) so both in- and
    // out-of-vocabulary ids occur.
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < size; i += 2) {
      uint16_t v;
      std::memcpy(&v, data + i, 2);
      ids.push_back(int32_t(v % uint32_t(t.vocab_size() + 128)) - 64);
    }
    for (bool skip : {true, false}) {
      const std::string whole = t.decode(ids, skip);
      // The engine only streams ids it sampled, i.e. in the vocabulary.
      std::vector<int32_t> in_vocab;
      for (int32_t id : ids)
        if (id >= 0 && id < t.vocab_size()) in_vocab.push_back(id);
      IncrementalDetokenizer d(t, skip);
      std::string streamed;
      for (int32_t id : in_vocab) streamed += d.push(id);
      streamed += d.flush();
      if (streamed != t.decode(in_vocab, skip))
        fuzz::finding("streamed detokenization differs from decode", whole);
      // Stop strings: two fuzzed stops cut from the decoded text itself.
      std::vector<std::string> stops;
      if (whole.size() >= 4) stops = {whole.substr(whole.size() / 3, 2), whole.substr(whole.size() / 2, 3)};
      StopStringMatcher sm(stops);
      std::string out;
      size_t pos = 0, step = 1;
      while (pos < whole.size() && !sm.stopped()) {
        auto r = sm.push(std::string_view(whole).substr(pos, step));
        out += r.emit;
        pos += step;
        step = step % 7 + 1;
      }
      if (!sm.stopped()) out += sm.flush();
      if (whole.compare(0, out.size(), out) != 0)
        fuzz::finding("stop-string output is not a prefix of the text", whole);
    }
  });
  return 0;
}
