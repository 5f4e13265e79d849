// Client logic of `sala bench serve` and `sala eval` against a FAKE in-process HTTP server
// (cpp-httplib on 127.0.0.1, ephemeral port) that streams canned SGLang-style SSE chunks
// and canned chat answers. This tests the clients' request bodies, stream parsing, timing
// and concurrency control; it says nothing about the real server.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "harness/bench_serve.h"
#include "harness/eval.h"
#include "harness/svg_plot.h"

using namespace sala::harness;
using nlohmann::json;

namespace {

class FakeSglangServer {
 public:
  // Per /generate request: first chunk after ttft_ms, then one chunk every `interval`
  // tokens, `gap_ms` apart; the prompt "fail" gets HTTP 500, "streamerr" an error chunk.
  int ttft_ms = 40, gap_ms = 20, interval = 2;
  bool sala_steps = false;  // /get_server_info reports engine steps by kind, as sala does

  FakeSglangServer() {
    svr_.new_task_queue = [] { return new httplib::ThreadPool(32); };
    svr_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      log("GET /v1/models");
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})", "application/json");
    });
    svr_.Post("/flush_cache", [this](const httplib::Request& req, httplib::Response& res) {
      log("POST /flush_cache timeout=" + req.get_param_value("timeout"));
      res.set_content("ok", "text/plain");
    });
    svr_.Get("/get_server_info", [this](const httplib::Request&, httplib::Response& res) {
      log("GET /get_server_info");
      json info = {{"internal_states", json::array({json::object()})}};
      if (sala_steps) {  // sala's engine_stats.step_kinds, growing with every reading
        const int n = ++info_reads_;
        info["engine_stats"]["step_kinds"] = {
            {"prefill", {{"steps", 2 * n}, {"seconds", 0.1 * n}, {"forward_seconds", 0.09 * n}}},
            {"mixed", {{"steps", 0}, {"seconds", 0.0}, {"forward_seconds", 0.0}}},
            {"decode", {{"steps", 10 * n}, {"seconds", 0.05 * n}, {"forward_seconds", 0.04 * n}}}};
      }
      res.set_content(info.dump(), "application/json");
    });
    svr_.Post("/generate", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res); });
    svr_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { chat(req, res); });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    th_ = std::thread([this] { svr_.listen_after_bind(); });
  }
  ~FakeSglangServer() {
    svr_.stop();
    th_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lk(mu_);
    return events_;
  }
  std::vector<json> bodies() {
    std::lock_guard<std::mutex> lk(mu_);
    return bodies_;
  }
  int max_in_flight() const { return max_in_flight_.load(); }

 private:
  std::atomic<int> info_reads_{0};  // /get_server_info calls (sala_steps)
  void log(const std::string& e) {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(e);
  }

  void generate(const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body);
    std::string text = body["text"];
    int n = body["sampling_params"]["max_new_tokens"];
    {
      std::lock_guard<std::mutex> lk(mu_);
      events_.push_back("POST /generate " + std::to_string(n));
      bodies_.push_back(body);
    }
    if (text == "fail") {
      res.status = 500;
      res.set_content("{\"error\":{\"message\":\"injected failure\"}}", "application/json");
      return;
    }
    int now = ++in_flight_;
    for (int m = max_in_flight_.load(); now > m && !max_in_flight_.compare_exchange_weak(m, now);) {
    }
    auto sent = std::make_shared<int>(0);
    bool err = text == "streamerr";
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, n, sent, err](size_t, httplib::DataSink& sink) {
          std::this_thread::sleep_for(std::chrono::milliseconds(*sent == 0 ? ttft_ms : gap_ms));
          if (err) {
            std::string e = "data: {\"error\":{\"message\":\"stream broke\"}}\n\n";
            sink.write(e.data(), e.size());
            sink.done();
            return true;
          }
          *sent = std::min(n, *sent + interval);
          std::string t;
          for (int i = 0; i < *sent; ++i) t += "w";
          json c{{"text", t},
                 {"meta_info",
                  {{"id", "r"}, {"prompt_tokens", 5}, {"completion_tokens", *sent},
                   {"finish_reason", *sent == n ? json{{"type", "length"}, {"length", n}} : json(nullptr)}}}};
          std::string s = "data: " + c.dump() + "\n\n";
          if (*sent == n) {
            s += "data: [DONE]\n\n";
            // Leave the in-flight count before the client can see the end: the resource
            // releaser runs after the client may already have sent its next request.
            --in_flight_;
            *sent = n + 1;
          }
          sink.write(s.data(), s.size());
          if (*sent > n) sink.done();
          return true;
        },
        [this, sent, n](bool) {
          if (*sent <= n) --in_flight_;  // the stream ended early (error or disconnect)
        });
  }

  void chat(const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body);
    {
      std::lock_guard<std::mutex> lk(mu_);
      bodies_.push_back(body);
    }
    std::string q = body["messages"][0]["content"];
    std::string answer = q == "pick" ? "<think>ANSWER: A</think>ANSWER: B"
                         : q == "sum" ? "It is 1176."
                                      : "apple and cherry";
    if (q == "down") {
      res.status = 503;
      res.set_content("{\"error\":{\"message\":\"down\"}}", "application/json");
      return;
    }
    json r{{"id", "c"},
           {"object", "chat.completion"},
           {"choices", json::array({{{"index", 0},
                                     {"message", {{"role", "assistant"}, {"content", answer}}},
                                     {"finish_reason", "stop"}}})},
           {"usage", {{"prompt_tokens", 3}, {"completion_tokens", 4}, {"total_tokens", 7}}}};
    res.set_content(r.dump(), "application/json");
  }

  httplib::Server svr_;
  int port_ = 0;
  std::thread th_;
  std::mutex mu_;
  std::vector<std::string> events_;
  std::vector<json> bodies_;
  std::atomic<int> in_flight_{0}, max_in_flight_{0};
};

