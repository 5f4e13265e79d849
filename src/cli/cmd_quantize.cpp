// sala quantize --model-path IN --out OUT --scheme fp8 | w4a16 | mixed [...]: a checkpoint in
// compressed-tensors' layouts (model/quantize.h), which `sala serve` then runs with no flag
// (the CPU backend so far) and vLLM / SGLang load.
//   fp8    W8A8 e4m3, per-channel weight scales ("float-quantized")
//   w4a16  int4 with one bf16 scale per --group-size input columns ("pack-quantized"), by
//          --method gptq (default; Hessians from --calibration text, layer by layer) or rtn
//   mixed  w4a16 GPTQ, with the projection families (per layer: qkv+gate, o_proj, gate+up,
//          down_proj) most sensitive on the calibration text kept bf16 until at most
//          --max-accuracy-loss percent of the unquantized model's right next-token predictions
//          on it change (model/calibrate.h mixed_plan); the plan is printed and written into
//          the config (quantization_config.sala_mixed_plan).
// --ignore PATTERN (repeatable; fp8, and w4a16 --method rtn): modules kept as they are, by
// name or "re:" regex (compressed-tensors' `ignore` syntax, which the written config lists), so
// a user's own mix needs no calibration run. A pattern that matches no module, or that splits
// a family the loader stacks (q/k/v/gate, gate/up), is refused.
// --calibration FILE: one sample per line (the tokenizer's BOS first). Without it: the built-in
// text below (general English prose), which suits a general model; a model trained on one kind
// of text (sala-tiny-chat) calibrates better on its own kind (tests/fixtures/eval/
// tiny-chat.calibration.txt).
// requires: sala_model sala_tokenizer
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "model/calibrate.h"
#include "model/quantize.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr const char* kBuiltinCalibrationText[] = {
    "The history of science is the study of how people came to understand the natural world. "
    "Early astronomers tracked the motion of the planets and the moon, and from their records "
    "later scholars built models that predicted eclipses years in advance. Chemistry grew out "
    "of the practical crafts of metalworking, dyeing and medicine, and physics out of questions "
    "about motion, light and heat.",
    "A recipe for bread needs only flour, water, salt and yeast. Mix them into a dough, knead it "
    "for ten minutes until it is smooth, and let it rise for an hour in a warm place. Shape the "
    "loaf, let it rise again, and bake it at 230 degrees Celsius for about forty minutes, until "
    "the crust is brown and the loaf sounds hollow when tapped.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    "
    "return a\n\nprint([fibonacci(i) for i in range(10)])  # [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]",
    "Question: A train leaves at 9:15 and arrives at 11:40. How long is the journey? Answer: From "
    "9:15 to 11:15 is two hours, and from 11:15 to 11:40 is 25 minutes, so the journey takes 2 "
    "hours and 25 minutes.",
    "Rivers shape the land they cross. Over thousands of years water carries sand and stones "
    "downstream, cutting valleys into the hills and building wide plains and deltas where the "
    "river meets the sea. Many of the world's great cities grew beside rivers, which gave them "
    "water, food, and a road for trade.",
};

struct Args {
  std::string in, out, scheme, method = "gptq", calibration;
  std::vector<std::string> ignore;
  bool quantize_lm_head = false, act_order = false;
  int32_t group_size = 128, calibration_tokens = 512;
  double damp = 0.01, max_accuracy_loss = 1.0;
};

std::vector<std::vector<int32_t>> calibration_tokens(const Args& a) {
  auto tok = sala::Tokenizer::load(a.in);
  std::vector<std::string> texts;
  if (a.calibration.empty()) {
    texts.assign(std::begin(kBuiltinCalibrationText), std::end(kBuiltinCalibrationText));
  } else {
    std::ifstream f(a.calibration);
    if (!f) sala::fail("{}: cannot read the calibration file", a.calibration);
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) texts.push_back(line);
    if (texts.empty()) sala::fail("{}: the calibration file has no text", a.calibration);
  }
  std::vector<std::vector<int32_t>> seqs;
  size_t tokens = 0;
  for (const std::string& t : texts) {
    // The file's lines may hold escaped newlines ("\n"), so one line can be a whole chat.
    std::string text;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] == '\\' && i + 1 < t.size() && t[i + 1] == 'n') {
        text += '\n';
        ++i;
      } else {
        text += t[i];
      }
    }
    auto ids = tok->encode(text, true);
    if (int32_t(ids.size()) > a.calibration_tokens) ids.resize(size_t(a.calibration_tokens));
    if (ids.size() >= 2) {
      tokens += ids.size();
      seqs.push_back(std::move(ids));
    }
  }
  fmt::print(stderr, "calibration: {} sequences, {} tokens ({})\n", seqs.size(), tokens,
             a.calibration.empty() ? "built-in text" : a.calibration);
  return seqs;
}

