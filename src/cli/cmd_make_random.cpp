// sala make-random --like-config CONFIG --out DIR [--layers N] [--seed S]
// Writes a checkpoint with the config's shapes and random bf16 weights (HF names, one
// model.safetensors streamed tensor by tensor). Scales keep activations finite and logits
// non-degenerate through all layers: linear weights N(0, 1/in), embeddings N(0, 1/scale_emb²)
// so the scaled embedding has unit variance, lm_head scaled so logits have std ≈ 2.
// requires: sala_model
#include <fmt/core.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/config.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/weights.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

struct Args {
  std::string config, out;
  int layers = 0;
  uint64_t seed = 1;
};

// splitmix64: a small, well-mixed generator; one stream per (tensor, chunk).
uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void fill_normal_bf16(std::vector<uint8_t>& buf, int64_t n, float mean, float std, uint64_t seed) {
  buf.resize(size_t(n) * 2);
  auto* out = reinterpret_cast<uint16_t*>(buf.data());
  const int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < (n + chunk - 1) / chunk; ++c) {
    uint64_t st = seed * 0x100000001b3ull + uint64_t(c);
    for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); i += 2) {
      // Box-Muller on two 32-bit uniforms.
      const uint64_t r = splitmix(st);
      const double u1 = (double(r >> 40) + 1.0) / double(1ull << 24);
      const double u2 = double(r & 0xffffff) / double(1ull << 24);
      const double rad = std::sqrt(-2.0 * std::log(u1));
      out[i] = sala::f32_to_bf16(mean + std * float(rad * std::cos(6.283185307179586 * u2)));
      if (i + 1 < n)
        out[i + 1] = sala::f32_to_bf16(mean + std * float(rad * std::sin(6.283185307179586 * u2)));
    }
  }
}

int run(const Args& a) {
  std::ifstream in(a.config);
  if (!in) sala::fail("{}: cannot read", a.config);
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) sala::fail("{}: not valid JSON", a.config);
  if (a.layers > 0) {
    j["num_hidden_layers"] = a.layers;
    auto m = j["mixer_types"];
    j["mixer_types"] = json(std::vector<json>(m.begin(), m.begin() + std::min<long>(a.layers, long(m.size()))));
  }
  const sala::ModelConfig cfg = sala::parse_model_config(j.dump(), a.config);
  fs::create_directories(a.out);
  std::ofstream(fs::path(a.out) / "config.json") << j.dump(2);

  std::vector<sala::TensorToWrite> specs;
  for (auto& [name, shape] : sala::expected_tensors(cfg)) specs.push_back({name, sala::DType::BF16, shape, {}});
  int64_t total = 0;
  for (auto& s : specs) {
    int64_t n = 1;
    for (auto d : s.shape) n *= d;
    total += n;
  }
  fmt::print("writing {} tensors, {:.2f} B parameters ({:.2f} GB bf16) to {}\n", specs.size(),
             total / 1e9, total * 2 / 1e9, a.out);
  const auto t0 = std::chrono::steady_clock::now();
  sala::write_safetensors_streaming(
      (fs::path(a.out) / "model.safetensors").string(), specs,
      [&](size_t i, std::vector<uint8_t>& buf) {
        const auto& s = specs[i];
        int64_t n = 1;
        for (auto d : s.shape) n *= d;
        const uint64_t seed = a.seed * 1000003ull + i;
        if (s.shape.size() == 1) {  // norm weights
          fill_normal_bf16(buf, n, 1.0f, 0.05f, seed);
        } else if (s.name == "model.embed_tokens.weight") {
          fill_normal_bf16(buf, n, 0.f, float(1.0 / cfg.scale_emb), seed);
        } else if (s.name == "lm_head.weight") {
          fill_normal_bf16(buf, n, 0.f, float(2.0 * cfg.logit_divisor() / std::sqrt(double(s.shape[1]))), seed);
        } else {
          fill_normal_bf16(buf, n, 0.f, float(1.0 / std::sqrt(double(s.shape[1]))), seed);
        }
      });
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("done in {:.1f} s\n", sec);
  return 0;
}

sala::cli::Registrar reg("make-random", "Write a random-weight checkpoint with a config's shapes",
                         [](CLI::App& app) {
                           auto a = std::make_shared<Args>();
                           app.add_option("--like-config", a->config, "config.json to copy")->required();
                           app.add_option("--out", a->out, "output directory")->required();
                           app.add_option("--layers", a->layers, "keep only the first N layers");
                           app.add_option("--seed", a->seed, "random seed");
                           return [a] { return run(*a); };
                         });

}  // namespace
