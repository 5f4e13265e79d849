#include "harness/bench_serve.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "harness/http.h"

namespace sala::harness {

namespace {
double since(BenchClock::time_point epoch) {
  return std::chrono::duration<double>(BenchClock::now() - epoch).count();
}
}  // namespace

nlohmann::ordered_json generate_payload(const std::string& prompt, int64_t max_new_tokens) {
  nlohmann::ordered_json sp;
  sp["temperature"] = 0.0;
  sp["max_new_tokens"] = max_new_tokens;
  sp["ignore_eos"] = true;
  nlohmann::ordered_json p;
  p["text"] = prompt;
  p["sampling_params"] = std::move(sp);
  p["stream"] = true;
  p["lora_path"] = nullptr;
  p["return_logprob"] = false;
  p["return_routed_experts"] = false;
  p["logprob_start_len"] = -1;
  return p;
}

RequestOutput send_generate(const std::string& base_url, const std::string& prompt,
                            int64_t max_new_tokens, BenchClock::time_point epoch,
                            double timeout_s) {
  RequestOutput out;
  std::string body = generate_payload(prompt, max_new_tokens).dump();
  auto cli = make_client(base_url, timeout_s);
  httplib::Request req;
  req.method = "POST";
  req.path = "/generate";
  req.body = std::move(body);
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "*/*");
  int status = 0;
  std::string error_body;
  out.start_s = since(epoch);
  SglangStreamParser parser(out, max_new_tokens);
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < 2000) error_body.append(data, n);
      return true;
    }
    return parser.feed(std::string_view(data, n), since(epoch));
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  bool sent = cli->send(req, res, err);
  double end = since(epoch);
  if (status != 0 && status != 200) {
    out.success = false;
    out.error = fmt::format("HTTP {}: {}", status, error_body.empty() ? res.body : error_body);
  } else if (!parser.ok()) {
    out.success = false;
    out.error = parser.error();
  } else if (!sent) {
    out.success = false;
    out.error = fmt::format("request failed: {}", httplib::to_string(err));
  } else {
    parser.finish(end);
    out.success = parser.ok();
    if (!out.success) out.error = parser.error();
  }
  return out;
}

std::string tier_label(int concurrency) {
  return concurrency <= 0 ? std::string("Sinf") : fmt::format("S{}", concurrency);
}

