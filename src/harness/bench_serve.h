// `sala bench serve`: the serving benchmark of the SOAR toolkit (sglang.bench_serving
// --backend sglang --dataset-name custom), run at several concurrency tiers.
// Per tier: one warm-up request (max_new_tokens = min(output_len, 32); abort if it fails),
// POST /flush_cache, sleep 1 s, start the timer, send every request through streaming
// POST /generate with at most `concurrency` in flight (0 = all at once, one thread each),
// GET the server-info endpoint, stop the timer. Metrics as bench_serving's
// calculate_metrics (see sse.h for TTFT / ITL / latency).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/engine_steps.h"
#include "harness/speed_data.h"
#include "harness/sse.h"
#include "harness/stats.h"

namespace sala::harness {

using BenchClock = std::chrono::steady_clock;

struct BenchOptions {
  std::string base_url;                           // http://host:port
  std::string server_info_path = "/get_server_info";
  double request_timeout_s = 6 * 3600;            // aiohttp timeout of bench_serving
  double flush_timeout_s = 60;
  double sleep_before_s = 1.0;
  bool warmup = true;
  bool flush_cache = true;
  bool progress = true;                           // progress line on stderr
};

// The exact /generate body bench_serving sends.
nlohmann::ordered_json generate_payload(const std::string& prompt, int64_t max_new_tokens);

// One streaming /generate request; times are seconds since `epoch`.
RequestOutput send_generate(const std::string& base_url, const std::string& prompt,
                            int64_t max_new_tokens, BenchClock::time_point epoch,
                            double timeout_s);

struct TierResult {
  std::string label;          // S1, S8, Sinf, S<n>
  int concurrency = 0;        // 0 = unbounded
  std::string data_path;
  double duration_s = 0;
  std::vector<RequestOutput> outputs;
  // Metrics (compute_metrics).
  int64_t completed = 0, failed = 0, total_input = 0, total_output = 0;
  double request_throughput = 0, input_throughput = 0, output_throughput = 0,
         total_throughput = 0, achieved_concurrency = 0;
  Summary ttft_ms, itl_ms, tpot_ms, e2e_ms;
  double max_output_tokens_per_s = 0;
  int max_concurrent_requests = 0;
  std::vector<double> tokens_per_second;  // output tokens in each 1 s bucket
  // The roofline-implied duration of what the tier ran (cli/serve_roofline.h), 0 if unknown.
  double roofline_s = 0, roofline_prefill_s = 0, roofline_decode_s = 0;
  // The server's engine steps during the tier (engine_steps.h); nullopt where it has none.
  std::optional<EngineSteps> engine_steps;
};

std::string tier_label(int concurrency);
// "1,8,inf" -> {1, 8, 0}
std::vector<int> parse_concurrency_list(const std::string& s);

// Fills the metric fields of `t` from t.outputs and t.duration_s.
void compute_metrics(TierResult& t);

TierResult run_tier(const BenchOptions& opt, const std::vector<SpeedRow>& rows, int concurrency);

// The bench_serving-style report of one tier.
std::string format_tier(const TierResult& t);
// Table of all tiers, the weighted figure, and speed-ups against `baseline` (label -> s).
std::string format_summary(const std::vector<TierResult>& tiers,
                           const std::map<std::string, double>& baseline);

// 0.4*S1 + 0.3*S8 + 0.3*Sinf; < 0 when a tier is missing.
double weighted_duration(const std::map<std::string, double>& durations);

nlohmann::json tier_json(const TierResult& t);
nlohmann::json results_json(const std::vector<TierResult>& tiers, const std::string& base_url,
                            const std::string& model, const std::map<std::string, double>& baseline);

// Durations per tier label from a results file of ours ({"tiers": [...]}) or from
// sglang.bench_serving --output-file JSONL lines ("duration", "max_concurrency").
std::map<std::string, double> load_baseline(const std::string& path);

}  // namespace sala::harness
