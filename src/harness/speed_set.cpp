#include "harness/speed_set.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sala::harness {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256**: fully specified, so sets are identical on every platform and compiler.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& v : s_) v = splitmix64(seed);
  }
  uint64_t next() {
    uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }  // bias negligible for small n
  double log_uniform(double lo, double hi) { return std::exp(std::log(lo) + uniform() * (std::log(hi) - std::log(lo))); }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

const char* const kWords[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had",
    "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if",
    "more", "when", "will", "would", "who", "so", "no", "report", "system", "river", "market",
    "energy", "signal", "protein", "contract", "village", "engine", "theory", "harbor", "ledger",
    "committee", "measurement", "winter", "bridge", "language", "memory", "network", "pressure",
    "history", "museum", "climate", "orchard", "circuit", "library", "invoice", "mountain", "sensor",
    "archive", "formula", "festival", "garden", "crystal", "velocity", "council", "shipment", "poem",
    "record", "balance", "station", "journey", "average", "pattern", "question", "evidence", "window",
    "process", "method", "result", "student", "teacher", "doctor", "patient", "season", "country",
    "capital", "island", "forest", "desert", "ocean", "planet", "galaxy", "number", "letter", "chapter",
    "figure", "table", "column", "sample", "experiment", "variable", "function", "structure", "policy",
    "budget", "revenue", "quarter", "schedule", "meeting", "decision", "agreement", "purpose", "reason",
    "describe", "explain", "compare", "measure", "observe", "collect", "increase", "reduce", "improve",
    "discover", "announce", "travel", "borrow", "deliver", "consider", "remember", "suggest", "follow",
    "include", "require", "produce", "maintain", "quickly", "slowly", "carefully", "nearly", "rarely",
    "often", "finally", "however", "therefore", "meanwhile", "although", "because", "during", "between",
    "against", "without", "within", "across", "ancient", "modern", "bright", "narrow", "heavy", "quiet",
    "careful", "curious", "simple", "complex", "early", "late", "northern", "southern", "central",
    "local", "global", "public", "private", "green", "silver", "golden", "wooden", "electric", "red"};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

const char* const kSyll[] = {"ka", "lo", "mi", "ren", "ta", "vor", "sel", "qui", "dan", "phe", "zu",
                             "bri", "ost", "mar", "ne", "lux", "tor", "hal", "gi", "ev"};

void append_word(std::string& s, Rng& r, bool capital) {
  size_t start = s.size();
  double u = r.uniform();
  if (u < 0.07) {
    // Numbers of 1-6 digits, sometimes decimals or years.
    uint64_t digits = 1 + r.below(6);
    uint64_t v = r.below(static_cast<uint64_t>(std::pow(10.0, static_cast<double>(digits))));
    s += std::to_string(v);
    if (r.uniform() < 0.2) s += "." + std::to_string(r.below(100));
    return;
  }
  if (u < 0.15) {
    uint64_t k = 2 + r.below(3);
    for (uint64_t i = 0; i < k; ++i) s += kSyll[r.below(20)];
  } else {
    s += kWords[r.below(kNumWords)];
  }
  if (capital && s[start] >= 'a' && s[start] <= 'z') s[start] = static_cast<char>(s[start] - 'a' + 'A');
}

// Appends about `words` words of prose.
void append_text(std::string& s, Rng& r, int64_t words) {
  int64_t in_sentence = 0, sentence_len = 6 + static_cast<int64_t>(r.below(14)), sentences = 0;
  for (int64_t i = 0; i < words; ++i) {
    if (in_sentence > 0) s += ' ';
    append_word(s, r, in_sentence == 0);
    ++in_sentence;
    if (in_sentence == sentence_len || i + 1 == words) {
      s += '.';
      in_sentence = 0;
      sentence_len = 6 + static_cast<int64_t>(r.below(14));
      if (++sentences % (3 + r.below(5)) == 0 && i + 1 < words)
        s += "\n\n";
      else if (i + 1 < words)
        s += ' ';
    } else if (r.uniform() < 0.06) {
      s += ',';
    }
  }
}

int64_t scaled(double v, double scale, int64_t floor_v) {
  return std::max<int64_t>(floor_v, static_cast<int64_t>(std::llround(v * scale)));
}

}  // namespace

