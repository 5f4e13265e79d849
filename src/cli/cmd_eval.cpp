// `sala eval`: the SOAR toolkit's accuracy evaluation (eval_model.py); see src/harness/eval.h.
// requires: sala_harness
#include <fmt/core.h>

#include <fstream>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "harness/eval.h"
#include "harness/http.h"

namespace {

struct Args {
  std::string url = "http://127.0.0.1:30000", data, out, summary, model;
  int concurrency = 8;
  int64_t max_tokens = 65536, num_samples = -1;
  double timeout = 3000;
  bool quiet = false;
};

sala::cli::Registrar reg("eval", "accuracy evaluation through /v1/chat/completions, scored as the SOAR eval_model.py",
                         [](CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_option("--url", a->url, "server base URL")->capture_default_str();
  app.add_option("--data", a->data, "JSONL with question, task, gold")->required();
  app.add_option("--out", a->out, "write predictions JSONL (index, task, gold, prediction, score, ...)");
  app.add_option("--summary", a->summary, "write the accuracy summary JSON here");
  app.add_option("--concurrency", a->concurrency, "requests in flight")->capture_default_str();
  app.add_option("--max-tokens", a->max_tokens, "max_tokens of each request")->capture_default_str();
  app.add_option("--num-samples", a->num_samples, "evaluate only the first N rows");
  app.add_option("--model", a->model, "model name to send (default: GET /v1/models)");
  app.add_option("--timeout", a->timeout, "seconds per request")->capture_default_str();
  app.add_flag("--quiet", a->quiet, "no progress bar");
  return [a]() -> int {
    using namespace sala::harness;
    EvalOptions opt;
    opt.base_url = normalize_base_url(a->url);
    opt.model = a->model;
    opt.concurrency = a->concurrency;
    opt.max_tokens = a->max_tokens;
    opt.timeout_s = a->timeout;
    opt.progress = !a->quiet;
    if (opt.concurrency < 1) sala::fail("--concurrency must be >= 1");
    auto items = load_eval_items(a->data, a->num_samples);
    auto recs = run_eval(opt, items);
    auto s = summarize_eval(recs);
    if (!a->out.empty()) {
      std::ofstream f(a->out);
      if (!f) sala::fail("cannot write '{}'", a->out);
      for (const auto& r : recs) f << eval_record_json(r).dump() << "\n";
    }
    if (!a->summary.empty()) {
      std::ofstream f(a->summary);
      if (!f) sala::fail("cannot write '{}'", a->summary);
      f << eval_summary_json(s).dump(1) << "\n";
    }
    for (const auto& r : recs)
      if (!r.error.empty()) {
        fmt::print(stderr, "first failure (row {}): {}\n", r.index, r.error);
        break;
      }
    fmt::print("{}", format_eval_summary(s));
    if (!a->out.empty()) fmt::print("predictions written to {}\n", a->out);
    return s.errors ? 1 : 0;
  };
});

}  // namespace
