// sala bench offline --model-path DIR [--device cpu|cuda]: model-level throughput without
// the server: decode steps at batch 1/8/64 (128-token prompts, greedy, 512 new tokens) and
// prefill (4K-token prompts, batch 1 and 8), each as a ratio to the floors of
// ../shared/PERF.md (bytes of bf16 weights / 4.30 TB/s for decode; 2·params FLOPs / 790
// TFLOP/s for prefill). Decode steps include the greedy pick (argmax_rows on the backend,
// as the engine's greedy steps do).
// requires: sala_model
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <fstream>

#include "cli/command.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/minicpm_sala.h"

namespace {

struct Args {
  std::string model, device = "cpu", out_json;
  std::vector<int> decode_batches{1, 8, 64}, prefill_batches{1, 8};
  int decode_in = 128, decode_out = 512, prefill_in = 4096, threads = 0;
  bool bf16 = false;
};

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int32_t argmax(const float* row, int64_t V) {
  return int32_t(std::max_element(row, row + V) - row);
}

int run(const Args& a) {
  sala::ModelConfig cfg = sala::load_model_config(a.model);
  sala::Checkpoint ckpt(a.model);
  const int max_b = std::max(*std::max_element(a.decode_batches.begin(), a.decode_batches.end()),
                             *std::max_element(a.prefill_batches.begin(), a.prefill_batches.end()));
  const int64_t ctx = std::max(a.decode_in + a.decode_out, a.prefill_in) + 1;
  sala::ModelLimits lim;
  lim.max_step_tokens = std::max({a.prefill_in, a.decode_in, max_b});
  lim.max_logit_rows = max_b;
  lim.caches.page_size = cfg.sparse.block_size;
  const int32_t pages_per_seq = int32_t((ctx + lim.caches.page_size - 1) / lim.caches.page_size);
  lim.caches.num_pages = pages_per_seq * max_b;
  lim.caches.num_slots = max_b;
  // The GPU path is bf16 by contract; the CPU reference is fp32 unless --bf16 asks for emulation.
  const bool bf16 = a.bf16 || a.device == "cuda";
  sala::BackendOptions bo{bf16 ? sala::NumericMode::BF16 : sala::NumericMode::F32, a.threads};
  std::unique_ptr<sala::Backend> be;
  if (a.device == "cpu") be = sala::make_cpu_backend(bo);
#ifdef SALA_HAVE_CUDA
  else if (a.device == "cuda") be = sala::make_cuda_backend(bo);
#endif
  else sala::fail("device '{}' is not available in this build", a.device);
  fmt::print("loading {} on {} ...\n", a.model, be->name());
  auto t_load = Clock::now();
  sala::Model model(cfg, std::move(be), ckpt, lim);
  fmt::print("loaded in {:.1f} s\n", since(t_load));

  // Floors (../shared/PERF.md): bytes read per decode step = every linear weight + lm_head.
  double linear_params = 0;
  for (auto& [name, t] : ckpt.all())
    if (name != "model.embed_tokens.weight" && t->shape.size() == 2) linear_params += double(t->numel());
  const double decode_floor_ms = linear_params * 2 / 4.30e12 * 1e3;
  const double prefill_ceiling_tok_s = 790e12 / (2 * linear_params);
  const int64_t V = cfg.vocab_size;
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::string> table;

  auto seq_pages = [&](int b) {
    std::vector<int32_t> p(static_cast<size_t>(pages_per_seq));
    for (int32_t i = 0; i < pages_per_seq; ++i) p[size_t(i)] = b * pages_per_seq + i;
    return p;
  };
  std::vector<int32_t> prompt(static_cast<size_t>(std::max(a.decode_in, a.prefill_in)));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(3 + (i * 7919) % size_t(V - 12));
  prompt[0] = cfg.bos_token_id;
  std::vector<float> logits;

  for (int B : a.decode_batches) {
    std::vector<int32_t> next(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) {  // prefill each sequence alone
      sala::StepMeta m;
      m.add_seq(prompt.data(), a.decode_in, 0, b, seq_pages(b), false, true);
      model.forward(m, logits);
      next[size_t(b)] = argmax(logits.data(), V);
    }
    std::vector<double> step_ms;
    for (int s = 0; s < a.decode_out; ++s) {
      sala::StepMeta m;
      for (int b = 0; b < B; ++b)
        m.add_seq(&next[size_t(b)], 1, a.decode_in + s, b, seq_pages(b), false, true);
      const auto t0 = Clock::now();
      model.forward(m, logits, nullptr, &next);  // greedy on the device, as the engine does
      step_ms.push_back(since(t0) * 1e3);
      if ((s + 1) % 64 == 0 || s + 1 == a.decode_out)
        fmt::print(stderr, "\rdecode batch {:>2}: step {}/{}", B, s + 1, a.decode_out);
    }
    fmt::print(stderr, "\n");
    std::sort(step_ms.begin(), step_ms.end());
    const double med = step_ms[step_ms.size() / 2];
    const double floor_ratio = decode_floor_ms / med;
    table.push_back(fmt::format("decode  B={:<3} {:>9.3f} ms/step {:>10.1f} tok/s   floor {:.3f} ms -> {:5.1f}% of floor",
                                B, med, B * 1e3 / med, decode_floor_ms, 100 * floor_ratio));
    results.push_back({{"kind", "decode"}, {"batch", B}, {"ms_per_step", med},
                       {"tok_s", B * 1e3 / med}, {"floor_ms", decode_floor_ms}, {"fraction_of_floor", floor_ratio}});
  }
  for (int B : a.prefill_batches) {
    sala::StepMeta warm;
    warm.add_seq(prompt.data(), std::min(a.prefill_in, 256), 0, 0, seq_pages(0), false, true);
    model.forward(warm, logits);
    const auto t0 = Clock::now();
    for (int b = 0; b < B; ++b) {  // one sequence per forward: a 4K chunk is a full step
      sala::StepMeta m;
      m.add_seq(prompt.data(), a.prefill_in, 0, b, seq_pages(b), false, true);
      model.forward(m, logits);
      fmt::print(stderr, "\rprefill batch {}: {}/{}", B, b + 1, B);
    }
    fmt::print(stderr, "\n");
    const double sec = since(t0);
    const double tok_s = double(B) * a.prefill_in / sec;
    table.push_back(fmt::format("prefill B={:<3} {:>9.1f} ms total {:>10.1f} tok/s   bf16 peak {:.0f} tok/s -> {:5.1f}%",
                                B, sec * 1e3, tok_s, prefill_ceiling_tok_s, 100 * tok_s / prefill_ceiling_tok_s));
    results.push_back({{"kind", "prefill"}, {"batch", B}, {"input_len", a.prefill_in}, {"seconds", sec},
                       {"tok_s", tok_s}, {"ceiling_tok_s", prefill_ceiling_tok_s}});
  }
  fmt::print("\n{} ({}; {:.3f} B linear params)\n", a.model, model.backend().name(), linear_params / 1e9);
  for (auto& l : table) fmt::print("{}\n", l);
  if (!a.out_json.empty()) std::ofstream(a.out_json) << results.dump(2) << "\n";
  return 0;
}

sala::cli::Registrar reg("bench offline", "Model-level decode/prefill throughput vs the PERF.md floors",
                         [](CLI::App& app) {
                           auto a = std::make_shared<Args>();
                           app.add_option("--model-path", a->model, "model directory")->required();
                           app.add_option("--device", a->device, "cpu or cuda");
                           app.add_option("--decode-batches", a->decode_batches, "decode batch sizes")->delimiter(',');
                           app.add_option("--prefill-batches", a->prefill_batches, "prefill batch sizes")->delimiter(',');
                           app.add_option("--decode-input", a->decode_in, "decode prompt length");
                           app.add_option("--decode-output", a->decode_out, "decode steps");
                           app.add_option("--prefill-input", a->prefill_in, "prefill prompt length");
                           app.add_option("--threads", a->threads, "CPU threads (0 = all)");
                           app.add_flag("--bf16", a->bf16, "CPU: emulate bf16 rounding");
                           app.add_option("--json", a->out_json, "write results as JSON");
                           return [a] { return run(*a); };
                         });

}  // namespace