std::vector<SpeedRow> rows(int n, int out) {
  std::vector<SpeedRow> r;
  for (int i = 0; i < n; ++i) r.push_back({"prompt " + std::to_string(i), 3, out});
  return r;
}

BenchOptions fast_options(const FakeSglangServer& s) {
  BenchOptions o;
  o.base_url = s.url();
  o.sleep_before_s = 0.05;
  o.progress = false;
  return o;
}

}  // namespace

TEST(FakeServerBenchClient, StreamingRequestBodyAndTiming) {
  FakeSglangServer s;
  auto r = send_generate(s.url(), "hello there", 8, BenchClock::now(), 60);
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.output_len, 8);
  EXPECT_EQ(r.server_prompt_len, 5);
  EXPECT_GE(r.ttft_s, 0.035);
  EXPECT_LT(r.ttft_s, 1.0);
  // Chunks at 2, 4, 6, 8 tokens: 3 later chunks x 2 tokens = 6 ITL entries of ~gap/2.
  ASSERT_EQ(r.itl.size(), 6u);
  for (double x : r.itl) {
    EXPECT_GE(x, 0.005);
    EXPECT_LT(x, 0.5);
  }
  EXPECT_GE(r.latency_s, r.ttft_s + 0.05);
  auto b = s.bodies().at(0);
  EXPECT_EQ(b["text"], "hello there");
  EXPECT_EQ(b["sampling_params"]["temperature"], 0.0);
  EXPECT_EQ(b["sampling_params"]["max_new_tokens"], 8);
  EXPECT_EQ(b["sampling_params"]["ignore_eos"], true);
  EXPECT_EQ(b["stream"], true);
  EXPECT_TRUE(b["lora_path"].is_null());
  EXPECT_EQ(b["return_logprob"], false);
  EXPECT_EQ(b["return_routed_experts"], false);
  EXPECT_EQ(b["logprob_start_len"], -1);
}

