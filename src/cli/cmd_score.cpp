// `sala score`: scores and greedy continuations straight from the model's fp32 logits, without
// the engine, the sampler or Backend::logprobs_rows: the reference that the lm-evaluation-harness
// test (tests/server/test_lm_eval.py) compares the harness' scores through the server with.
//   sala score --model-path DIR --input FILE.jsonl
// One JSON object per input line, one answer line per input line, in order:
//   {"ids": [...], "start": k}          -> {"logprob": sum_{p>=k} log P(ids[p] | ids[:p]),
//                                           "greedy": every ids[p] (p >= k) is its row's argmax}
//   {"ids": [...], "generate": n,       -> {"output_ids": [...]}: greedy (argmax, ties to the
//    "stop_ids": [...]}                     lowest id), at most n tokens, ending after a stop id
// log_softmax is taken here, in double, over the whole logits row [vocab].
// requires: sala_model
#include <fmt/core.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/command.h"
#include "core/config.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/minicpm_sala.h"

namespace {

struct ScoreOpts {
  std::string model_path, input;
  int cpu_threads = 0;
};

constexpr int32_t kRowsPerForward = 64;  // logit rows one forward returns (ModelLimits)
constexpr int32_t kMaxTokens = 4096;     // one sequence: prompt + generated

class Scorer {
 public:
  Scorer(const std::string& dir, int threads)
      : cfg_(sala::load_model_config(dir)), ckpt_(dir) {
    sala::ModelLimits lim;
    lim.max_step_tokens = kMaxTokens;
    lim.max_logit_rows = kRowsPerForward;
    lim.caches.page_size = cfg_.sparse.block_size;
    lim.caches.num_pages = (kMaxTokens + lim.caches.page_size - 1) / lim.caches.page_size;
    lim.caches.num_slots = 1;
    model_ = std::make_unique<sala::Model>(
        cfg_, sala::make_backend("cpu", sala::BackendOptions{sala::NumericMode::F32, threads}), ckpt_, lim);
    pages_.resize(size_t(lim.caches.num_pages));
    for (size_t i = 0; i < pages_.size(); ++i) pages_[i] = int32_t(i);
  }

  // log_softmax rows [rows.size(), vocab] of positions `rows` of a one-shot prefill of `ids`.
  std::vector<std::vector<double>> prompt_rows(const std::vector<int32_t>& ids, const std::vector<int32_t>& rows) {
    std::vector<std::vector<double>> out;
    for (size_t r0 = 0; r0 < rows.size(); r0 += kRowsPerForward) {
      sala::StepMeta meta;
      meta.add_seq(ids.data(), int32_t(ids.size()), 0, 0, pages_, false, false);
      for (size_t r = r0; r < std::min(rows.size(), r0 + kRowsPerForward); ++r) meta.logit_rows.push_back(rows[r]);
      model_->forward(meta, logits_);
      for (size_t i = 0; i < meta.logit_rows.size(); ++i) out.push_back(log_softmax(i));
    }
    return out;
  }

  nlohmann::json score(const std::vector<int32_t>& ids, int64_t start) {
    if (start < 1 || start >= int64_t(ids.size())) sala::fail("score: start {} outside 1..{}", start, ids.size() - 1);
    std::vector<int32_t> rows;
    for (int64_t p = start; p < int64_t(ids.size()); ++p) rows.push_back(int32_t(p - 1));
    const auto lp = prompt_rows(ids, rows);
    double sum = 0;
    bool greedy = true;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int32_t target = ids[size_t(rows[i]) + 1];
      sum += lp[i][size_t(target)];
      greedy = greedy && argmax(lp[i]) == target;
    }
    return {{"logprob", sum}, {"greedy", greedy}};
  }