std::vector<SpeedSetItem> plan_speed_set(const SpeedSetOptions& opt) {
  if (opt.n <= 0) fail("--n must be positive");
  if (!(opt.scale > 0)) fail("--scale must be positive");
  if (opt.long_fraction < 0 || opt.long_fraction > 1) fail("--long-fraction must be in [0, 1]");
  double oscale = opt.output_scale > 0 ? opt.output_scale : opt.scale;
  Rng r(opt.seed);
  auto n_long = static_cast<int64_t>(std::llround(opt.long_fraction * static_cast<double>(opt.n)));
  std::vector<char> is_long(static_cast<size_t>(opt.n), 0);
  for (int64_t i = 0; i < n_long; ++i) is_long[static_cast<size_t>(i)] = 1;
  for (size_t i = is_long.size(); i-- > 1;) std::swap(is_long[i], is_long[r.below(i + 1)]);
  std::vector<SpeedSetItem> items(static_cast<size_t>(opt.n));
  for (size_t i = 0; i < items.size(); ++i) {
    auto& it = items[i];
    it.is_long = is_long[i] != 0;
    double p = it.is_long ? r.log_uniform(static_cast<double>(opt.long_min), static_cast<double>(opt.long_max))
                          : r.log_uniform(static_cast<double>(opt.short_min), static_cast<double>(opt.short_max));
    double o = r.log_uniform(static_cast<double>(opt.output_min), static_cast<double>(opt.output_max));
    it.prompt_tokens_est = scaled(p, opt.scale, 16);
    if (opt.max_prompt_tokens > 0) it.prompt_tokens_est = std::min(it.prompt_tokens_est, opt.max_prompt_tokens);
    it.prompt_tokens_est = std::max<int64_t>(it.prompt_tokens_est, 16);
    it.output_tokens_est = scaled(o, oscale, 4);
  }
  return items;
}

void fill_speed_set_item(SpeedSetItem& it, uint64_t seed, int64_t index) {
  uint64_t s = seed ^ (0x5851f42d4c957f2dull * static_cast<uint64_t>(index + 1));
  Rng r(splitmix64(s));
  // A unique first line so that no two prompts share a prefix.
  std::string q = "Document " + std::to_string(index) + " (reference " + std::to_string(r.next() % 1000000007ull) + ").\n\n";
  int64_t q_words = std::max<int64_t>(
      4, static_cast<int64_t>(std::llround(static_cast<double>(it.prompt_tokens_est) / kTokensPerWord)) - 14);
  q.reserve(static_cast<size_t>(q_words) * 8 + 128);
  append_text(q, r, q_words);
  q += "\n\nQuestion: what does the document say about the ";
  append_word(q, r, false);
  q += "? Answer in detail.";
  it.question = std::move(q);
  int64_t a_words = std::max<int64_t>(
      1, static_cast<int64_t>(std::llround(static_cast<double>(it.output_tokens_est) / kTokensPerWord)));
  std::string a;
  a.reserve(static_cast<size_t>(a_words) * 8);
  append_text(a, r, a_words);
  it.model_response = std::move(a);
}

SpeedSetStats write_speed_set(std::ostream& os, const SpeedSetOptions& opt) {
  auto items = plan_speed_set(opt);
  SpeedSetStats st;
  st.prompt_min = st.output_min = INT64_MAX;
  for (size_t i = 0; i < items.size(); ++i) {
    auto& it = items[i];
    fill_speed_set_item(it, opt.seed, static_cast<int64_t>(i));
    nlohmann::ordered_json j;
    j["question"] = it.question;
    j["model_response"] = it.model_response;
    j["output_tokens_est"] = it.output_tokens_est;
    j["prompt_tokens_est"] = it.prompt_tokens_est;
    std::string line = j.dump();
    line += '\n';
    os << line;
    st.bytes += line.size();
    ++st.n;
    st.n_long += it.is_long;
    st.prompt_tokens_total += it.prompt_tokens_est;
    st.output_tokens_total += it.output_tokens_est;
    st.prompt_min = std::min(st.prompt_min, it.prompt_tokens_est);
    st.prompt_max = std::max(st.prompt_max, it.prompt_tokens_est);
    st.output_min = std::min(st.output_min, it.output_tokens_est);
    st.output_max = std::max(st.output_max, it.output_tokens_est);
    it.question.clear();
    it.question.shrink_to_fit();
    it.model_response.clear();
    it.model_response.shrink_to_fit();
  }
  if (!os) fail("write error while writing the speed set");
  return st;
}

}  // namespace sala::harness