std::vector<int> parse_concurrency_list(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = s.find(',', pos);
    std::string tok = s.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    tok.erase(0, tok.find_first_not_of(" \t"));
    tok.erase(tok.find_last_not_of(" \t") + 1);
    std::string low = tok;
    std::transform(low.begin(), low.end(), low.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (low == "inf" || low == "max" || low == "unbounded" || low == "0") {
      out.push_back(0);
    } else {
      size_t used = 0;
      int v = 0;
      try {
        v = std::stoi(tok, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != tok.size() || v < 0) fail("bad --concurrency entry '{}' (want N or inf)", tok);
      out.push_back(v);
    }
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  if (out.empty()) fail("--concurrency is empty");
  return out;
}

void compute_metrics(TierResult& t) {
  std::vector<double> ttfts, itls, tpots, e2es;
  t.completed = t.failed = t.total_input = t.total_output = 0;
  for (const auto& o : t.outputs) {
    if (!o.success) {
      ++t.failed;
      continue;
    }
    ++t.completed;
    t.total_output += o.output_len;
    t.total_input += o.prompt_len;
    if (o.output_len > 1) tpots.push_back((o.latency_s - o.ttft_s) / static_cast<double>(o.output_len - 1));
    itls.insert(itls.end(), o.itl.begin(), o.itl.end());
    ttfts.push_back(o.ttft_s);
    e2es.push_back(o.latency_s);
  }
  double d = t.duration_s > 0 ? t.duration_s : 1e-9;
  t.request_throughput = static_cast<double>(t.completed) / d;
  t.input_throughput = static_cast<double>(t.total_input) / d;
  t.output_throughput = static_cast<double>(t.total_output) / d;
  t.total_throughput = static_cast<double>(t.total_input + t.total_output) / d;
  double e2e_sum = 0;
  for (double x : e2es) e2e_sum += x;
  t.achieved_concurrency = e2e_sum / d;
  auto ms = [](std::vector<double> v) {
    for (auto& x : v) x *= 1000.0;
    return summarize(std::move(v));
  };
  t.ttft_ms = ms(ttfts);
  t.itl_ms = ms(itls);
  t.tpot_ms = ms(tpots);
  t.e2e_ms = ms(e2es);

  // Output tokens and requests in flight per 1 s bucket (bench_serving's peak figures).
  t.tokens_per_second.clear();
  t.max_output_tokens_per_s = 0;
  t.max_concurrent_requests = 0;
  if (t.completed == 0) return;
  double min_start = 1e300, max_end = -1e300;
  for (const auto& o : t.outputs) {
    if (!o.success) continue;
    min_start = std::min(min_start, o.start_s);
    max_end = std::max(max_end, o.start_s + o.latency_s);
  }
  auto nb = static_cast<int64_t>(std::ceil(max_end - min_start)) + 1;
  std::vector<double> tok(static_cast<size_t>(nb), 0.0), conc(static_cast<size_t>(nb), 0.0);
  for (const auto& o : t.outputs) {
    if (!o.success) continue;
    double cur = o.start_s + o.ttft_s;
    auto add = [&](double tt) {
      auto b = static_cast<int64_t>(tt - min_start);  // truncation, as int() in Python
      if (b >= 0 && b < nb) tok[static_cast<size_t>(b)] += 1;
    };
    add(cur);
    for (double x : o.itl) {
      cur += x;
      add(cur);
    }
    auto rs = static_cast<int64_t>(o.start_s - min_start);
    auto re = static_cast<int64_t>(o.start_s + o.latency_s - min_start);
    for (int64_t s = rs; s < std::min(re + 1, nb); ++s) conc[static_cast<size_t>(s)] += 1;
  }
  t.max_output_tokens_per_s = *std::max_element(tok.begin(), tok.end());
  t.max_concurrent_requests = static_cast<int>(*std::max_element(conc.begin(), conc.end()));
  t.tokens_per_second = std::move(tok);
}

TierResult run_tier(const BenchOptions& opt, const std::vector<SpeedRow>& rows, int concurrency) {
  if (rows.empty()) fail("no requests to send");
  TierResult t;
  t.label = tier_label(concurrency);
  t.concurrency = concurrency;

  if (opt.warmup) {
    const auto& w = rows.front();
    int64_t n = std::min<int64_t>(w.output_len, 32);
    if (opt.progress) fmt::print(stderr, "[{}] warm-up (1 request, {} tokens)...\n", t.label, n);
    auto r = send_generate(opt.base_url, w.prompt, n, BenchClock::now(), opt.request_timeout_s);
    if (!r.success)
      fail("warm-up request failed, check the server and the data: {}", r.error.substr(0, 1000));
  }
  if (opt.flush_cache) {
    auto cli = make_client(opt.base_url, opt.flush_timeout_s + 10);
    auto res = cli->Post(fmt::format("/flush_cache?timeout={}", opt.flush_timeout_s));
    if (!res)
      fmt::print(stderr, "warning: POST /flush_cache failed: {}\n", httplib::to_string(res.error()));
    else if (res->status != 200)
      fmt::print(stderr, "warning: POST /flush_cache returned HTTP {}\n", res->status);
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(opt.sleep_before_s));
  const std::optional<EngineSteps> steps_before =
      read_engine_steps(opt.base_url, opt.server_info_path);

  const size_t n = rows.size();
  t.outputs.resize(n);
  std::atomic<size_t> next{0}, done{0};
  std::mutex mu;
  std::condition_variable cv;
  auto epoch = BenchClock::now();
  auto one = [&](size_t i) {
    auto& o = t.outputs[i];
    o = send_generate(opt.base_url, rows[i].prompt, rows[i].output_len, epoch, opt.request_timeout_s);
    o.prompt_len = rows[i].prompt_len;  // client-side count, as bench_serving
    {
      std::lock_guard<std::mutex> lk(mu);
      done.fetch_add(1);
    }
    cv.notify_all();
  };
  std::vector<std::thread> threads;
  if (concurrency <= 0) {
    threads.reserve(n);
    for (size_t i = 0; i < n; ++i) threads.emplace_back(one, i);
  } else {
    size_t workers = std::min<size_t>(static_cast<size_t>(concurrency), n);
    for (size_t w = 0; w < workers; ++w)
      threads.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < n;) one(i);
      });
  }
  size_t shown = static_cast<size_t>(-1);
  for (;;) {
    {
      // Wake as soon as the last request ends: the timer must not wait for a poll.
      std::unique_lock<std::mutex> lk(mu);
      cv.wait_for(lk, std::chrono::milliseconds(500), [&] { return done.load() == n; });
    }
    size_t d = done.load();
    if (d == n) break;
    if (opt.progress && d != shown) {
      fmt::print(stderr, "\r[{}] {}/{} requests done, {:.1f} s", t.label, d, n, since(epoch));
      shown = d;
    }
  }
  for (auto& th : threads) th.join();
  // bench_serving asks for the server info before it stops the timer; sala's has the steps.
  const std::optional<EngineSteps> steps_after =
      read_engine_steps(opt.base_url, opt.server_info_path);
  t.duration_s = since(epoch);
  if (steps_before && steps_after) t.engine_steps = steps_between(*steps_before, *steps_after);
  if (opt.progress) fmt::print(stderr, "\r[{}] {}/{} requests done, {:.2f} s\n", t.label, n, n, t.duration_s);
  compute_metrics(t);
  return t;
}

