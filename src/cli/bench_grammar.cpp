#include "cli/bench_grammar.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/error.h"
#include "engine/request_grammar.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace sala::cli {

namespace {
constexpr size_t kKeptOutputs = 8;

// Pads v.token_bytes to v.vocab_size with distinct concatenations of two of its non-empty tokens.
void widen_vocabulary(grammar::VocabInfo& v) {
  std::vector<std::string> base;
  for (const std::string& b : v.token_bytes)
    if (!b.empty()) base.push_back(b);
  std::set<std::string> seen(v.token_bytes.begin(), v.token_bytes.end());
  for (size_t i = 0; i < base.size() && int32_t(v.token_bytes.size()) < v.vocab_size; ++i)
    for (size_t j = 0; j < base.size() && int32_t(v.token_bytes.size()) < v.vocab_size; ++j)
      if (seen.insert(base[i] + base[j]).second) v.token_bytes.push_back(base[i] + base[j]);
  if (int32_t(v.token_bytes.size()) < v.vocab_size)
    fail("--decode-grammar: cannot make {} distinct tokens from {} tokenizer tokens", v.vocab_size, base.size());
  for (int32_t id : v.stop_ids) v.token_bytes[size_t(id)].clear();  // stop tokens add no text
}
}  // namespace

DecodeGrammar::DecodeGrammar(const std::string& what, const std::string& tokenizer_dir, const ModelConfig& cfg) {
  grammar::GrammarSpec spec;
  if (what == "json") {
    spec.kind = grammar::GrammarSpec::Kind::JsonObject;
    label_ = "json_object";
  } else {
    std::ifstream f(what);
    if (!f) fail("--decode-grammar: '{}' is neither 'json' nor a readable JSON-schema file", what);
    std::stringstream ss;
    ss << f.rdbuf();
    spec.kind = grammar::GrammarSpec::Kind::JsonSchema;
    spec.text = ss.str();
    label_ = "schema " + what.substr(what.find_last_of('/') + 1);
  }
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = Tokenizer::load(tokenizer_dir);
  } catch (const Error& e) {
    fail("--decode-grammar needs a tokenizer ({}); a checkpoint without one (sala make-random): "
         "give --grammar-tokenizer DIR, e.g. models/sala-tiny-chat", e.what());
  }
  std::vector<int32_t> eos(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  grammar::VocabInfo v = server::grammar_vocab(*tok, cfg.vocab_size, eos);
  vocab_note_ = fmt::format("{}'s {} tokens", tokenizer_dir, tok->vocab_size());
  if (int64_t(tok->vocab_size()) * 2 < cfg.vocab_size) {
    const size_t own = v.token_bytes.size();
    widen_vocabulary(v);
    vocab_note_ += fmt::format(" + {} synthetic pair tokens", v.token_bytes.size() - own);
  }
  bytes_ = v.token_bytes;
  bytes_.resize(size_t(cfg.vocab_size));
  compiler_ = std::make_unique<grammar::GrammarCompiler>(v);
  try {
    compiled_ = compiler_->compile(spec);
  } catch (const grammar::GrammarError& e) {
    fail("--decode-grammar {}: {}", what, e.what());
  }
}

DecodeGrammar::~DecodeGrammar() = default;

DecodeGrammar::Run DecodeGrammar::run(Model& model, int B, int steps, const std::vector<int32_t>& prompt,
                                      int64_t prompt_len,
                                      const std::function<std::vector<int32_t>(int)>& pages_of,
                                      bool constrained) const {
  using Clock = std::chrono::steady_clock;
  Run r;
  const size_t nb = static_cast<size_t>(B);
  std::vector<std::unique_ptr<RequestGrammar>> g(nb);
  std::vector<std::string> text(nb);
  std::vector<int32_t> next(nb), one;
  std::vector<float> logits;
  LogitMasks masks;
  // One sampled token of sequence b: its text, its matcher; a completed output is kept and a
  // fresh matcher starts (returned true: the caller restarts it outside the timed part).
  auto advance = [&](int b, int32_t t) {
    const RequestGrammar::Next n = g[size_t(b)]->accept(t);
    SALA_CHECK(n != RequestGrammar::Next::Refused, "grammar refused token {} under its own mask", t);
    text[size_t(b)] += bytes_[size_t(t)];
    return n == RequestGrammar::Next::Complete;
  };
  auto restart = [&](int b) {
    ++r.completed;
    if (r.outputs.size() < kKeptOutputs) r.outputs.push_back(text[size_t(b)]);
    text[size_t(b)].clear();
    g[size_t(b)] = std::make_unique<RequestGrammar>(compiled_);
  };
  auto fill_masks = [&](int b0, int b1) {  // sequences [b0, b1) as logit rows 0, 1, ..
    masks.clear();
    if (!constrained) return;
    masks.words = g[size_t(b0)]->words();
    for (int b = b0; b < b1; ++b) {
      masks.rows.push_back(b - b0);
      masks.bits.insert(masks.bits.end(), g[size_t(b)]->mask(), g[size_t(b)]->mask() + masks.words);
    }
  };
  for (int b = 0; b < B; ++b) {  // prefill each sequence alone; its first token under the mask
    if (constrained) g[size_t(b)] = std::make_unique<RequestGrammar>(compiled_);
    // Sequence b's prompt: BOS, then the bench's ids from b + 1 on, so that the sequences'
    // outputs (and their matchers' states) differ, as different requests' would.
    SALA_CHECK(int64_t(prompt.size()) >= prompt_len + b, "prompt of {} ids", prompt.size());
    std::vector<int32_t> p{prompt[0]};
    p.insert(p.end(), prompt.begin() + 1 + b, prompt.begin() + prompt_len + b);
    StepMeta m;
    m.add_seq(p.data(), int32_t(prompt_len), 0, b, pages_of(b), false, true);
    fill_masks(b, b + 1);
    model.forward(m, logits, nullptr, &one, nullptr, constrained ? &masks : nullptr);
    next[size_t(b)] = one.at(0);
    if (constrained && advance(b, next[size_t(b)])) restart(b);
  }
  std::vector<int> done;
  for (int s = 0; s < steps; ++s) {
    StepMeta m;
    for (int b = 0; b < B; ++b) m.add_seq(&next[size_t(b)], 1, prompt_len + s, b, pages_of(b), false, true);
    done.clear();
    const auto t0 = Clock::now();
    fill_masks(0, B);
    // mask + argmax on the device
    model.forward(m, logits, nullptr, &next, nullptr, constrained ? &masks : nullptr);
    for (int b = 0; constrained && b < B; ++b)
      if (advance(b, next[size_t(b)])) done.push_back(b);
    r.step_ms.push_back(std::chrono::duration<double>(Clock::now() - t0).count() * 1e3);
    for (int b : done) restart(b);
  }
  r.unfinished = text[0];
  return r;
}

DecodeGrammar::Comparison DecodeGrammar::compare(
    Model& model, int B, int steps, const std::vector<int32_t>& prompt, int64_t prompt_len,
    const std::function<std::vector<int32_t>(int)>& pages_of) const {
  auto median = [](std::vector<double> ms) {
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  Comparison c;
  c.plain_ms = median(run(model, B, steps, prompt, prompt_len, pages_of, false).step_ms);
  c.constrained = run(model, B, steps, prompt, prompt_len, pages_of, true);
  c.grammar_ms = median(c.constrained.step_ms);
  return c;
}

}  // namespace sala::cli
