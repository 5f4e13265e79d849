#include "test_util.h"

#include <cmath>
#include <random>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/tensor_parallel.h"

namespace sala::test {

std::unique_ptr<Model> load_bf16_cpu(const std::string& dir, BackendOptions bo) {
  const ModelConfig cfg = load_model_config(dir);
  Checkpoint ckpt(dir);
  ModelLimits lim;
  lim.max_step_tokens = lim.max_logit_rows = 320;
  lim.caches = {24, cfg.sparse.block_size, 1};
  bo.mode = NumericMode::BF16;
  bo.threads = 0;
  return std::make_unique<Model>(cfg, make_backend("cpu", bo), ckpt, lim);
}

std::unique_ptr<Model> load_tiny(const std::string& dir, int32_t max_tokens, int32_t pages,
                                 int32_t slots, NumericMode mode, const ModelConfig* override_cfg,
                                 KvCacheDtype kv, int tp_size) {
  ModelConfig cfg = override_cfg ? *override_cfg : load_model_config(dir);
  Checkpoint ckpt(dir);
  ModelLimits lim;
  lim.max_step_tokens = max_tokens;
  lim.max_logit_rows = max_tokens;
  lim.caches = {pages, cfg.sparse.block_size, slots};
  BackendOptions bo{mode, 0};
  bo.kv_cache_dtype = kv;
  return std::make_unique<Model>(cfg, make_backend("cpu", bo), ckpt, lim,
                                 make_tp_peers("cpu", bo, tp_size));
}

std::vector<int32_t> page_range(int32_t first, int32_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) p[size_t(i)] = first + i;
  return p;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(3, vocab - 10);
  std::vector<int32_t> t{1};
  while (int(t.size()) < n) t.push_back(d(rng));
  return t;
}

std::vector<float> run_calls(Model& m, const std::vector<int32_t>& ids,
                             const std::vector<int32_t>& calls, int32_t slot,
                             const std::vector<int32_t>& pages, bool dense_as_sparse) {
  const size_t V = size_t(m.config().vocab_size);
  std::vector<float> all, logits;
  int64_t cursor = 0;
  for (int32_t n : calls) {
    StepMeta meta;
    meta.dense_as_sparse = dense_as_sparse;
    meta.add_seq(ids.data() + cursor, n, cursor, slot, pages, true, false);
    m.forward(meta, logits);
    all.insert(all.end(), logits.begin(), logits.begin() + long(size_t(n) * V));
    cursor += n;
  }
  return all;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, mx = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    err = std::max(err, double(std::abs(a[i] - b[i])));
    mx = std::max(mx, double(std::abs(b[i])));
  }
  if (a.size() != b.size()) return INFINITY;
  return err / std::max(mx, 1e-30);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace sala::test
