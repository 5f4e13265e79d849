// The server's streamed answers (SSE): one round of a stream per call of the content
// provider (HttpServer::Impl::start_stream); non-streamed answers that take long
// (respond_when_done); a request's usage and its log line's counts.
#include "server/http_internal.h"

namespace sala::server::detail {

using namespace std::chrono_literals;

// The request's log line: ids and token counts (the connection layer prints it).
void note_usage(const std::vector<Seq>& seqs) {
  RequestRecord* r = current_request();
  if (!r) return;
  r->prompt_tokens = r->completion_tokens = 0;
  for (auto& s : seqs) {
    if (s.counts_prompt) r->prompt_tokens += s.r.prompt_tokens;
    r->completion_tokens += s.r.completion_tokens;
    if (s.ttft_s >= 0 && (r->ttft_s < 0 || s.ttft_s < r->ttft_s)) r->ttft_s = s.ttft_s;
  }
}

json usage_of(const std::vector<Seq>& seqs) {
  int64_t p = 0, c = 0;
  for (auto& s : seqs) {
    if (s.counts_prompt) p += s.r.prompt_tokens;
    c += s.r.completion_tokens;
  }
  return usage_json(p, c);
}

// One round of the stream: wait for progress, write what is due. false: stop (client gone).
bool stream_step(StreamState& st, httplib::DataSink& sink, Metrics& metrics,
                 const std::atomic<bool>& aborting, const LogprobFormatter& lpfmt) {
  if (!sink.is_writable()) {
    metrics.client_disconnects++;
    st.cancel_all();
    return false;
  }
  if (aborting) {  // shutdown timeout: a clear end instead of a cut connection
    st.cancel_all();
    note_usage(st.seqs);
    if (RequestRecord* r = current_request()) r->error = "aborted: server shutting down";
    const bool ok = write_event(sink, error_body(503, "The server is shutting down; the request was aborted", "",
                                                 "server_error", "shutting_down")) &&
                    sink.write("data: [DONE]\n\n", 14);
    sink.done();
    return ok;
  }
  bool ok = true;
  if (!st.started) {
    st.started = true;
    if (st.route == Route::Chat)
      for (auto& s : st.seqs)
        ok = ok && write_event(sink, chat_chunk(st.id, st.model, st.created, s.r.index, std::nullopt, true, std::nullopt));
  }
  if (ok && !all_finished(st.seqs)) pump_any(st.seqs, metrics, 100ms);
  for (auto& s : st.seqs) {
    if (!ok) break;
    if (s.sent_final) continue;
    const bool new_text = s.r.text.size() > s.sent_bytes;
    // Echo with logprobs: the first chunk carries the prompt's logprobs, all of them.
    const bool prompt_lp_wait = st.route == Route::Completion && st.logprobs.prompt &&
                                !s.sent_prompt_lp && !s.r.finished &&
                                s.r.prompt_logprobs.size() < size_t(s.r.prompt_tokens);
    const bool due = !prompt_lp_wait &&
                     (s.r.finished || (!s.sent_first && new_text) ||
                      (s.r.completion_tokens - s.sent_tokens >= st.interval));
    if (!due) continue;
    if (st.route == Route::Generate) {
      json j = generate_result(s.r, s.id, st.batch);
      if (st.logprobs.enabled) lpfmt.sglang(j["meta_info"], s.r, st.logprobs);
      ok = write_event(sink, j);
    } else if (new_text || s.r.finished) {
      std::optional<std::string> fin;
      if (s.r.finished) fin = openai_finish_reason(s.r);
      std::string delta = s.r.text.substr(s.sent_bytes);
      json calls;
      if (s.tools) {  // tool calls out of the text: content and tool_calls deltas
        ToolCallParser::Out a = s.tools->push(delta), b;
        if (s.r.finished) b = s.tools->finish();
        delta = a.content + b.content;
        calls = a.calls;
        for (auto& c : b.calls) calls.push_back(std::move(c));
        if (fin && *fin == "stop" && s.tools->calls() > 0) fin = "tool_calls";
      }
      json j = st.route == Route::Chat
                   ? chat_chunk(st.id, st.model, st.created, s.r.index, delta, false, fin)
                   : completion_chunk(st.id, st.model, st.created, s.r.index, delta, fin);
      // A tool call's text is held until its block closes: no empty chunks meanwhile.
      const bool empty = s.tools && delta.empty() && calls.empty() && !fin;
      if (!calls.empty()) j["choices"][0]["delta"]["tool_calls"] = std::move(calls);
      if (s.tools && delta.empty()) j["choices"][0]["delta"].erase("content");
      if (st.logprobs.enabled) {
        j["choices"][0]["logprobs"] =
            lpfmt.openai(st.route == Route::Chat, st.logprobs, s.r, s.sent_lp,
                         st.logprobs.prompt && !s.sent_prompt_lp, &s.text_offset);
        s.sent_lp = s.r.output_logprobs.size();
        s.sent_prompt_lp = true;
      }
      if (!empty) ok = write_event(sink, j);
    }
    s.sent_bytes = s.r.text.size();
    s.sent_tokens = s.r.completion_tokens;
    s.sent_first = s.sent_first || new_text;
    if (s.r.finished) {
      s.sent_final = true;
      metrics.e2e.observe(s.r.e2e_latency);
    }
  }
  if (!ok) {
    metrics.client_disconnects++;
    st.cancel_all();
    return false;
  }
  if (std::all_of(st.seqs.begin(), st.seqs.end(), [](const Seq& s) { return s.sent_final; })) {
    if (st.include_usage) {
      json u = usage_of(st.seqs);
      ok = write_event(sink, usage_chunk(st.route == Route::Chat ? "chat.completion.chunk" : "text_completion",
                                         st.id, st.model, st.created, u["prompt_tokens"], u["completion_tokens"]));
    }
    note_usage(st.seqs);
    static const std::string done = "data: [DONE]\n\n";
    ok = ok && sink.write(done.data(), done.size());
    sink.done();
    return ok;
  }
  return true;
}

// Non-streaming answers. A request that finishes within kQuickAnswer is answered with a
// plain JSON body. A longer one is answered with chunked transfer encoding: a space (JSON
// allows leading whitespace) every second while it runs, then the body. The spaces are how
// a client that went away is noticed (cpp-httplib gives handlers no socket): the write
// fails, and the request is cancelled, its KV pages and state slot freed.
void respond_when_done(httplib::Response& res, std::vector<Seq> seqs,
                       std::function<json(std::vector<Seq>&)> body, Metrics& metrics,
                       const std::atomic<bool>& aborting) {
  static constexpr auto kQuickAnswer = std::chrono::seconds(2);
  const auto deadline = Clock::now() + kQuickAnswer;
  while (!all_finished(seqs) && Clock::now() < deadline) pump_any(seqs, metrics, 100ms);
  if (all_finished(seqs)) {
    for (auto& s : seqs) metrics.e2e.observe(s.r.e2e_latency);
    note_usage(seqs);
    res.status = 200;
    res.set_content(dump(body(seqs)), "application/json");
    return;
  }
  auto st = std::make_shared<std::vector<Seq>>(std::move(seqs));
  auto last_space = std::make_shared<Clock::time_point>(Clock::now());
  res.set_chunked_content_provider(
      "application/json", [&metrics, &aborting, st, body, last_space](size_t, httplib::DataSink& sink) {
        if (aborting)  // shutdown timeout: the engine ends them, the body says "abort"
          for (auto& s : *st)
            if (s.h) s.h->cancel();
        pump_any(*st, metrics, 1000ms);
        if (!all_finished(*st)) {
          if (Clock::now() - *last_space < std::chrono::seconds(1)) return true;
          *last_space = Clock::now();
          if (!sink.is_writable() || !sink.write(" ", 1)) {
            metrics.client_disconnects++;
            for (auto& s : *st)
              if (s.h) s.h->cancel();
            return false;
          }
          return true;
        }
        for (auto& s : *st) metrics.e2e.observe(s.r.e2e_latency);
        note_usage(*st);
        const std::string out = dump(body(*st));
        sink.write(out.data(), out.size());
        sink.done();
        return true;
      },
      [st](bool) {
        for (auto& s : *st)  // ended early (client gone): nothing may keep running
          if (s.h && !s.r.finished) s.h->cancel();
      });
}

}  // namespace sala::server::detail
