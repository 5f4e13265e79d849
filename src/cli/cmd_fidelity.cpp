// sala fidelity --model-path DIR --config-a SPEC --config-b SPEC [--corpus FILE | --random N]
// Teacher-forced comparison of two engine configurations on the same tokens: top-1
// agreement, mean / max KL(a‖b), logit cosine per position, and the length of the common
// prefix of their greedy continuations. SPEC is
//   device:mode[:dense-as-sparse][:fp8 | :w4][:kv8 | :kv=DTYPE]
// e.g. cpu:fp32, cpu:bf16, cuda:bf16, cpu:bf16:fp8 (W8A8 FP8 projections,
// BackendOptions::fp8_weights), cpu:bf16:kv8 (FP8 e4m3 KV cache) or cpu:bf16:fp8:kv=fp8_e5m2
// (DTYPE: a `--kv-cache-dtype` value, BackendOptions::kv_cache_dtype; kv8 is kv=fp8_e4m3), or
// cpu:bf16:w4 (W4A16 RTN at load, group 128: BackendOptions::int4_group_size).
// --model-path-b: configuration B reads another checkpoint (e.g. `sala quantize`'s output) with
// the same tokenizer and vocabulary.
// Options may come in any order. This is how a quantization or kernel change proves it keeps
// the model's behaviour.
// requires: sala_model sala_tokenizer
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "cli/command.h"
#include "backend/cache_layout.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/minicpm_sala.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Args {
  std::string model, model_b, a = "cpu:fp32", b = "cpu:bf16", corpus;
  int random = 4, length = 256, greedy = 32;
  uint32_t seed = 1;
};

struct Spec {
  std::string device;
  sala::NumericMode mode = sala::NumericMode::F32;
  bool dense_as_sparse = false;
  bool fp8 = false;  // BackendOptions::fp8_weights
  bool w4 = false;   // BackendOptions::int4_group_size = 128
  sala::KvCacheDtype kv = sala::KvCacheDtype::Auto;  // BackendOptions::kv_cache_dtype
  std::string text;
};

Spec parse_spec(const std::string& s) {
  Spec p;
  p.text = s;
  std::stringstream ss(s);
  std::string part;
  std::vector<std::string> parts;
  while (std::getline(ss, part, ':')) parts.push_back(part);
  if (parts.size() < 2)
    sala::fail("config '{}': expected device:mode[:dense-as-sparse][:fp8][:kv8|:kv=DTYPE]", s);
  p.device = parts[0];
  if (parts[1] == "fp32") p.mode = sala::NumericMode::F32;
  else if (parts[1] == "bf16") p.mode = sala::NumericMode::BF16;
  else sala::fail("config '{}': mode must be fp32 or bf16", s);
  for (size_t i = 2; i < parts.size(); ++i) {
    if (parts[i] == "dense-as-sparse") p.dense_as_sparse = true;
    else if (parts[i] == "fp8") p.fp8 = true;
    else if (parts[i] == "w4") p.w4 = true;
    else if (parts[i] == "kv8") p.kv = sala::KvCacheDtype::FP8_E4M3;
    else if (parts[i].starts_with("kv="))
      p.kv = sala::parse_kv_cache_dtype(parts[i].substr(3), fmt::format("config '{}': kv=", s));
    else sala::fail("config '{}': unknown option '{}'", s, parts[i]);
  }
  return p;
}

std::unique_ptr<sala::Model> load(const Spec& s, const std::string& dir, int32_t max_tokens) {
  sala::ModelConfig cfg = sala::load_model_config(dir);
  sala::Checkpoint ck(dir);
  sala::ModelLimits lim;
  lim.max_step_tokens = max_tokens;
  lim.max_logit_rows = max_tokens;
  lim.caches = {int32_t(sala::cache_layout::pages_for(max_tokens, cfg.sparse.block_size)) + 1,
                cfg.sparse.block_size, 1};
  sala::BackendOptions bo{s.mode, 0};
  bo.fp8_weights = s.fp8;
  bo.int4_group_size = s.w4 ? 128 : 0;
  bo.kv_cache_dtype = s.kv;
  return std::make_unique<sala::Model>(cfg, sala::make_backend(s.device, bo), ck, lim);
}

// Logits of every position of `ids` (one prefill), [n, V].
std::vector<float> all_logits(sala::Model& m, const Spec& s, const std::vector<int32_t>& ids) {
  sala::StepMeta meta;
  meta.dense_as_sparse = s.dense_as_sparse;
  std::vector<int32_t> pages(size_t(m.limits().caches.num_pages));
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = int32_t(i);
  meta.add_seq(ids.data(), int32_t(ids.size()), 0, 0, pages, true, false);
  std::vector<float> out;
  m.forward(meta, out);
  return out;
}

std::vector<int32_t> greedy(sala::Model& m, const Spec& s, std::vector<int32_t> ids, int n) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> gen;
  for (int i = 0; i < n; ++i) {  // recompute the whole prefix: simple and exact
    auto lg = all_logits(m, s, ids);
    const float* row = &lg[(ids.size() - 1) * size_t(V)];
    const int32_t t = int32_t(std::max_element(row, row + V) - row);
    gen.push_back(t);
    ids.push_back(t);
  }
  return gen;
}

