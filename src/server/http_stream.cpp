// The server's streamed answers (SSE): one round of a stream per call of the content
// provider (HttpServer::Impl::start_stream); a request's usage and its log line's counts.
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
      json j = st.route == Route::Chat
                   ? chat_chunk(st.id, st.model, st.created, s.r.index, delta, false, fin)
                   : completion_chunk(st.id, st.model, st.created, s.r.index, delta, fin);
      if (st.logprobs.enabled) {
        j["choices"][0]["logprobs"] =
            lpfmt.openai(st.route == Route::Chat, st.logprobs, s.r, s.sent_lp,
                         st.logprobs.prompt && !s.sent_prompt_lp, &s.text_offset);
        s.sent_lp = s.r.output_logprobs.size();
        s.sent_prompt_lp = true;
      }
      ok = write_event(sink, j);
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

}  // namespace sala::server::detail