TEST(FakeServerBenchClient, FailuresAreCountedNotFatal) {
  FakeSglangServer s;
  auto r = send_generate(s.url(), "fail", 4, BenchClock::now(), 60);
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.error.find("HTTP 500"), std::string::npos);
  auto e = send_generate(s.url(), "streamerr", 4, BenchClock::now(), 60);
  EXPECT_FALSE(e.success);
  EXPECT_NE(e.error.find("stream broke"), std::string::npos);
  auto dead = send_generate("http://127.0.0.1:1", "x", 4, BenchClock::now(), 5);
  EXPECT_FALSE(dead.success);

  auto rs = rows(3, 4);
  rs[1].prompt = "fail";
  auto t = run_tier(fast_options(s), rs, 1);
  EXPECT_EQ(t.completed, 2);
  EXPECT_EQ(t.failed, 1);
  EXPECT_NE(format_tier(t).find("injected failure"), std::string::npos);
}

TEST(FakeServerBenchClient, WarmupFailureAborts) {
  FakeSglangServer s;
  auto rs = rows(2, 4);
  rs[0].prompt = "fail";
  EXPECT_THROW(run_tier(fast_options(s), rs, 1), sala::Error);
}

TEST(FakeServerBenchClient, TierProtocolOrder) {
  FakeSglangServer s;
  auto t = run_tier(fast_options(s), rows(3, 40), 1);
  auto ev = s.events();
  // Warm-up with min(40, 32) tokens, flush, the server info (engine steps before the timer),
  // the 3 timed requests, then the server info again before the timer stops.
  std::vector<std::string> want{"POST /generate 32", "POST /flush_cache timeout=60",
                                "GET /get_server_info", "POST /generate 40", "POST /generate 40",
                                "POST /generate 40", "GET /get_server_info"};
  EXPECT_EQ(ev, want);
  EXPECT_FALSE(t.engine_steps.has_value()) << "an SGLang server reports no engine steps";
  EXPECT_EQ(t.completed, 3);
  EXPECT_EQ(t.total_output, 120);
  EXPECT_EQ(t.total_input, 9);
  EXPECT_EQ(BenchOptions().sleep_before_s, 1.0);
  EXPECT_EQ(BenchOptions().server_info_path, "/get_server_info");
}

TEST(FakeServerBenchClient, EngineStepsAreTheTiersDifference) {
  FakeSglangServer s;
  s.sala_steps = true;
  const TierResult t = run_tier(fast_options(s), rows(2, 8), 1);
  ASSERT_TRUE(t.engine_steps.has_value());
  // Readings 1 (before the timer) and 2 (before it stops): one reading's worth of each kind.
  EXPECT_EQ(t.engine_steps->prefill.steps, 2);
  EXPECT_NEAR(t.engine_steps->prefill.seconds, 0.1, 1e-12);
  EXPECT_NEAR(t.engine_steps->decode.forward_seconds, 0.04, 1e-12);
  EXPECT_EQ(t.engine_steps->mixed.steps, 0);
  EXPECT_EQ(format_engine_steps(*t.engine_steps),
            "prefill 2 x 50.00 ms (forward 45.00), decode 10 x 5.00 ms (forward 4.00)");
  EXPECT_NE(format_tier(t).find("Engine steps (server): prefill 2 x 50.00 ms"), std::string::npos);
  EXPECT_EQ(tier_json(t)["engine_steps"]["decode"]["steps"], 10);
}

