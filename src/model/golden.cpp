#include "model/golden.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/cache_layout.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/minicpm_sala.h"
#include "model/tensor_parallel.h"

namespace sala {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::vector<int32_t> read_i32(const SafetensorsFile& f, const std::string& name) {
  auto it = f.tensors().find(name);
  if (it == f.tensors().end()) fail("{}: missing tensor '{}'", f.path(), name);
  const TensorView& t = it->second;
  if (t.dtype != DType::I32) fail("{}: tensor '{}' must be I32", f.path(), name);
  std::vector<int32_t> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

const TensorView* find(const SafetensorsFile& f, const std::string& name) {
  auto it = f.tensors().find(name);
  return it == f.tensors().end() ? nullptr : &it->second;
}

struct Compare {
  const float* ref;
  const float* eng;
  int64_t V;
};

}  // namespace

std::vector<ScenarioResult> run_golden(const std::string& case_dir, const GoldenOptions& opts) {
  const fs::path dir(case_dir);
  for (const char* f : {"config.json", "model.safetensors", "expected.safetensors", "cases.json"})
    if (!fs::exists(dir / f)) fail("{}: golden case has no {}", case_dir, f);
  ModelConfig cfg = load_model_config(dir.string());
  Checkpoint ckpt(dir.string());
  SafetensorsFile expected((dir / "expected.safetensors").string());
  std::ifstream cin((dir / "cases.json").string());
  json cases = json::parse(cin, nullptr, false);
  if (cases.is_discarded() || !cases.contains("scenarios"))
    fail("{}: cases.json is not valid", case_dir);

  int64_t max_call = 1, max_total = 1;
  for (auto& s : cases["scenarios"]) {
    max_total = std::max<int64_t>(max_total, s["total_tokens"].get<int64_t>());
    for (auto& st : s["steps"]) max_call = std::max<int64_t>(max_call, st["tokens"].get<int64_t>());
  }
  ModelLimits lim;
  lim.max_step_tokens = int32_t(max_call);
  lim.max_logit_rows = int32_t(max_call);
  lim.caches.page_size = cfg.sparse.block_size;
  lim.caches.num_pages = int32_t(cache_layout::pages_for(max_total, lim.caches.page_size));
  lim.caches.num_slots = 1;
  const BackendOptions bo{opts.mode, opts.threads};
  Model model(cfg, make_backend(opts.device, bo), ckpt, lim,
              make_tp_peers(opts.device, bo, opts.tp_size));
  std::vector<int32_t> pages(size_t(lim.caches.num_pages));
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = int32_t(i);
  const std::string mode = opts.mode == NumericMode::F32 ? "fp32" : "bf16";
  const int64_t V = cfg.vocab_size;

  std::vector<ScenarioResult> results;
  for (auto& s : cases["scenarios"]) {
    ScenarioResult res;
    res.name = s["name"].get<std::string>();
    if (!opts.only.empty() &&
        std::find(opts.only.begin(), opts.only.end(), res.name) == opts.only.end())
      continue;
    const auto t0 = std::chrono::steady_clock::now();
    res.sparse = s.value("sparse_attention_active", false);
    const auto ids = read_i32(expected, res.name + ".ids");
    const auto positions = read_i32(expected, res.name + ".positions");
    const TensorView* ref_logits = find(expected, res.name + "." + mode + ".logits");
    if (!ref_logits) fail("{}: no {}.{}.logits", case_dir, res.name, mode);
    std::map<int32_t, size_t> want;  // position -> row in the reference
    for (size_t i = 0; i < positions.size(); ++i) want[positions[i]] = i;
    std::vector<int32_t> block_pos;
    const TensorView* ref_blocks = find(expected, res.name + "." + mode + ".blocks");
    if (ref_blocks) block_pos = read_i32(expected, res.name + ".block_positions");
    std::map<int32_t, size_t> want_blocks;
    for (size_t i = 0; i < block_pos.size(); ++i) want_blocks[block_pos[i]] = i;
    std::vector<int32_t> hidden_pos;
    const TensorView* ref_hidden = opts.hidden ? find(expected, res.name + "." + mode + ".hidden")
                                               : nullptr;
    if (ref_hidden) hidden_pos = read_i32(expected, res.name + ".hidden_positions");

    std::vector<float> engine_logits(positions.size() * size_t(V), NAN);
    // selections[layer][head][block row] from the engine
    const int nsl = cfg.num_sparse_layers(), kvh = cfg.num_key_value_heads;
    std::vector<std::vector<std::vector<std::vector<int32_t>>>> sel(
        size_t(nsl), std::vector<std::vector<std::vector<int32_t>>>(
                         size_t(kvh), std::vector<std::vector<int32_t>>(block_pos.size())));
    std::vector<double> hidden_err;

    int64_t cursor = 0;
    std::vector<float> logits;
    for (auto& st : s["steps"]) {
      const std::string op = st["op"].get<std::string>();
      const int64_t n = st["tokens"].get<int64_t>();
      std::vector<int64_t> calls = op == "decode" ? std::vector<int64_t>(size_t(n), 1)
                                                  : std::vector<int64_t>{n};
      for (int64_t cn : calls) {
        StepMeta meta;
        meta.add_seq(ids.data() + cursor, int32_t(cn), cursor, 0, pages, false, false);
        for (int64_t r = 0; r < cn; ++r)
          if (want.count(int32_t(cursor + r))) meta.logit_rows.push_back(int32_t(r));
        BlockCapture cap;
        if (ref_blocks) meta.capture = &cap;
        ForwardTrace trace;
        model.forward(meta, logits, ref_hidden ? &trace : nullptr);
        for (size_t i = 0; i < meta.logit_rows.size(); ++i) {
          const size_t ref_row = want[int32_t(cursor + meta.logit_rows[i])];
          std::copy_n(&logits[i * size_t(V)], V, &engine_logits[ref_row * size_t(V)]);
        }
        if (ref_blocks)
          for (int64_t r = 0; r < cn; ++r) {
            auto it = want_blocks.find(int32_t(cursor + r));
            if (it == want_blocks.end()) continue;
            for (int l = 0; l < nsl; ++l)
              for (int g = 0; g < kvh; ++g)
                if (size_t(l) < cap.selections.size())
                  sel[size_t(l)][size_t(g)][it->second] =
                      cap.selections[size_t(l)][size_t(g)][size_t(r)];
          }
        if (ref_hidden) {
          const int64_t H = cfg.hidden_size, K = int64_t(trace.hidden.size());
          hidden_err.resize(size_t(K), 0.0);
          for (size_t hp = 0; hp < hidden_pos.size(); ++hp) {
            const int64_t r = hidden_pos[hp] - cursor;
            if (r < 0 || r >= cn) continue;
            for (int64_t kk = 0; kk < K; ++kk)
              for (int64_t c = 0; c < H; ++c) {
                const double e = trace.hidden[size_t(kk)][size_t(r * H + c)];
                const double ref = ref_hidden->get_f32((int64_t(hp) * K + kk) * H + c);
                hidden_err[size_t(kk)] = std::max(hidden_err[size_t(kk)], std::abs(e - ref));
              }
          }
        }
        cursor += cn;
      }
    }
    for (size_t k = 0; k < hidden_err.size(); ++k)
      res.hidden_report.push_back(fmt::format("hidden[{}] max abs err {:.3g}", k, hidden_err[k]));

    // Logit metrics.
    const auto& tol = s["tolerances"][mode];
    std::set<int32_t> exempt;
    if (tol.contains("exempt_positions"))
      for (auto& e : tol["exempt_positions"]) exempt.insert(e.get<int32_t>());
    std::set<int32_t> tie_ok;
    if (s["stats"].contains("fp32_positions_top2_gap_lt_1e-4"))
      for (auto& e : s["stats"]["fp32_positions_top2_gap_lt_1e-4"]) tie_ok.insert(e.get<int32_t>());
    std::vector<double> cosines;
    bool fp32_fail = false;
    res.positions = int(positions.size());
    for (size_t i = 0; i < positions.size(); ++i) {
      const float* e = &engine_logits[i * size_t(V)];
      double max_ref = 0, max_err = 0, dot = 0, ne = 0, nr = 0;
      int64_t am_e = 0, am_r = 0;
      float best_r = -INFINITY, best_e = -INFINITY;
      for (int64_t j = 0; j < V; ++j) {
        const double r = ref_logits->get_f32(int64_t(i) * V + j);
        max_ref = std::max(max_ref, std::abs(r));
        max_err = std::max(max_err, std::abs(double(e[j]) - r));
        if (std::isnan(e[j])) max_err = INFINITY;
        dot += e[j] * r;
        ne += double(e[j]) * e[j];
        nr += r * r;
        if (r > best_r) best_r = float(r), am_r = j;
        if (e[j] > best_e) best_e = e[j], am_e = j;
      }
      const double rel = max_err / std::max(max_ref, 1e-30);
      const bool ex = exempt.count(positions[i]) > 0;
      if (!ex) {
        res.max_abs_err = std::max(res.max_abs_err, max_err);
        res.max_rel_err = std::max(res.max_rel_err, rel);
      }
      res.argmax_agree += am_e == am_r;
      const double cosv = dot / std::sqrt(std::max(ne * nr, 1e-300));
      cosines.push_back(cosv);
      if (cosv < 0.99) ++res.cos_below_099;
      const double r_at_e = ref_logits->get_f32(int64_t(i) * V + am_e);
      if (r_at_e < best_r - 0.01 * max_ref) ++res.not_near_top1;
      if (opts.mode == NumericMode::F32 && !ex) {
        const double lim = tol.value("per_position_max_abs_err_over_max_abs_ref_logit", 1e-3);
        if (!(rel <= lim) && res.why.empty()) {
          res.why = fmt::format("position {}: rel err {:.3g} > {}", positions[i], rel, lim);
          fp32_fail = true;
        }
        if (am_e != am_r && !tie_ok.count(positions[i]) && res.why.empty()) {
          res.why = fmt::format("position {}: argmax {} != reference {}", positions[i], am_e, am_r);
          fp32_fail = true;
        }
      }
    }
    std::vector<double> sorted = cosines;
    std::sort(sorted.begin(), sorted.end());
    res.cos_min = sorted.empty() ? 1 : sorted.front();
    res.cos_median = sorted.empty() ? 1 : sorted[sorted.size() / 2];
    if (sorted.size() % 2 == 0 && !sorted.empty())
      res.cos_median = 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);

    if (ref_blocks) {
      const int64_t B = int64_t(block_pos.size()), K = ref_blocks->shape.back();
      for (int l = 0; l < nsl; ++l)
        for (int g = 0; g < kvh; ++g)
          for (int64_t b = 0; b < B; ++b) {
            std::vector<int32_t> ref;
            for (int64_t x = 0; x < K; ++x) {
              const int32_t v =
                  int32_t(ref_blocks->get_f32(((int64_t(l) * kvh + g) * B + b) * K + x));
              if (v >= 0) ref.push_back(v);
            }
            ++res.block_rows;
            res.block_rows_equal += ref == sel[size_t(l)][size_t(g)][size_t(b)];
          }
    }

    if (opts.mode == NumericMode::F32) {
      res.pass = !fp32_fail;
    } else {
      // The case's own bf16 criteria (cases.json), defaulting to the README's rules.
      const int n = res.positions;
      const int allowed = std::max(1, int((res.sparse ? 0.02 : 0.01) * n));
      const double cos_min = tol.value("cosine_min_every_position", res.sparse ? 0.95 : 0.999);
      const double cos_med = tol.value("cosine_median_min", res.sparse ? 0.999 : 0.0);
      const int below = tol.value("max_positions_cosine_below_0.99", res.sparse ? allowed : n);
      const int not_near = tol.value("max_positions_not_near_top1", allowed);
      if (res.cos_min < cos_min) res.why = fmt::format("cosine {:.5f} < {}", res.cos_min, cos_min);
      else if (res.cos_median < cos_med)
        res.why = fmt::format("median cosine {:.5f} < {}", res.cos_median, cos_med);
      else if (res.cos_below_099 > below)
        res.why = fmt::format("{} positions below cosine 0.99 (allowed {})", res.cos_below_099, below);
      else if (res.not_near_top1 > not_near)
        res.why = fmt::format("{} positions not near-top-1 (allowed {})", res.not_near_top1, not_near);
      res.pass = res.why.empty();
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    results.push_back(res);
  }
  if (results.empty()) fail("{}: no scenario matched", case_dir);
  return results;
}

}  // namespace sala