int run(const Args& a) {
  const Spec sa = parse_spec(a.a), sb = parse_spec(a.b);
  std::vector<std::vector<int32_t>> seqs;
  sala::ModelConfig cfg = sala::load_model_config(a.model);
  if (!a.corpus.empty()) {
    auto tok = sala::Tokenizer::load(a.model);
    std::ifstream in(a.corpus);
    if (!in) sala::fail("{}: cannot read corpus", a.corpus);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) {
        // "\n" in a line is a newline (as `sala quantize --calibration` reads it), so one line
        // can hold a whole chat.
        for (size_t i = line.find("\\n"); i != std::string::npos; i = line.find("\\n", i + 1))
          line.replace(i, 2, "\n");
        auto ids = tok->encode(line, true);
        if (int(ids.size()) > a.length) ids.resize(size_t(a.length));
        seqs.push_back(ids);
      }
  } else {
    std::mt19937 rng(a.seed);
    std::uniform_int_distribution<int> d(3, cfg.vocab_size - 10);
    for (int s = 0; s < a.random; ++s) {
      std::vector<int32_t> ids{cfg.bos_token_id};
      while (int(ids.size()) < a.length) ids.push_back(d(rng));
      seqs.push_back(ids);
    }
  }
  if (seqs.empty()) sala::fail("empty corpus");
  int32_t max_len = 0;
  for (auto& s : seqs) max_len = std::max<int32_t>(max_len, int32_t(s.size()));
  auto ma = load(sa, a.model, max_len + a.greedy);
  auto mb = load(sb, a.model_b.empty() ? a.model : a.model_b, max_len + a.greedy);
  const int64_t V = cfg.vocab_size;
  int64_t positions = 0, agree = 0;
  double kl_sum = 0, kl_max = 0, cos_min = 1, cos_sum = 0;
  std::vector<int> prefix_lens;
  for (auto& ids : seqs) {
    auto la = all_logits(*ma, sa, ids), lb = all_logits(*mb, sb, ids);
    for (size_t p = 0; p < ids.size(); ++p) {
      const float* x = &la[p * size_t(V)];
      const float* y = &lb[p * size_t(V)];
      const float mx = *std::max_element(x, x + V), my = *std::max_element(y, y + V);
      double zx = 0, zy = 0, dot = 0, nx = 0, ny = 0;
      for (int64_t j = 0; j < V; ++j) {
        zx += std::exp(double(x[j] - mx));
        zy += std::exp(double(y[j] - my));
        dot += double(x[j]) * y[j];
        nx += double(x[j]) * x[j];
        ny += double(y[j]) * y[j];
      }
      double kl = 0;
      for (int64_t j = 0; j < V; ++j) {
        const double lpx = x[j] - mx - std::log(zx), lpy = y[j] - my - std::log(zy);
        kl += std::exp(lpx) * (lpx - lpy);
      }
      kl_sum += kl;
      kl_max = std::max(kl_max, kl);
      const double c = dot / std::sqrt(std::max(nx * ny, 1e-300));
      cos_min = std::min(cos_min, c);
      cos_sum += c;
      agree += (std::max_element(x, x + V) - x) == (std::max_element(y, y + V) - y);
      ++positions;
    }
    if (a.greedy > 0) {
      std::vector<int32_t> prompt(ids.begin(), ids.begin() + long(std::min<size_t>(ids.size(), 32)));
      auto ga = greedy(*ma, sa, prompt, a.greedy), gb = greedy(*mb, sb, prompt, a.greedy);
      int n = 0;
      while (n < a.greedy && ga[size_t(n)] == gb[size_t(n)]) ++n;
      prefix_lens.push_back(n);
    }
  }
  fmt::print("fidelity {}  A={}  B={}{}  ({} sequences, {} positions)\n", a.model, sa.text,
             sb.text, a.model_b.empty() ? "" : " on " + a.model_b, seqs.size(), positions);
  fmt::print("top-1 agreement   {:.4f} %\n", 100.0 * double(agree) / double(positions));
  fmt::print("KL(A||B)          mean {:.3g}  max {:.3g}\n", kl_sum / double(positions), kl_max);
  fmt::print("logit cosine      mean {:.6f}  min {:.6f}\n", cos_sum / double(positions), cos_min);
  if (!prefix_lens.empty()) {
    double mean = 0;
    for (int n : prefix_lens) mean += n;
    mean /= double(prefix_lens.size());
    fmt::print("greedy agreement  mean {:.1f} of {} tokens, min {}\n", mean, a.greedy,
               *std::min_element(prefix_lens.begin(), prefix_lens.end()));
  }
  return 0;
}

sala::cli::Registrar reg("fidelity", "Teacher-forced comparison of two engine configurations",
                         [](CLI::App& app) {
                           auto a = std::make_shared<Args>();
                           app.add_option("--model-path", a->model, "model directory")->required();
                           app.add_option("--model-path-b", a->model_b,
                                          "configuration B's model directory (default: --model-path)");
                           app.add_option("--config-a", a->a, "device:mode[:dense-as-sparse][:fp8|:w4][:kv8|:kv=DTYPE]");
                           app.add_option("--config-b", a->b, "device:mode[:dense-as-sparse][:fp8|:w4][:kv8|:kv=DTYPE]");
                           app.add_option("--corpus", a->corpus, "text file, one sequence per line (\\n: a newline)");
                           app.add_option("--random", a->random, "random sequences when no corpus");
                           app.add_option("--length", a->length, "tokens per sequence (max)");
                           app.add_option("--greedy", a->greedy, "greedy continuation length");
                           app.add_option("--seed", a->seed, "seed of the random corpus");
                           return [a] { return run(*a); };
                         });

}  // namespace