  nlohmann::json generate(std::vector<int32_t> ids, int32_t n, const std::vector<int32_t>& stop_ids) {
    if (int64_t(ids.size()) + n > kMaxTokens) sala::fail("score: {} + {} tokens exceed {}", ids.size(), n, kMaxTokens);
    std::vector<int32_t> out;
    auto next = prompt_rows(ids, {int32_t(ids.size()) - 1});
    for (int32_t k = 0; k < n; ++k) {
      const int32_t t = argmax(next[0]);
      out.push_back(t);
      if (std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end() || k + 1 == n) break;
      ids.push_back(t);
      sala::StepMeta d;
      d.add_seq(ids.data() + ids.size() - 1, 1, int64_t(ids.size()) - 1, 0, pages_, false, true);
      model_->forward(d, logits_);
      next = {log_softmax(0)};
    }
    return {{"output_ids", out}};
  }

 int32_t vocab() const { return cfg_.vocab_size; }

 private:
  std::vector<double> log_softmax(size_t row) const {
    const int32_t V = cfg_.vocab_size;
    const float* x = logits_.data() + row * size_t(V);
    const double mx = *std::max_element(x, x + V);
    double sum = 0;
    for (int32_t j = 0; j < V; ++j) sum += std::exp(double(x[j]) - mx);
    std::vector<double> r(static_cast<size_t>(V));
    for (int32_t j = 0; j < V; ++j) r[size_t(j)] = double(x[j]) - mx - std::log(sum);
    return r;
  }
  static int32_t argmax(const std::vector<double>& row) {  // first maximum: ties to the lowest id
    return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
  }

  sala::ModelConfig cfg_;
  sala::Checkpoint ckpt_;
  std::unique_ptr<sala::Model> model_;
  std::vector<int32_t> pages_;
  std::vector<float> logits_;
};

std::vector<int32_t> id_list(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_array()) sala::fail("score: '{}' must be a list of token ids", key);
  std::vector<int32_t> ids;
  for (const auto& v : j[key]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) sala::fail("score: '{}' holds a bad token id {}", key, v.dump());
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

int64_t int_field(const nlohmann::json& j, const char* key, int lineno) {
  if (!j[key].is_number_integer()) sala::fail("score: line {}: '{}' must be an integer", lineno, key);
  return j[key].get<int64_t>();
}

int run_score(const ScoreOpts& o) {
  std::ifstream in(o.input);
  if (!in) sala::fail("score: cannot read {}", o.input);
  Scorer s(o.model_path, o.cpu_threads);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) sala::fail("score: {} line {}: not a JSON object", o.input, lineno);
    const auto ids = id_list(j, "ids");
    if (ids.empty() || int64_t(ids.size()) > kMaxTokens)
      sala::fail("score: line {}: {} ids (1..{} allowed)", lineno, ids.size(), kMaxTokens);
    for (int32_t id : ids)
      if (id >= s.vocab()) sala::fail("score: line {}: token id {} outside the vocabulary", lineno, id);
    nlohmann::json r;
    if (j.contains("generate")) {
      const int64_t n = int_field(j, "generate", lineno);
      if (n < 1 || n > kMaxTokens) sala::fail("score: line {}: 'generate' {} outside 1..{}", lineno, n, kMaxTokens);
      r = s.generate(ids, int32_t(n), j.contains("stop_ids") ? id_list(j, "stop_ids") : std::vector<int32_t>{});
    } else if (j.contains("start")) {
      r = s.score(ids, int_field(j, "start", lineno));
    } else {
      sala::fail("score: {} line {}: give 'start' (score) or 'generate'", o.input, lineno);
    }
    fmt::print("{}\n", r.dump());
  }
  return 0;
}

sala::cli::Registrar reg("score", "Reference scores / greedy continuations from the model's fp32 logits (CPU)",
                         [](CLI::App& app) {
  auto o = std::make_shared<ScoreOpts>();
  app.add_option("--model-path", o->model_path, "Model directory")->required();
  app.add_option("--input", o->input, "JSONL: {ids, start} or {ids, generate, stop_ids}")->required();
  app.add_option("--cpu-threads", o->cpu_threads, "CPU backend threads (0: all cores)");
  return sala::cli::Run([o] { return run_score(*o); });
});

}  // namespace
