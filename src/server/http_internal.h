// The HTTP front end's pieces below the routes: metrics, one generated
// sequence (outbox reading, incremental detokenizing, stop strings) and stream state.
// Internal to src/server (http_server.cpp).
#pragma once

#include <fmt/format.h>
#include <sys/socket.h>

#include <httplib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "server/http_guard.h"
#include "server/logprobs.h"
#include "server/protocol.h"
#include "server/tool_calls.h"
#include "tokenizer/detokenizer.h"

namespace sala::server::detail {


using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------- metrics

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double v) {
    std::lock_guard<std::mutex> lk(mu_);
    size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
    counts_[i]++;
    sum_ += v;
    n_++;
  }
  void render(std::string& out, const std::string& name, const std::string& help) const {
    std::lock_guard<std::mutex> lk(mu_);
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cum += counts_[i];
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
    }
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, n_, name, sum_, name, n_);
  }

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t n_ = 0;
};

struct Metrics {
  std::atomic<int64_t> http_requests{0}, http_errors{0}, client_disconnects{0}, stop_string_matches{0};
  std::atomic<int64_t> gen_requests{0}, chat_requests{0}, completion_requests{0};
  std::atomic<int64_t> in_flight{0};
  Histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120}};
  Histogram itl{{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2}};
  Histogram e2e{{0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800}};
};

// ---------------------------------------------------------------- one generated sequence

struct Seq {
  std::shared_ptr<RequestHandle> h;
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::unique_ptr<StopStringMatcher> stop;
  std::unique_ptr<ToolCallParser> tools;  // chat with tools: streamed tool calls
  SeqResult r;
  std::string id;
  bool counts_prompt = true;  // usage: count this sequence's prompt (false for n copies 2..n)
  bool keep_stop = false;     // the matched stop string / stop token stays in the text
  int32_t min_tokens = 0;     // text of the first min_tokens tokens is not matched for stops
  Clock::time_point start, last_token;
  bool got_token = false;
  double ttft_s = -1;  // for the request's log line
  // streaming bookkeeping
  size_t sent_bytes = 0;
  int32_t sent_tokens = 0;
  bool sent_first = false, sent_final = false;
  size_t sent_lp = 0;             // output logprobs already in a chunk
  bool sent_prompt_lp = false;    // echo: the prompt's logprobs went out
  int64_t text_offset = 0;        // completions' text_offset, continued across chunks
};

inline void finish_seq(Seq& s, const std::string& finish) {
  s.r.finished = true;
  s.r.finish = finish;
  s.r.e2e_latency = seconds_since(s.start);
}

// Text from the detokenizer into the stop matcher; true if a stop string ended the sequence.
// Before min_tokens tokens a stop string cannot end the sequence (vLLM skips the check), so
// that text goes straight to the output.
inline bool feed_text(Seq& s, const std::string& t, Metrics& m) {
  if (s.r.completion_tokens <= s.min_tokens) {
    s.r.text += t;
    return false;
  }
  auto res = s.stop->push(t);
  s.r.text += res.emit;
  if (res.stopped && s.keep_stop) s.r.text += res.matched;
  if (res.stopped) {
    s.h->cancel();
    s.r.matched_str = res.matched;
    finish_seq(s, "stop");
    m.stop_string_matches++;
    return true;
  }
  return false;
}