// --ignore's patterns, checked against the checkpoint's modules (see the file's header).
void check_ignore(const Args& a) {
  const sala::ModelConfig cfg = sala::load_model_config(a.in);
  for (const std::string& p : a.ignore) {
    if (p.rfind("re:", 0) == 0) {
      try {
        std::regex re(p.substr(3));
      } catch (const std::regex_error& e) {
        sala::fail("--ignore '{}': not a valid regex: {}", p, e.what());
      }
    }
    sala::QuantizationConfig one;
    one.ignore = {p};
    bool any = false;
    for (const sala::LinearFamily& f : sala::linear_families(cfg)) {
      size_t kept = 0;
      for (const std::string& m : f.modules) kept += one.ignores(m) ? 1 : 0;
      if (kept != 0 && kept != f.modules.size()) {
        std::string names;
        for (const std::string& m : f.modules) names += (names.empty() ? "" : ", ") + m;
        sala::fail("--ignore '{}' keeps part of {} ({}): its projections are stacked at load "
                   "and must share a scheme; ignore all of them or none",
                   p, f.label(), names);
      }
      any = any || kept != 0;
    }
    if (!any && !one.ignores("lm_head"))
      sala::fail("--ignore '{}' matches no Linear module of {}", p, cfg.source);
  }
}

int run(const Args& a) {
  sala::QuantizeOptions o;
  o.quantize_lm_head = a.quantize_lm_head;
  if (!a.ignore.empty()) {
    if (!(a.scheme == "fp8" || (a.scheme == "w4a16" && a.method == "rtn")))
      sala::fail("--ignore is implemented for --scheme fp8 and --scheme w4a16 --method rtn");
    check_ignore(a);
    o.ignore = a.ignore;
  }
  auto progress = [](size_t done, size_t total) {
    if (done == total || done % 16 == 0)
      fmt::print(stderr, "\rquantize: {}/{} tensors", done, total);
  };
  auto note = [](const std::string& s) { fmt::print(stderr, "\r{:<78}", s); };
  if (a.scheme == "fp8") {
    sala::quantize_checkpoint_fp8(a.in, a.out, o, progress);
    fmt::print(stderr, "\nwrote {}\n", a.out);
    return 0;
  }
  if (a.scheme != "w4a16" && a.scheme != "mixed")
    sala::fail("--scheme '{}' is not supported (fp8, w4a16, mixed)", a.scheme);
  if (a.method != "gptq" && a.method != "rtn")
    sala::fail("--method '{}' is not supported (gptq, rtn)", a.method);
  if (a.quantize_lm_head)
    sala::fail("--quantize-lm-head is implemented for --scheme fp8 only");
  const sala::ModelConfig cfg = sala::load_model_config(a.in);
  if (cfg.quantization.any())
    sala::fail("{}: the checkpoint is already quantized; quantize its bf16 original", cfg.source);
  sala::Int4Quantizer q;
  q.gptq = a.method == "gptq";
  q.gptq_opts.group = a.group_size;
  q.gptq_opts.damp = a.damp;
  q.gptq_opts.act_order = a.act_order;
  const bool need_text = q.gptq || a.scheme == "mixed";
  const auto seqs = need_text ? calibration_tokens(a) : std::vector<std::vector<int32_t>>{};
  // Plain RTN needs no model run: the writer quantizes tensor by tensor (the same codes).
  const bool plain_rtn = !q.gptq && a.scheme == "w4a16";
  const sala::Int4CodeMap codes =
      plain_rtn ? sala::Int4CodeMap{} : sala::quantize_int4(a.in, seqs, q, note);
  if (!plain_rtn) fmt::print(stderr, "\n");
  sala::QuantPlan plan = sala::uniform_plan(cfg, {sala::QuantScheme::W4A16, a.group_size}, o);
  nlohmann::json record = nlohmann::json::object();
  if (a.scheme == "mixed") {
    nlohmann::json plan_record;
    std::string report;
    plan = sala::mixed_plan(a.in, seqs, codes, a.group_size, a.max_accuracy_loss, &plan_record,
                            &report, note);
    fmt::print("\n{}", report);
    record["sala_mixed_plan"] = plan_record;
  }
  sala::write_quantized_checkpoint(a.in, a.out, plan, codes, o, record, progress);
  fmt::print(stderr, "\nwrote {}\n", a.out);
  return 0;
}

sala::cli::Registrar reg(
    "quantize", "Rewrite a checkpoint with FP8, W4A16 or mixed weights (compressed-tensors)",
    [](CLI::App& app) {
      auto a = std::make_shared<Args>();
      app.add_option("--model-path", a->in, "input checkpoint directory")->required();
      app.add_option("--out", a->out, "output directory (new or empty)")->required();
      app.add_option("--scheme", a->scheme, "fp8 | w4a16 | mixed")->required();
      app.add_option("--method", a->method, "w4a16 / mixed: gptq (default) | rtn");
      app.add_option("--group-size", a->group_size, "w4a16: input columns per scale (128)");
      app.add_option("--calibration", a->calibration,
                     "calibration text, one sample per line (default: built-in English text)");
      app.add_option("--calibration-tokens", a->calibration_tokens,
                     "tokens per calibration sample, at most (512)");
      app.add_option("--damp", a->damp, "GPTQ dampening, fraction of the mean diag(H) (0.01)");
      app.add_flag("--act-order", a->act_order,
                   "GPTQ: columns by decreasing activation energy (static group scales)");
      app.add_option("--max-accuracy-loss", a->max_accuracy_loss,
                     "mixed: budget, % of the unquantized model's right next-token predictions "
                     "on the calibration text that may change (1.0)");
      app.add_option("--ignore", a->ignore,
                     "fp8, w4a16 --method rtn: modules kept as they are, by name or \"re:\" "
                     "regex (repeatable; compressed-tensors' ignore syntax)");
      app.add_flag("--quantize-lm-head", a->quantize_lm_head,
                   "fp8: lm_head in FP8 too (default: kept as it is)");
      return [a] { return run(*a); };
    });

}  // namespace
