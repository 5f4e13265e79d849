// Structured output through the engine on the bundled tiny model (CPU backend): grammars
// compiled from our tokenizer's vocabulary, the mask applied to the logits each step, the
// matcher advanced per token. Outputs must match their grammar (greedy and sampled), end when
// the grammar is complete, and a constrained request must not change an unconstrained one in
// the same steps (masks apply to their own rows only).
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "backend/backend.h"
#include "core/config.h"
#include "core/safetensors.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "model/minicpm_sala.h"
#include "tokenizer/token_bytes.h"
#include "tokenizer/tokenizer.h"

namespace sala {
namespace {

using namespace std::chrono_literals;
using grammar::GrammarSpec;

const std::string kModelDir = std::string(SALA_SOURCE_DIR) + "/models/sala-tiny-chat";

struct Fixture {
  ModelConfig cfg = load_model_config(kModelDir);
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(kModelDir);
  std::unique_ptr<grammar::GrammarCompiler> compiler;
  std::unique_ptr<Engine> engine;
  Fixture() {
    grammar::VocabInfo v;
    v.token_bytes = grammar_token_bytes(*tok);
    v.vocab_size = cfg.vocab_size;
    v.stop_ids.assign(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
    compiler = std::make_unique<grammar::GrammarCompiler>(v);
    static const Checkpoint ckpt(kModelDir);
    ModelLimits lim;
    lim.max_step_tokens = 512;
    lim.max_logit_rows = 8;
    lim.caches.page_size = cfg.sparse.block_size;
    lim.caches.num_pages = 64;
    lim.caches.num_slots = 8;
    auto model = std::make_unique<Model>(cfg, make_backend("cpu", BackendOptions{NumericMode::F32, 0}), ckpt, lim);
    EngineOptions eo;
    eo.max_running_requests = 8;
    eo.chunked_prefill_size = 256;
    engine = make_engine(std::move(model), eo);
  }
  std::shared_ptr<RequestHandle> submit(const std::string& prompt, std::optional<GrammarSpec> spec, float temperature,
                                        uint64_t seed, int32_t max_new = 96) {
    GenerationRequest r;
    r.prompt = tok->encode(prompt, true);
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.max_new_tokens = max_new;
    if (spec) r.grammar = compiler->compile(*spec);
    return engine->submit(std::move(r));
  }
  std::pair<std::string, FinishReason> collect(RequestHandle& h) {
    std::vector<int32_t> ids;
    TokenEvent ev;
    for (;;) {
      if (!h.next(ev, 120s)) {
        ADD_FAILURE() << "timed out";
        return {};
      }
      ids.insert(ids.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) return {tok->decode(ids, true), ev.reason};
    }
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

TEST(GrammarEngine, GreedyAndSampledOutputsMatchTheirGrammar) {
  Fixture& f = fixture();
  const std::string re = "(yes|no)-[0-9]{2}";
  for (uint64_t seed : {0, 1, 2, 3}) {
    auto h = f.submit("Is it?", GrammarSpec{GrammarSpec::Kind::Regex, re}, seed == 0 ? 0.f : 1.f, seed);
    auto [text, reason] = f.collect(*h);
    EXPECT_TRUE(std::regex_match(text, std::regex(re))) << text;
    EXPECT_EQ(reason, FinishReason::GrammarComplete) << text;  // nothing may follow "-NN"
  }
  const GrammarSpec schema{GrammarSpec::Kind::JsonSchema, R"({"type": "object", "properties": {
      "n": {"type": "integer", "minimum": 0, "maximum": 50}, "ok": {"type": "boolean"}}, "required": ["n", "ok"]})"};
  for (uint64_t seed : {0, 5, 6}) {
    auto h = f.submit("JSON please", schema, seed == 0 ? 0.f : 1.f, seed);
    auto [text, reason] = f.collect(*h);
    const auto j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << text;
    EXPECT_TRUE(j["n"].is_number_integer() && j["n"] >= 0 && j["n"] <= 50 && j["ok"].is_boolean()) << text;
    EXPECT_NE(reason, FinishReason::Length) << text;
  }
}

TEST(GrammarEngine, MasksStayOnTheirRows) {
  Fixture& f = fixture();
  auto alone = f.submit("What is 426+750?", std::nullopt, 0.f, 0, 24);
  const auto [free_text, free_reason] = f.collect(*alone);
  // The same request beside constrained ones, admitted together: same steps, other rows masked.
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 3; ++i)
    hs.push_back(f.submit("What is 426+750?", GrammarSpec{GrammarSpec::Kind::Regex, "[a-c]{3}x"}, 0.f, 0, 24));
  auto beside = f.submit("What is 426+750?", std::nullopt, 0.f, 0, 24);
  for (auto& h : hs) {
    auto [text, reason] = f.collect(*h);
    EXPECT_TRUE(std::regex_match(text, std::regex("[a-c]{3}x"))) << text;
  }
  const auto [text, reason] = f.collect(*beside);
  EXPECT_EQ(text, free_text);
  EXPECT_EQ(reason, free_reason);
  EXPECT_FALSE(std::regex_match(free_text, std::regex("[a-c]{3}x")));  // the mask made the difference
}

TEST(GrammarEngine, CpuMaskLogitsSetsDisallowedToMinusInfinity) {
  auto be = make_backend("cpu", BackendOptions{NumericMode::F32, 0});
  Tensor logits = be->alloc(3, 70, DType::F32);
  float* x = static_cast<float*>(logits.data);
  for (int i = 0; i < 3 * 70; ++i) x[i] = float(i);
  const std::vector<int32_t> rows = {2, 0};
  const std::vector<uint32_t> masks = {0x5u, 0u, 0x1u,   // row 2: ids 0, 2, 64
                                       ~0u, ~0u, ~0u};   // row 0: all
  be->mask_logits(logits, rows.data(), 2, masks.data(), 3);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < 70; ++j) {
    EXPECT_EQ(x[j], float(j));         // row 0: untouched
    EXPECT_EQ(x[70 + j], float(70 + j));  // row 1: not listed
    EXPECT_EQ(x[140 + j], (j == 0 || j == 2 || j == 64) ? float(140 + j) : ninf) << j;
  }
}

}  // namespace
}  // namespace sala
