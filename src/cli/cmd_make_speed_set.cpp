// `sala make-speed-set`: deterministic synthetic speed sets (see src/harness/speed_set.h).
// requires: sala_harness
#include <fmt/core.h>

#include <fstream>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "harness/speed_set.h"

namespace {

sala::cli::Registrar reg("make-speed-set", "write a synthetic speed set JSONL shaped like the contest workload",
                         [](CLI::App& app) {
  auto o = std::make_shared<sala::harness::SpeedSetOptions>();
  auto out = std::make_shared<std::string>();
  app.add_option("--out", *out, "output JSONL")->required();
  app.add_option("--n", o->n, "number of requests")->capture_default_str();
  app.add_option("--seed", o->seed, "random seed (same seed and flags: same file)")->capture_default_str();
  app.add_option("--scale", o->scale, "multiply every length (0.001: 32K-512K -> 32-512 tokens)")->capture_default_str();
  app.add_option("--output-scale", o->output_scale, "multiply output lengths (default: --scale)");
  app.add_option("--max-prompt-tokens", o->max_prompt_tokens, "cap prompt lengths (after scaling)");
  app.add_option("--long-fraction", o->long_fraction, "fraction of prompts of 32K-512K tokens")->capture_default_str();
  app.add_option("--min-output-tokens", o->output_min, "outputs are log-uniform in [min, max] (before scaling)")->capture_default_str();
  app.add_option("--max-output-tokens", o->output_max, "")->capture_default_str();
  return [o, out]() -> int {
    std::ofstream f(*out, std::ios::binary);
    if (!f) sala::fail("cannot write '{}'", *out);
    auto st = sala::harness::write_speed_set(f, *o);
    f.close();
    if (!f) sala::fail("write error on '{}'", *out);
    fmt::print("wrote {}: {} requests ({} long), {:.1f} MB\n", *out, st.n, st.n_long, static_cast<double>(st.bytes) / 1e6);
    fmt::print("prompt tokens (est. 1.3/word): total {}, min {}, max {}, mean {:.0f}\n", st.prompt_tokens_total,
               st.prompt_min, st.prompt_max, static_cast<double>(st.prompt_tokens_total) / static_cast<double>(st.n));
    fmt::print("output tokens (est.):          total {}, min {}, max {}, mean {:.0f}\n", st.output_tokens_total,
               st.output_min, st.output_max, static_cast<double>(st.output_tokens_total) / static_cast<double>(st.n));
    return 0;
  };
});

}  // namespace
