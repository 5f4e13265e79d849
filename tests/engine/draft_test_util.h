// Draft models for the STANDALONE speculation tests, made at test time (no binary is
// committed): a copy of the bundled tiny model whose every weight matrix W became
// W + noise · std(W) · N(0, 1) (bf16, like the original), so that it disagrees with the
// original often and drafts are rejected and rolled back. Same tokenizer and config.
#pragma once
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/dtype.h"
#include "engine/engine.h"
#include "engine_test_util.h"

namespace sala {
namespace {

// Removed when the test process exits.
struct TempDirs {
  std::vector<std::string> dirs;
  ~TempDirs() {
    for (const auto& d : dirs) std::filesystem::remove_all(d);
  }
};

// The directory of the perturbed copy (written once per process, noise level and seed).
std::string perturbed_model_dir(double noise, uint32_t seed = 1) {
  namespace fs = std::filesystem;
  static TempDirs temp;
  const fs::path dir = fs::temp_directory_path() /
                       ("sala-draft-" + std::to_string(::getpid()) + "-" +
                        std::to_string(int(noise * 1000)) + "-" + std::to_string(seed));
  if (fs::exists(dir / "model.safetensors")) return dir.string();
  fs::create_directories(dir);
  temp.dirs.push_back(dir.string());
  for (const auto& e : fs::directory_iterator(kModelDir))
    if (e.path().filename() != "model.safetensors")
      fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  const Checkpoint ckpt(kModelDir);
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : ckpt.all()) {
    std::vector<float> w(size_t(t->numel()));
    t->to_f32(w.data());
    if (t->shape.size() == 2) {
      double sum = 0, sq = 0;
      for (float x : w) sum += x, sq += double(x) * x;
      const double mean = sum / double(w.size());
      const float sd = float(std::sqrt(std::max(0.0, sq / double(w.size()) - mean * mean)));
      for (float& x : w) x += float(noise) * sd * gauss(rng);
    }
    TensorToWrite tw{name, DType::BF16, t->shape, {}};
    tw.bytes.resize(w.size() * 2);
    for (size_t i = 0; i < w.size(); ++i) {
      const uint16_t b = f32_to_bf16(w[i]);
      std::memcpy(tw.bytes.data() + 2 * i, &b, 2);
    }
    out.push_back(std::move(tw));
  }
  write_safetensors((dir / "model.safetensors").string(), out);
  return dir.string();
}

// The draft Model of an engine whose target is load_model(pages, slots, step_tokens, ..,
// 1 + drafts): its caches as plan_draft_limits sizes them.
std::unique_ptr<Model> load_draft(const std::string& dir, int32_t pages, int32_t slots,
                                  int32_t step_tokens, int32_t drafts) {
  const ModelConfig cfg = load_model_config(dir);
  ModelLimits target;
  target.max_step_tokens = step_tokens;
  target.caches.page_size = tiny_config().sparse.block_size;
  target.caches.num_pages = pages;
  EngineOptions o;
  o.max_running_requests = slots;
  o.speculative.num_draft_tokens = drafts;
  const Checkpoint ckpt(dir);
  return std::make_unique<Model>(cfg, make_backend("cpu", BackendOptions{NumericMode::F32, 0}),
                                 ckpt, plan_draft_limits(cfg, o, target));
}

// start() (engine_test_util.h) with STANDALONE speculation: s.opts.speculative's drafts come
// from the draft model in draft_dir.
std::unique_ptr<Engine> start_with_draft(const EngineSetup& s, const std::string& draft_dir) {
  EngineOptions o = s.opts;
  o.max_running_requests = std::min(o.max_running_requests, s.slots);
  o.max_step_tokens = std::min(o.max_step_tokens, s.step_tokens);
  o.speculative.draft_model = true;
  const int32_t k = o.speculative.num_draft_tokens;
  return make_engine(load_model(s.pages, s.slots, s.step_tokens, s.kv, 1 + k), o,
                     load_draft(draft_dir, s.pages, s.slots, s.step_tokens, k));
}

}  // namespace
}  // namespace sala