std::string format_tier(const TierResult& t) {
  std::string s;
  auto line = [&](const std::string& k, const std::string& v) { s += fmt::format("{:<40} {:<10}\n", k, v); };
  auto f2 = [](double x) { return fmt::format("{:.2f}", x); };
  s += fmt::format("\n{:=^50}\n", fmt::format(" Serving Benchmark Result: {} ", t.label));
  line("Max request concurrency:", t.concurrency > 0 ? std::to_string(t.concurrency) : "not set");
  if (!t.data_path.empty()) line("Data:", t.data_path);
  line("Successful requests:", std::to_string(t.completed));
  line("Failed requests:", std::to_string(t.failed));
  line("Benchmark duration (s):", f2(t.duration_s));
  line("Total input tokens:", std::to_string(t.total_input));
  line("Total generated tokens:", std::to_string(t.total_output));
  line("Request throughput (req/s):", f2(t.request_throughput));
  line("Input token throughput (tok/s):", f2(t.input_throughput));
  line("Output token throughput (tok/s):", f2(t.output_throughput));
  line("Peak output token throughput (tok/s):", f2(t.max_output_tokens_per_s));
  line("Peak concurrent requests:", std::to_string(t.max_concurrent_requests));
  line("Total token throughput (tok/s):", f2(t.total_throughput));
  line("Concurrency:", f2(t.achieved_concurrency));
  s += fmt::format("{:-^50}\n", "End-to-End Latency");
  line("Mean E2E Latency (ms):", f2(t.e2e_ms.mean));
  line("Median E2E Latency (ms):", f2(t.e2e_ms.p50));
  line("P99 E2E Latency (ms):", f2(t.e2e_ms.p99));
  s += fmt::format("{:-^50}\n", "Time to First Token");
  line("Mean TTFT (ms):", f2(t.ttft_ms.mean));
  line("Median TTFT (ms):", f2(t.ttft_ms.p50));
  line("P99 TTFT (ms):", f2(t.ttft_ms.p99));
  s += fmt::format("{:-^50}\n", "Time per Output Token (excl. 1st token)");
  line("Mean TPOT (ms):", f2(t.tpot_ms.mean));
  line("Median TPOT (ms):", f2(t.tpot_ms.p50));
  line("P99 TPOT (ms):", f2(t.tpot_ms.p99));
  s += fmt::format("{:-^50}\n", "Inter-Token Latency");
  line("Mean ITL (ms):", f2(t.itl_ms.mean));
  line("Median ITL (ms):", f2(t.itl_ms.p50));
  line("P99 ITL (ms):", f2(t.itl_ms.p99));
  line("Max ITL (ms):", f2(t.itl_ms.max));
  if (t.engine_steps) s += fmt::format("Engine steps (server): {}\n", format_engine_steps(*t.engine_steps));
  int shown = 0;
  for (const auto& o : t.outputs) {
    if (o.success) continue;
    if (shown++ == 3) {
      s += fmt::format("  ... {} more failures\n", t.failed - 3);
      break;
    }
    s += fmt::format("  failure: {}\n", o.error.substr(0, 300));
  }
  s += fmt::format("{:=^50}\n", "");
  return s;
}

