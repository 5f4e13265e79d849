// `sala bench serve`: the SOAR speed benchmark (sglang.bench_serving --backend sglang
// requires: sala_harness
// --dataset-name custom) at concurrency 1, 8 and unbounded; see src/harness/bench_serve.h.
#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <memory>

#include "cli/command.h"
#include "cli/serve_roofline.h"
#include "core/error.h"
#include "harness/bench_serve.h"
#include "harness/http.h"
#include "harness/speed_data.h"
#include "harness/svg_plot.h"
#include "harness/token_count.h"

namespace {

struct Args {
  std::string url = "http://127.0.0.1:30000";
  std::vector<std::string> data;
  std::string concurrency = "1,8,inf";
  std::string baseline, out, svg, tokenizer, roofline_config;
  bool no_roofline = false;
  uint64_t seed = 42;
  bool no_shuffle = false;
  int64_t num_prompts = -1;
  std::string server_info_path = "/get_server_info";
  bool no_flush = false, quiet = false;
  double timeout = 6 * 3600;
};

// The served model for the roofline: --roofline-config, else the server's model_path when it
// is a directory here (both servers report it, with quantization and chunked_prefill_size, in
// /get_server_info). nullopt, with a note, when neither is readable.
std::optional<sala::cli::RooflineModel> roofline_model(const Args& a, const std::string& url,
                                                       const std::string& info_path) {
  if (a.no_roofline) return std::nullopt;
  sala::cli::RooflineModel m;
  std::string path = a.roofline_config;
  try {
    const nlohmann::json info = sala::harness::get_json(url, info_path);
    if (path.empty() && info.contains("model_path") && info["model_path"].is_string())
      path = info["model_path"].get<std::string>();
    if (info.contains("quantization") && info["quantization"].is_string())
      m.quantization = info["quantization"].get<std::string>();
    if (info.contains("chunked_prefill_size") && info["chunked_prefill_size"].is_number_integer())
      m.chunk = std::max<int64_t>(1, info["chunked_prefill_size"].get<int64_t>());
  } catch (const sala::Error& e) {
    if (a.roofline_config.empty()) {
      fmt::print(stderr, "roofline: skipped ({}; --roofline-config names the model)\n", e.what());
      return std::nullopt;
    }
  }
  if (path.empty() || !std::filesystem::exists(path)) {
    if (!a.roofline_config.empty()) sala::fail("--roofline-config '{}' does not exist", path);
    fmt::print(stderr, "roofline: skipped (the server's model path '{}' is not here; "
                       "--roofline-config names its config.json)\n", path);
    return std::nullopt;
  }
  m.cfg = sala::load_model_config(path);
  return m;
}

void add_roofline(sala::harness::TierResult& t, const sala::cli::RooflineModel& m) {
  std::vector<int64_t> in, out;
  for (const auto& o : t.outputs)
    if (o.success) {
      in.push_back(o.server_prompt_len >= 0 ? o.server_prompt_len : o.prompt_len);
      out.push_back(o.output_len);
    }
  const sala::cli::ServeRoofline r = sala::cli::serve_roofline(m, in, out, t.concurrency);
  t.roofline_s = r.total_s();
  t.roofline_prefill_s = r.prefill_s;
  t.roofline_decode_s = r.decode_s;
}

int run(const Args& a) {
  using namespace sala::harness;
  BenchOptions opt;
  opt.base_url = normalize_base_url(a.url);
  opt.server_info_path = a.server_info_path;
  opt.flush_cache = !a.no_flush;
  opt.progress = !a.quiet;
  opt.request_timeout_s = a.timeout;
  auto conc = parse_concurrency_list(a.concurrency);
  if (a.data.size() != 1 && a.data.size() != conc.size())
    sala::fail("give one --data file for all tiers or one per tier ({} tiers, {} files)", conc.size(),
               a.data.size());
  std::map<std::string, double> baseline;
  if (!a.baseline.empty()) baseline = load_baseline(a.baseline);

  std::string model = served_model_id(opt.base_url);
  std::string tok_dir = a.tokenizer.empty() ? model : a.tokenizer;
  auto counter = TokenCounter::load(tok_dir);
  fmt::print(stderr, "model {}; counting tokens with the tokenizer of {}\n", model, tok_dir);
  SpeedDataOptions dopt;
  if (!a.no_shuffle) dopt.shuffle_seed = a.seed;
  dopt.num_prompts = a.num_prompts;
  std::map<std::string, std::vector<SpeedRow>> rows;
  for (const auto& d : a.data)
    if (!rows.count(d)) {
      rows[d] = load_speed_rows(d, *counter, dopt);
      int64_t in = 0, out = 0;
      for (const auto& r : rows[d]) {
        in += r.prompt_len;
        out += r.output_len;
      }
      fmt::print(stderr, "{}: {} requests, #input tokens {}, #output tokens {}\n", d, rows[d].size(),
                 in, out);
    }

  const auto roof = roofline_model(a, opt.base_url, opt.server_info_path);
  std::vector<TierResult> tiers;
  for (size_t i = 0; i < conc.size(); ++i) {
    const std::string& d = a.data.size() == 1 ? a.data[0] : a.data[i];
    TierResult t = run_tier(opt, rows[d], conc[i]);
    t.data_path = d;
    if (roof) add_roofline(t, *roof);
    fmt::print("{}", format_tier(t));
    std::fflush(stdout);
    tiers.push_back(std::move(t));
  }
  fmt::print("{}", format_summary(tiers, baseline));
  if (!a.out.empty()) {
    std::ofstream f(a.out);
    if (!f) sala::fail("cannot write '{}'", a.out);
    f << results_json(tiers, opt.base_url, model, baseline).dump(1) << "\n";
    fmt::print("results written to {}\n", a.out);
  }
  if (!a.svg.empty()) {
    std::ofstream f(a.svg);
    if (!f) sala::fail("cannot write '{}'", a.svg);
    f << render_bench_svg(tiers, fmt::format("sala bench serve: {} at {}", model, opt.base_url));
    fmt::print("plot written to {}\n", a.svg);
  }
  int64_t failed = 0;
  for (const auto& t : tiers) failed += t.failed;
  return failed ? 1 : 0;
}

sala::cli::Registrar reg("bench serve", "serving benchmark through /generate, as sglang.bench_serving (S1/S8/Sinf)",
                         [](CLI::App& s) {
  auto a = std::make_shared<Args>();
  s.add_option("--url", a->url, "server base URL")->capture_default_str();
  s.add_option("--data", a->data, "speed data JSONL (question/input/prompt + model_response); one for all tiers or one per tier")
      ->required();
  s.add_option("--concurrency", a->concurrency, "comma-separated tiers; inf = all requests at once")->capture_default_str();
  s.add_option("--baseline", a->baseline, "earlier --out file (or bench_serving --output-file JSONL) to compare durations with");
  s.add_option("--out", a->out, "write results JSON here");
  s.add_option("--svg", a->svg, "write an SVG plot of latencies and throughput here");
  s.add_option("--tokenizer", a->tokenizer, "tokenizer directory (default: the served model id)");
  s.add_option("--seed", a->seed, "Python random.seed of the request shuffle (bench_serving --seed)")->capture_default_str();
  s.add_flag("--no-shuffle", a->no_shuffle, "send the requests in file order");
  s.add_option("--num-prompts", a->num_prompts, "use only the first N requests after shuffling");
  s.add_option("--server-info-path", a->server_info_path, "endpoint read before the timer stops")->capture_default_str();
  s.add_flag("--no-flush-cache", a->no_flush, "skip POST /flush_cache before the timed part");
  s.add_option("--request-timeout", a->timeout, "seconds per request")->capture_default_str();
  s.add_flag("--quiet", a->quiet, "no progress on stderr");
  s.add_option("--roofline-config", a->roofline_config,
               "the served model's config.json or directory, for each tier's roofline-implied "
               "duration (default: the server's model_path, when it is a directory here)");
  s.add_flag("--no-roofline", a->no_roofline, "print no roofline");
  return [a]() -> int { return run(*a); };
});

}  // namespace
