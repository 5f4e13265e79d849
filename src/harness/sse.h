// Parsing of SGLang's streaming /generate response (server-sent events), with the exact
// timing definitions of sglang.bench_serving (async_request_sglang_generate):
//  * every non-empty line (after strip) is an event; a "data: " prefix is removed;
//  * latency = arrival of the last event (including "data: [DONE]") - request start;
//  * TTFT = arrival of the first chunk whose "text" is non-empty;
//  * each later chunk with non-empty text and k = completion_tokens - previous > 0 new tokens
//    adds k ITL entries of (gap since the previous counted chunk) / k; chunks with k == 0
//    are skipped entirely (they do not move the "previous" timestamp);
//  * output_len = meta_info.completion_tokens of the last chunk with text (else the requested
//    max_new_tokens).
// One deliberate difference: a chunk carrying an "error" object or a line that is not JSON
// marks the request failed (bench_serving would raise on bad JSON, and ignore "error").
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sala::harness {

struct RequestOutput {
  bool success = false;
  std::string error;
  double start_s = 0;    // request start on the benchmark clock
  double ttft_s = 0;     // 0 when no text ever arrived
  double latency_s = 0;  // end-to-end
  int64_t prompt_len = 0;         // client-side token count of the prompt (or server's)
  int64_t output_len = 0;         // tokens generated (server's completion_tokens)
  int64_t server_prompt_len = -1; // meta_info.prompt_tokens when the server sent it
  std::vector<double> itl;        // seconds, one per token after the first
  std::string generated_text;
};

// Splits a byte stream into stripped non-empty lines.
class LineSplitter {
 public:
  // Appends bytes; returns the complete lines (without '\n', stripped of whitespace).
  std::vector<std::string> feed(std::string_view bytes);
  // The unterminated tail, stripped (empty if none); clears it.
  std::string flush();

 private:
  std::string buf_;
};

class SglangStreamParser {
 public:
  // `out.start_s` must be set; times given to feed() are on the same clock.
  SglangStreamParser(RequestOutput& out, int64_t requested_output_len);
  // Bytes that arrived at time `now` (seconds). Returns false once the stream is bad.
  bool feed(std::string_view bytes, double now);
  // End of body: processes a trailing unterminated line.
  bool finish(double now);
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  bool saw_done() const { return saw_done_; }

 private:
  bool line(const std::string& l, double now);
  RequestOutput& out_;
  LineSplitter split_;
  std::string error_;
  bool saw_done_ = false;
  bool have_first_ = false;
  double most_recent_ = 0;
  int64_t last_len_ = 0;
};

}  // namespace sala::harness
