// sala golden CASE_DIR [--mode fp32|bf16] [--device cpu|cuda]: reproduce a golden case.
// requires: sala_model
#include <fmt/core.h>

#include "cli/command.h"
#include "model/golden.h"

namespace {

struct Args {
  std::string dir, mode = "fp32", device = "cpu";
  std::vector<std::string> only;
  bool hidden = false;
  int threads = 0;
  int tp_size = 1;
};

int run(const Args& a) {
  sala::GoldenOptions o;
  o.mode = a.mode == "bf16" ? sala::NumericMode::BF16 : sala::NumericMode::F32;
  o.device = a.device;
  o.only = a.only;
  o.hidden = a.hidden;
  o.threads = a.threads;
  o.tp_size = a.tp_size;
  const auto results = sala::run_golden(a.dir, o);
  int failed = 0;
  fmt::print("golden {}  mode {}  device {}  tp {}\n", a.dir, a.mode, a.device, a.tp_size);
  fmt::print("{:<26} {:>5} {:>10} {:>10} {:>7} {:>9} {:>9} {:>9} {:>7}  {}\n", "scenario", "pos",
             "max|err|", "rel", "argmax", "cos_min", "cos_med", "blocks", "sec", "result");
  for (const auto& r : results) {
    const std::string blocks =
        r.block_rows ? fmt::format("{}/{}", r.block_rows_equal, r.block_rows) : "-";
    fmt::print("{:<26} {:>5} {:>10.3g} {:>10.3g} {:>3}/{:<3} {:>9.6f} {:>9.6f} {:>9} {:>7.2f}  {}{}\n",
               r.name, r.positions, r.max_abs_err, r.max_rel_err, r.argmax_agree, r.positions,
               r.cos_min, r.cos_median, blocks, r.seconds, r.pass ? "PASS" : "FAIL",
               r.why.empty() ? "" : "  (" + r.why + ")");
    for (auto& h : r.hidden_report) fmt::print("    {}\n", h);
    failed += !r.pass;
  }
  fmt::print("{} scenarios, {} passed, {} failed\n", results.size(), results.size() - failed, failed);
  return failed ? 1 : 0;
}

sala::cli::Registrar reg("golden", "Run a golden case directory and compare with its expected logits",
                         [](CLI::App& app) {
                           auto a = std::make_shared<Args>();
                           app.add_option("case_dir", a->dir, "golden case directory")->required();
                           app.add_option("--mode", a->mode, "numeric mode")
                               ->check(CLI::IsMember({"fp32", "bf16"}));
                           app.add_option("--device", a->device, "cpu or cuda")
                               ->check(CLI::IsMember({"cpu", "cuda"}));
                           app.add_option("--scenario", a->only, "only these scenarios");
                           app.add_flag("--hidden", a->hidden, "also compare per-layer hidden states");
                           app.add_option("--threads", a->threads, "CPU threads (0 = all)");
                           app.add_option("--tp-size", a->tp_size,
                                          "tensor-parallel ranks, one thread each (CUDA: one GPU each)");
                           return [a] { return run(*a); };
                         });

}  // namespace