double weighted_duration(const std::map<std::string, double>& d) {
  auto a = d.find("S1"), b = d.find("S8"), c = d.find("Sinf");
  if (a == d.end() || b == d.end() || c == d.end()) return -1;
  return 0.4 * a->second + 0.3 * b->second + 0.3 * c->second;
}

std::string format_summary(const std::vector<TierResult>& tiers,
                           const std::map<std::string, double>& baseline) {
  std::string s;
  bool base = !baseline.empty();
  bool roof = false;
  for (const auto& t : tiers) roof = roof || t.roofline_s > 0;
  s += fmt::format("\n{:<6} {:>12} {:>9} {:>9} {:>12} {:>12} {:>10} {:>10} {:>9} {:>9}{}{}\n", "tier",
                   "duration_s", "ok", "failed", "in_tok/s", "out_tok/s", "TTFT_p50", "TTFT_p99",
                   "ITL_p50", "ITL_p99", roof ? fmt::format(" {:>11} {:>9}", "roofline_s", "of_roof") : "",
                   base ? fmt::format(" {:>12} {:>8}", "baseline_s", "speedup") : "");
  std::map<std::string, double> durs;
  for (const auto& t : tiers) {
    durs[t.label] = t.duration_s;
    std::string b;
    if (base) {
      auto it = baseline.find(t.label);
      if (it != baseline.end())
        b = fmt::format(" {:>12.2f} {:>7.3f}x", it->second, it->second / t.duration_s);
      else
        b = fmt::format(" {:>12} {:>8}", "-", "-");
    }
    std::string r;
    if (roof)
      r = t.roofline_s > 0 ? fmt::format(" {:>11.4g} {:>8.1f}%", t.roofline_s,
                                         100 * t.roofline_s / t.duration_s)
                           : fmt::format(" {:>11} {:>9}", "-", "-");
    s += fmt::format("{:<6} {:>12.2f} {:>9} {:>9} {:>12.1f} {:>12.1f} {:>10.1f} {:>10.1f} {:>9.2f} {:>9.2f}{}{}\n",
                     t.label, t.duration_s, t.completed, t.failed, t.input_throughput,
                     t.output_throughput, t.ttft_ms.p50, t.ttft_ms.p99, t.itl_ms.p50, t.itl_ms.p99, r, b);
  }
  s += "(TTFT and ITL in ms";
  if (roof) s += "; roofline_s: prefill FLOPs at the tensor-core peak + decode steps at the weight-streaming floor, of_roof: roofline_s / duration_s";
  s += ")\n";
  double w = weighted_duration(durs);
  if (w >= 0) {
    s += fmt::format("Weighted duration 0.4*S1 + 0.3*S8 + 0.3*Sinf: {:.2f} s (lower is better)\n", w);
    double wb = weighted_duration(baseline);
    if (base && wb >= 0)
      s += fmt::format("Baseline weighted duration: {:.2f} s; speed-up {:.3f}x\n", wb, wb / w);
  } else {
    s += "Weighted duration: needs the tiers 1, 8 and inf\n";
  }
  return s;
}