// Reads at most one engine event for `s`; true if anything changed.
inline bool pump(Seq& s, std::chrono::milliseconds timeout, Metrics& m) {
  if (s.r.finished) return false;
  TokenEvent ev;
  if (!s.h->next(ev, timeout)) return false;
  const auto now = Clock::now();
  if (ev.prompt_tokens > 0) s.r.prompt_tokens = ev.prompt_tokens;
  for (auto& lp : ev.prompt_logprobs) s.r.prompt_logprobs.push_back(std::move(lp));
  const size_t nt = ev.tokens.size();
  if (nt > 0) {
    if (!s.got_token) {
      s.ttft_s = std::chrono::duration<double>(now - s.start).count();
      m.ttft.observe(s.ttft_s);
    } else {
      const double gap = std::chrono::duration<double>(now - s.last_token).count() / double(nt);
      for (size_t i = 0; i < nt; ++i) m.itl.observe(gap);
    }
    s.got_token = true;
    s.last_token = now;
  }
  size_t lp_used = 0;
  for (size_t i = 0; i < nt; ++i) {
    const int32_t id = ev.tokens[i];
    s.r.completion_tokens++;
    // The token that ended generation (EOS / stop_token_ids) is counted but never shown here
    // (keep_stop shows it below).
    if (ev.finished && ev.reason == FinishReason::StopToken && i + 1 == nt && id == ev.matched_stop_token)
      break;
    // A shown token's logprob, kept even when its text is cut by a stop string.
    if (i < ev.logprobs.size()) s.r.output_logprobs.push_back(std::move(ev.logprobs[lp_used++]));
    std::string t = s.detok->push(id);
    if (!t.empty() && feed_text(s, t, m)) return true;
  }
  if (!ev.finished) return true;
  // include_stop_str_in_output / no_stop_trim: the stop token's text stays (a special token
  // decodes to "" unless skip_special_tokens is false).
  if (ev.reason == FinishReason::StopToken && s.keep_stop && ev.matched_stop_token >= 0) {
    std::string t = s.detok->push(ev.matched_stop_token);
    if (!t.empty() && feed_text(s, t, m)) return true;
  }
  // The stop token that ended generation: not shown, but counted and scored (lm-eval's echo
  // requests drop the last entry as the generated one, whatever it is).
  if (ev.reason == FinishReason::StopToken)
    for (size_t i = lp_used; i < ev.logprobs.size(); ++i)
      s.r.output_logprobs.push_back(std::move(ev.logprobs[i]));
  if (ev.completion_tokens > s.r.completion_tokens) s.r.completion_tokens = ev.completion_tokens;
  std::string t = s.detok->flush();
  if (!t.empty() && feed_text(s, t, m)) return true;
  s.r.text += s.stop->flush();
  switch (ev.reason) {
    case FinishReason::Length: finish_seq(s, "length"); break;
    case FinishReason::StopToken:
      s.r.matched_token = ev.matched_stop_token;
      finish_seq(s, "stop");
      break;
    case FinishReason::Aborted:
      s.r.abort_message = "aborted";
      finish_seq(s, "abort");
      break;
    case FinishReason::Error:
      s.r.abort_message = ev.error.empty() ? "engine error" : ev.error;
      finish_seq(s, "abort");
      break;
    case FinishReason::None:
    case FinishReason::GrammarComplete: finish_seq(s, "stop"); break;  // SGLang: matched null
  }
  return true;
}

// Waits a little for progress on any unfinished sequence; true if anything changed.
inline bool pump_any(std::vector<Seq>& seqs, Metrics& m, std::chrono::milliseconds wait) {
  bool progressed = false;
  Seq* first = nullptr;
  if (seqs.size() == 1) return pump(seqs[0], wait, m);
  for (auto& s : seqs) {
    if (s.r.finished) continue;
    if (!first) first = &s;
    progressed |= pump(s, 0ms, m);
  }
  if (!progressed && first) progressed = pump(*first, std::min(wait, std::chrono::milliseconds(20)), m);
  return progressed;
}

inline bool all_finished(const std::vector<Seq>& seqs) {
  return std::all_of(seqs.begin(), seqs.end(), [](const Seq& s) { return s.r.finished; });
}

enum class Route { Generate, Chat, Completion };

// Everything a streaming response needs after the handler returned.
struct StreamState {
  Route route;
  std::vector<Seq> seqs;
  std::string id, model;
  int64_t created = 0;
  bool batch = false, include_usage = false;
  LogprobRequest logprobs;
  int interval = 1;
  bool started = false;
  Metrics* metrics = nullptr;

  void cancel_all() {
    for (auto& s : seqs)
      if (s.h) s.h->cancel();
  }
};

inline bool write_event(httplib::DataSink& sink, const json& j) {
  std::string line = "data: " + dump(j) + "\n\n";
  return sink.write(line.data(), line.size());
}

std::string render_metrics(const EngineStats& s, const Metrics& metrics, const GuardedServer& svr);
// http_stream.cpp: the request's log line counts (ids, tokens, TTFT) of its sequences, and one
// round of an SSE stream (wait for progress, write what is due; false: stop, the client is gone
// or the stream ended). `aborting`: the shutdown timeout passed, end with an error event.
void note_usage(const std::vector<Seq>& seqs);
json usage_of(const std::vector<Seq>& seqs);  // OpenAI usage: prompts counted once per prompt
bool stream_step(StreamState& st, httplib::DataSink& sink, Metrics& metrics,
                 const std::atomic<bool>& aborting, const LogprobFormatter& lpfmt);
json stats_json(const EngineStats& s);
json step_kinds_json(const EngineStats& s);  // engine_stats.step_kinds: steps and seconds by kind
json internal_states_json(const EngineStats& s);  // /get_server_info's internal_states
// Non-streaming answers. A request that finishes within 2 s is answered with a plain JSON body;
// a longer one with chunked encoding, a space a second while it runs, then the body.
void respond_when_done(httplib::Response& res, std::vector<Seq> seqs,
                       std::function<json(std::vector<Seq>&)> body, Metrics& metrics,
                       const std::atomic<bool>& aborting);

inline std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          uint64_t(Clock::now().time_since_epoch().count()));
  static const char* hex = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = hex[rng() & 15];
  return s;
}


}  // namespace sala::server::detail
