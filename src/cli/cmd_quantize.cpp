// sala quantize --model-path IN --out OUT --scheme fp8 [--quantize-lm-head]: a checkpoint in
// the compressed-tensors FP8 layout (model/quantize.h), which `sala serve` then runs with no
// flag (the CPU backend so far) and vLLM / SGLang load.
// requires: sala_model
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "model/quantize.h"

namespace {

struct Args {
  std::string in, out, scheme;
  bool quantize_lm_head = false;
};

int run(const Args& a) {
  if (a.scheme != "fp8") sala::fail("--scheme '{}' is not supported (fp8)", a.scheme);
  sala::QuantizeOptions o;
  o.quantize_lm_head = a.quantize_lm_head;
  sala::quantize_checkpoint_fp8(a.in, a.out, o, [](size_t done, size_t total) {
    if (done == total || done % 16 == 0)
      fmt::print(stderr, "\rquantize: {}/{} tensors", done, total);
  });
  fmt::print(stderr, "\nwrote {}\n", a.out);
  return 0;
}

sala::cli::Registrar reg("quantize", "Rewrite a checkpoint with FP8 weights (compressed-tensors)",
                         [](CLI::App& app) {
                           auto a = std::make_shared<Args>();
                           app.add_option("--model-path", a->in, "input checkpoint directory")
                               ->required();
                           app.add_option("--out", a->out, "output directory (new or empty)")
                               ->required();
                           app.add_option("--scheme", a->scheme, "fp8")->required();
                           app.add_flag("--quantize-lm-head", a->quantize_lm_head,
                                        "lm_head in FP8 too (default: kept as it is)");
                           return [a] { return run(*a); };
                         });

}  // namespace