nlohmann::json tier_json(const TierResult& t) {
  auto sj = [](const Summary& s) {
    return nlohmann::json{{"mean", s.mean}, {"median", s.p50}, {"p90", s.p90},
                          {"p99", s.p99}, {"max", s.max}, {"std", s.std}};
  };
  nlohmann::json reqs = nlohmann::json::array();
  for (const auto& o : t.outputs) {
    nlohmann::json r{{"success", o.success}, {"start_s", o.start_s}, {"ttft_s", o.ttft_s},
                     {"latency_s", o.latency_s}, {"prompt_len", o.prompt_len},
                     {"output_len", o.output_len}, {"itl_mean_s", mean(o.itl)}};
    if (!o.success) r["error"] = o.error.substr(0, 1000);
    reqs.push_back(std::move(r));
  }
  return nlohmann::json{
      {"label", t.label},
      {"max_concurrency", t.concurrency > 0 ? nlohmann::json(t.concurrency) : nlohmann::json(nullptr)},
      {"data", t.data_path},
      {"duration_s", t.duration_s},
      {"completed", t.completed},
      {"failed", t.failed},
      {"total_input_tokens", t.total_input},
      {"total_output_tokens", t.total_output},
      {"request_throughput", t.request_throughput},
      {"input_throughput", t.input_throughput},
      {"output_throughput", t.output_throughput},
      {"total_throughput", t.total_throughput},
      {"concurrency", t.achieved_concurrency},
      {"max_output_tokens_per_s", t.max_output_tokens_per_s},
      {"max_concurrent_requests", t.max_concurrent_requests},
      {"ttft_ms", sj(t.ttft_ms)},
      {"itl_ms", sj(t.itl_ms)},
      {"tpot_ms", sj(t.tpot_ms)},
      {"e2e_latency_ms", sj(t.e2e_ms)},
      {"output_tokens_per_second", t.tokens_per_second},
      {"requests", std::move(reqs)},
      {"roofline_s", t.roofline_s > 0 ? nlohmann::json(t.roofline_s) : nlohmann::json(nullptr)},
      {"roofline_prefill_s", t.roofline_s > 0 ? nlohmann::json(t.roofline_prefill_s) : nlohmann::json(nullptr)},
      {"roofline_decode_s", t.roofline_s > 0 ? nlohmann::json(t.roofline_decode_s) : nlohmann::json(nullptr)},
      {"engine_steps", t.engine_steps ? engine_steps_json(*t.engine_steps) : nlohmann::json(nullptr)},
  };
}

nlohmann::json results_json(const std::vector<TierResult>& tiers, const std::string& base_url,
                            const std::string& model, const std::map<std::string, double>& baseline) {
  nlohmann::json j;
  j["tool"] = "sala bench serve";
  j["url"] = base_url;
  j["model"] = model;
  j["tiers"] = nlohmann::json::array();
  std::map<std::string, double> durs;
  for (const auto& t : tiers) {
    j["tiers"].push_back(tier_json(t));
    durs[t.label] = t.duration_s;
  }
  double w = weighted_duration(durs);
  j["weighted_duration_s"] = w >= 0 ? nlohmann::json(w) : nlohmann::json(nullptr);
  if (!baseline.empty()) {
    nlohmann::json b;
    for (const auto& t : tiers) {
      auto it = baseline.find(t.label);
      if (it != baseline.end())
        b[t.label] = {{"baseline_duration_s", it->second}, {"speedup", it->second / t.duration_s}};
    }
    double wb = weighted_duration(baseline);
    if (wb >= 0 && w >= 0) b["weighted"] = {{"baseline_duration_s", wb}, {"speedup", wb / w}};
    j["baseline"] = std::move(b);
  }
  return j;
}

}  // namespace sala::harness
