#include "grammar/grammar.h"

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <xgrammar/xgrammar.h>

#include <algorithm>

#include "core/check.h"

namespace sala::grammar {

struct CompiledGrammar {
  xgrammar::CompiledGrammar compiled;
  int32_t vocab_size;
  std::vector<int32_t> stop_ids;
};

namespace {

const char* kind_name(GrammarSpec::Kind k) {
  switch (k) {
    case GrammarSpec::Kind::JsonSchema: return "JSON schema";
    case GrammarSpec::Kind::JsonObject: return "JSON object";
    case GrammarSpec::Kind::Regex: return "regular expression";
    case GrammarSpec::Kind::Ebnf: return "EBNF grammar";
    case GrammarSpec::Kind::StructuralTag: return "structural tag";
  }
  return "grammar";
}

// xgrammar's messages start with "[hh:mm:ss] path/file.cc:line: " (its logging macro): the
// user gets the reason alone.
std::string user_message(std::string m) {
  if (!m.empty() && m[0] == '[') {
    const size_t close = m.find("] ");
    const size_t colon = close == std::string::npos ? close : m.find(": ", close + 2);
    if (colon != std::string::npos && m.find(".cc:", close) < colon) m.erase(0, colon + 2);
  }
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

std::string cache_key(const GrammarSpec& s) {
  return fmt::format("{}:{}", int(s.kind), s.text);
}

// A one-row int32 DLTensor over a bitmask buffer (xgrammar's mask type).
DLTensor mask_tensor(uint32_t* mask, int64_t* shape) {
  DLTensor t{};
  t.data = mask;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = shape;
  return t;
}

}  // namespace

struct GrammarCompiler::Impl {
  VocabInfo vocab;
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  size_t max_cached;
  mutable std::mutex mu;
  // LRU: most recent first; the map points into the list.
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru;
  std::unordered_map<std::string, decltype(lru)::iterator> by_key;
  int64_t compilations = 0;

  Impl(const VocabInfo& v, size_t max)
      : vocab(v),
        info(v.token_bytes, xgrammar::VocabType::RAW, v.vocab_size, v.stop_ids, false),
        // Our own cache (below) keys by the request's text; xgrammar's is off so that a
        // grammar is not kept twice. Compilation uses the calling thread plus xgrammar's pool.
        compiler(info, /*max_threads=*/2, /*cache_enabled=*/false),
        max_cached(std::max<size_t>(max, 1)) {}

  xgrammar::CompiledGrammar build(const GrammarSpec& s) {
    switch (s.kind) {
      case GrammarSpec::Kind::JsonSchema:
        // Compact JSON (no free whitespace: a model cannot wander off into spaces, so every
        // output ends), strict: no properties beyond the schema's unless it allows them.
        return compiler.CompileJSONSchema(s.text, /*any_whitespace=*/false, std::nullopt,
                                          std::nullopt, /*strict_mode=*/true);
      case GrammarSpec::Kind::JsonObject:
        return compiler.CompileJSONSchema(R"({"type": "object"})", false, std::nullopt,
                                          std::nullopt, true);
      case GrammarSpec::Kind::Regex: return compiler.CompileRegex(s.text);
      case GrammarSpec::Kind::Ebnf: return compiler.CompileGrammar(s.text, "root");
      case GrammarSpec::Kind::StructuralTag: return compiler.CompileStructuralTag(s.text);
    }
    SALA_CHECK(false, "unknown grammar kind");
  }
};

GrammarCompiler::GrammarCompiler(const VocabInfo& vocab, size_t max_cached) {
  SALA_CHECK(vocab.vocab_size >= int32_t(vocab.token_bytes.size()) && vocab.vocab_size > 0,
             "grammar vocabulary: {} tokens, logits width {}", vocab.token_bytes.size(),
             vocab.vocab_size);
  impl_ = std::make_unique<Impl>(vocab, max_cached);
}

GrammarCompiler::~GrammarCompiler() = default;

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
  const std::string key = cache_key(spec);
  {
    std::lock_guard lk(impl_->mu);
    if (auto it = impl_->by_key.find(key); it != impl_->by_key.end()) {
      impl_->lru.splice(impl_->lru.begin(), impl_->lru, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: a slow schema does not hold up other requests' lookups (two
  // threads compiling the same text both succeed; the second insert wins).
  std::shared_ptr<CompiledGrammar> g;
  try {
    g = std::make_shared<CompiledGrammar>(CompiledGrammar{impl_->build(spec), impl_->vocab.vocab_size,
                                                          impl_->vocab.stop_ids});
  } catch (const std::exception& e) {  // xgrammar reports every invalid input by exception
    throw GrammarError(fmt::format("invalid {}: {}", kind_name(spec.kind), user_message(e.what())));
  }
  std::lock_guard lk(impl_->mu);
  ++impl_->compilations;
  if (auto it = impl_->by_key.find(key); it != impl_->by_key.end()) {
    impl_->lru.erase(it->second);
    impl_->by_key.erase(it);
  }
  impl_->lru.emplace_front(key, g);
  impl_->by_key[key] = impl_->lru.begin();
  while (impl_->lru.size() > impl_->max_cached) {
    impl_->by_key.erase(impl_->lru.back().first);
    impl_->lru.pop_back();
  }
  return g;
}

int64_t GrammarCompiler::compilations() const {
  std::lock_guard lk(impl_->mu);
  return impl_->compilations;
}

const VocabInfo& GrammarCompiler::vocab() const { return impl_->vocab; }

struct GrammarMatcher::Impl {
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher matcher;
  explicit Impl(std::shared_ptr<const CompiledGrammar> g)
      : grammar(std::move(g)), matcher(grammar->compiled) {}
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) {
  SALA_CHECK(grammar != nullptr);
  impl_ = std::make_unique<Impl>(std::move(grammar));
}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

int32_t GrammarMatcher::vocab_size() const { return impl_->grammar->vocab_size; }

void GrammarMatcher::fill_next_mask(uint32_t* mask) {
  int64_t shape[1] = {mask_words(vocab_size())};
  DLTensor t = mask_tensor(mask, shape);
  // Returns false when every token is allowed; the mask is filled either way.
  impl_->matcher.FillNextTokenBitmask(&t, 0);
}

bool GrammarMatcher::accept(int32_t token) {
  if (token < 0 || token >= vocab_size()) return false;
  return impl_->matcher.AcceptToken(token);
}

void GrammarMatcher::rollback(int n) { impl_->matcher.Rollback(n); }

bool GrammarMatcher::is_completed() const { return impl_->matcher.IsCompleted(); }

bool GrammarMatcher::is_terminated() const { return impl_->matcher.IsTerminated(); }

bool GrammarMatcher::only_stop_allowed(const uint32_t* mask) const {
  const int32_t words = mask_words(vocab_size());
  const auto& stops = impl_->grammar->stop_ids;
  for (int32_t w = 0; w < words; ++w) {
    uint32_t bits = mask[w];
    if (!bits) continue;
    for (int32_t id : stops)
      if (id / 32 == w) bits &= ~(1u << (id % 32));
    if (bits) return false;
  }
  return true;
}

}  // namespace sala::grammar