TEST(FakeServerBenchClient, ConcurrencyTiersBoundInFlightRequests) {
  // Each request: ~40 ms + 3 x 20 ms = ~100 ms.
  double d1 = 0, dinf = 0;
  {
    FakeSglangServer s;
    auto t = run_tier(fast_options(s), rows(6, 8), 1);
    EXPECT_EQ(s.max_in_flight(), 1);
    EXPECT_EQ(t.completed, 6);
    d1 = t.duration_s;
    EXPECT_GE(d1, 0.55);
  }
  {
    FakeSglangServer s;
    auto t = run_tier(fast_options(s), rows(6, 8), 2);
    EXPECT_LE(s.max_in_flight(), 2);
    EXPECT_GE(s.max_in_flight(), 2);
  }
  {
    FakeSglangServer s;
    auto t = run_tier(fast_options(s), rows(6, 8), 0);
    // All 6 are sent at once; on a loaded 2-core machine a thread may start late, so the
    // server must see most (not necessarily all) of them overlap.
    EXPECT_GE(s.max_in_flight(), 4);
    EXPECT_EQ(t.completed, 6);
    dinf = t.duration_s;
    EXPECT_GE(dinf, 0.09);
    // The timer covers every request's end.
    for (const auto& o : t.outputs) EXPECT_LE(o.start_s + o.latency_s, t.duration_s);
    EXPECT_EQ(t.max_concurrent_requests, 6);
    // Report, JSON and plot render.
    std::vector<TierResult> tiers{t};
    auto j = results_json(tiers, s.url(), "fake-model", {{"Sinf", 2 * dinf}});
    EXPECT_NEAR(j["baseline"]["Sinf"]["speedup"].get<double>(), 2.0, 1e-9);
    EXPECT_NE(render_bench_svg(tiers, "t").find("</svg>"), std::string::npos);
  }
  EXPECT_LT(dinf, d1);
}

TEST(FakeServerBenchClient, BaselineFormats) {
  std::string ours = ::testing::TempDir() + "/ours.json";
  {
    TierResult a;
    a.label = "S1";
    a.duration_s = 10;
    std::ofstream(ours) << results_json({a}, "u", "m", {}).dump();
  }
  EXPECT_EQ(load_baseline(ours).at("S1"), 10);
  std::string bs = ::testing::TempDir() + "/bs.jsonl";
  // As sglang.bench_serving --output-file writes it (Python json: Infinity is a bare token).
  std::ofstream(bs) << "{\"request_rate\": Infinity, \"tag\": \"NaN Infinity\", \"max_concurrency\": 1, \"duration\": 3.5}\n"
                       "{\"request_rate\": Infinity, \"max_concurrency\": null, \"x\": -Infinity, \"duration\": 1.5}\n";
  auto b = load_baseline(bs);
  EXPECT_EQ(b.at("S1"), 3.5);
  EXPECT_EQ(b.at("Sinf"), 1.5);
}

TEST(FakeServerEvalClient, RequestsAndScores) {
  FakeSglangServer s;
  std::vector<EvalItem> items(4);
  items[0] = {0, "pick", "mcq", "B"};
  items[1] = {1, "sum", "qa", "1176"};
  items[2] = {2, "words", "cwe", json::array({"apple", "banana", "cherry", "date"})};
  items[3] = {3, "down", "qa", "x"};
  EvalOptions o;
  o.base_url = s.url();
  o.concurrency = 3;
  o.max_tokens = 123;
  o.progress = false;
  auto recs = run_eval(o, items);
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_DOUBLE_EQ(recs[0].score, 1);
  EXPECT_DOUBLE_EQ(recs[1].score, 1);
  EXPECT_DOUBLE_EQ(recs[2].score, 0.5);
  EXPECT_DOUBLE_EQ(recs[3].score, 0);
  EXPECT_NE(recs[3].error.find("503"), std::string::npos);
  EXPECT_EQ(recs[0].finish_reason, "stop");
  EXPECT_EQ(recs[0].completion_tokens, 4);
  auto sum = summarize_eval(recs);
  EXPECT_DOUBLE_EQ(sum.ori_accuracy, 62.5);
  EXPECT_EQ(sum.errors, 1);
  for (const auto& b : s.bodies()) {
    EXPECT_EQ(b["model"], "fake-model");
    EXPECT_EQ(b["temperature"], 0);
    EXPECT_EQ(b["max_tokens"], 123);
    EXPECT_EQ(b["stop"], json::array({"</s>", "<|im_end|>"}));
    ASSERT_EQ(b["messages"].size(), 1u);
    EXPECT_EQ(b["messages"][0]["role"], "user");
  }
  auto rj = eval_record_json(recs[2]);
  EXPECT_EQ(rj["index"], 2);
  EXPECT_EQ(rj["task"], "cwe");
  EXPECT_EQ(rj["prediction"], "apple and cherry");
}
