// The HTTP front end: SGLang routes (/generate, /flush_cache, /get_server_info), OpenAI
// routes (/v1/chat/completions, /v1/completions, /v1/models), /health and /metrics, over
// cpp-httplib. See ../shared/API.md for the contract.
//
// Threads: each connection runs on a worker of a large pool (an idle keep-alive connection
// holds its worker). A worker parses and validates the request (protocol.h), applies the
// chat template, tokenizes, submits to the engine, then reads the request's outbox,
// detokenizes incrementally, matches stop strings and writes the response (SSE chunks when
// streaming). It never touches the model. A write failure (client gone) or a stop-string
// match cancels the engine request, which frees its KV pages and state slot.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace sala::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;                // 0: any free port (see HttpServer::bind)
  std::string model_path;          // as given on the command line
  std::string served_model_name;   // empty: model_path (SGLang's default)
  std::string api_key;             // empty: no authentication
  int stream_interval = 1;         // tokens between streamed chunks
  int http_threads = 512;          // worker pool: >= the max concurrent connections
  int listen_backlog = 1024;
  int keep_alive_timeout_s = 5;
  int64_t max_context_len = 0;     // prompt + completion limit of one request
  int32_t vocab_size = 0;
  int32_t max_n = 64;
  std::vector<std::string> allowed_origins;  // CORS origins ("*": any); empty: none
  bool protect_metrics = false;    // /metrics needs the API key too
  int shutdown_timeout_s = 30;     // drain: how long running requests may finish
  int header_timeout_s = 10;       // a request's line + headers must arrive within this
  int body_timeout_s = 60;         // and its whole body within this after the headers
  int max_connections = 0;         // 0: http_threads - 16 (the rest answer 503 at once)
  size_t max_body_bytes = size_t(256) << 20;
  bool log_requests = true;        // one JSON line per request on stderr
  std::string tool_call_parser = "hermes";  // the tool-call format of answers; "none": no tools
  nlohmann::json server_args = nlohmann::json::object();  // echoed by /get_server_info
};

class HttpServer {
 public:
  // `engine`, `tok` and `tmpl` (may be null: chat completions then answer 400) must outlive
  // the server.
  HttpServer(ServerOptions opts, Engine& engine, const Tokenizer& tok, const ChatTemplate* tmpl);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (listen backlog opts.listen_backlog); returns the bound port. Throws
  // sala::Error if the address cannot be bound.
  int bind();
  // Serves until stop(); call bind() first.
  void run();
  // Graceful: new requests get 503, running ones may finish for opts.shutdown_timeout_s, then
  // every stream ends with an error event and [DONE]; then the server stops. Any thread.
  void shutdown();
  void stop();
  std::string model_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sala::server
