// `sala serve`: the SGLang/OpenAI-compatible HTTP server (../shared/API.md §4, SGLang's flag
// names). With no --model-path it serves $SALA_MODEL_DIR or the bundled tiny model.
// requires: sala_server sala_engine
#include <fmt/core.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>
#include <fstream>
#include <sstream>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "server/http_server.h"
#include "server/launch.h"

namespace {

struct ServeOpts {
  std::string model_path, host = "127.0.0.1", served_model_name, api_key, device = "cpu";
  std::string dtype = "auto", kv_cache_dtype = "auto", quantization, log_level = "info";
  std::string attention_backend, tokenizer_path, api_key_file;
  std::vector<std::string> allowed_origins;
  bool protect_metrics = false, no_request_log = false;
  bool int4_prefill_gemm = true;  // LaunchOptions::int4_prefill_gemm
  int shutdown_timeout = 30, header_timeout = 10, body_timeout = 60, max_connections = 0, max_body_mb = 256;
  int port = 30000;
  int chunked_prefill_size = 2048;  // see --chunked-prefill-size's help
  std::string schedule_policy = "fair";
  std::string tool_call_parser = "hermes";
  int max_running_requests = 64;
  int max_queued_requests = 1024;
  int64_t max_total_tokens = 0;
  int context_length = 0;
  double mem_fraction_static = 0;
  int stream_interval = 1;
  int cpu_threads = 0;
  int tp_size = 1;
  int base_gpu_id = 0;  // SGLang's --base-gpu-id: the first GPU (rank r on base + r)
  int http_threads = 512;
  int kv_memory_mb = 512;
  bool disable_radix_cache = false, disable_cuda_graph = false, skip_server_warmup = false;
  bool trust_remote_code = false, dense_as_sparse = false, enable_metrics = false;
  std::string speculative_algorithm;  // "", NGRAM or STANDALONE
  std::string speculative_draft_model_path;  // STANDALONE's draft model
  int speculative_num_draft_tokens = 4, speculative_ngram_min = 1, speculative_ngram_max = 4;
  double speculative_ngram_min_accept = sala::SpeculativeOptions{}.ngram_min_accept;
};

int g_sig_pipe[2] = {-1, -1};
void on_signal(int sig) {
  unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_sig_pipe[1], &b, 1);
}

void warn(const std::string& msg) { fmt::print(stderr, "warning: {}\n", msg); }

// Every connection holds a descriptor: those at work, those queued for a worker, and the ones
// a swarm of slow clients opens before eviction closes them. A soft limit of 1024 (a common
// default) would make accept() fail under such a swarm while the hard limit is far higher.
void raise_fd_limit(int http_threads) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    const rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) == 0)
      fmt::print(stderr, "sala serve: open-file limit raised from {} to {} (one per connection)\n", was, rl.rlim_cur);
    else
      rl.rlim_cur = was;
  }
  if (rl.rlim_cur < rlim_t(http_threads) + 256)
    warn(fmt::format("the open-file limit is {} (ulimit -n), low for {} HTTP threads: a flood of connections "
                     "can use up the server's descriptors", rl.rlim_cur, http_threads));
}

int run_serve(const ServeOpts& o) {
  // SIGINT/SIGTERM: the handler writes to a pipe; a waiter thread stops the server. (Masking
  // is not enough: libraries start threads with the default mask before main.)
  if (::pipe(g_sig_pipe) != 0) sala::fail("pipe() failed");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that went away must not kill the server

  if (!o.attention_backend.empty()) warn(fmt::format("--attention-backend {} ignored: SALA picks its own kernels", o.attention_backend));
  if (o.skip_server_warmup) warn("--skip-server-warmup ignored: the server needs no warm-up request");
  if (o.disable_radix_cache) warn("--disable-radix-cache: there is no prefix cache (nothing to disable)");
  if (o.disable_cuda_graph && o.device != "cuda") warn("--disable-cuda-graph ignored on this device");
  if (o.trust_remote_code) warn("--trust-remote-code ignored: no remote code is ever run");
  if (o.mem_fraction_static > 0 && o.device != "cuda") warn("--mem-fraction-static ignored on the CPU backend (see --kv-memory-mb)");
  if (o.stream_interval < 1) sala::fail("--stream-interval must be >= 1");

  // The API key: --api-key, else --api-key-file, else $SALA_API_KEY (read here, once; a key
  // on the command line is visible to every user of the machine in ps).
  std::string api_key = o.api_key;
  if (api_key.empty() && !o.api_key_file.empty()) {
    std::ifstream f(o.api_key_file);
    if (!f) sala::fail("--api-key-file {}: cannot read it", o.api_key_file);
    std::stringstream ss;
    ss << f.rdbuf();
    api_key = ss.str();
    while (!api_key.empty() && (api_key.back() == '\n' || api_key.back() == '\r' || api_key.back() == ' ')) api_key.pop_back();
    if (api_key.empty()) sala::fail("--api-key-file {} is empty", o.api_key_file);
  }
  if (api_key.empty())
    if (const char* env = std::getenv("SALA_API_KEY"); env && *env) api_key = env;
  if (o.shutdown_timeout < 0) sala::fail("--shutdown-timeout must be >= 0");
  if (o.header_timeout < 1) sala::fail("--header-timeout must be >= 1");
  if (o.body_timeout < 1) sala::fail("--body-timeout must be >= 1");
  if (o.max_body_mb < 1) sala::fail("--max-body-mb must be >= 1");

  sala::server::LaunchOptions lo;
  lo.model_path = o.model_path.empty() ? sala::server::default_model_dir() : o.model_path;
  if (!o.tokenizer_path.empty() && o.tokenizer_path != lo.model_path)
    warn("--tokenizer-path ignored: the tokenizer is read from --model-path");
  lo.device = o.device;
  lo.dtype = o.dtype;
  lo.quantization = o.quantization;
  lo.kv_cache_dtype = o.kv_cache_dtype;
  lo.int4_prefill_gemm = o.int4_prefill_gemm;
  lo.cpu_threads = o.cpu_threads;
  lo.tp_size = o.tp_size;
  if (o.base_gpu_id < 0) sala::fail("--base-gpu-id {} must be >= 0", o.base_gpu_id);
  if (o.base_gpu_id != 0 && o.device != "cuda") warn("--base-gpu-id ignored on this device");
  lo.base_gpu_id = o.base_gpu_id;
  lo.engine.max_running_requests = o.max_running_requests;
  lo.engine.chunked_prefill_size = o.chunked_prefill_size;
  lo.engine.max_step_tokens = o.chunked_prefill_size + o.max_running_requests;
  lo.engine.max_queued_requests = o.max_queued_requests;
  lo.engine.max_context_len = o.context_length;
  lo.engine.dense_as_sparse = o.dense_as_sparse;
  lo.engine.schedule_policy = sala::parse_schedule_policy(o.schedule_policy);
  const bool standalone = o.speculative_algorithm == "STANDALONE";
  if (!o.speculative_draft_model_path.empty() && !standalone)
    throw sala::Error("--speculative-draft-model-path needs --speculative-algorithm STANDALONE");
  if (!o.speculative_algorithm.empty()) {
    if (o.speculative_algorithm != "NGRAM" && !standalone)
      throw sala::Error(fmt::format("--speculative-algorithm {}: only NGRAM and STANDALONE are "
                                    "implemented", o.speculative_algorithm));
    if (standalone && o.speculative_draft_model_path.empty())
      throw sala::Error("--speculative-algorithm STANDALONE needs --speculative-draft-model-path "
                        "(a SALA checkpoint with the same tokenizer)");
    if (o.speculative_ngram_min > o.speculative_ngram_max)
      throw sala::Error(fmt::format("--speculative-ngram-min-match-window-size {} is larger than "
                                    "--speculative-ngram-max-match-window-size {}",
                                    o.speculative_ngram_min, o.speculative_ngram_max));
    lo.engine.speculative = {o.speculative_num_draft_tokens, o.speculative_ngram_min,
                             o.speculative_ngram_max, standalone,
                             o.speculative_ngram_min_accept};
    lo.draft_model_path = o.speculative_draft_model_path;
  }
  lo.max_total_tokens = o.max_total_tokens;
  lo.kv_memory_bytes = size_t(o.kv_memory_mb) << 20;
  if (o.mem_fraction_static > 0) lo.mem_fraction_static = o.mem_fraction_static;
  lo.cuda_graphs = !o.disable_cuda_graph;
  fmt::print(stderr, "sala serve: loading {} on {}\n", lo.model_path, lo.device);
  sala::server::Loaded L = sala::server::launch(lo);

  sala::server::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.model_path = o.model_path.empty() ? lo.model_path : o.model_path;
  so.served_model_name = o.served_model_name;
  so.api_key = api_key;
  so.allowed_origins = o.allowed_origins;
  so.protect_metrics = o.protect_metrics;
  so.shutdown_timeout_s = o.shutdown_timeout;
  so.header_timeout_s = o.header_timeout;
  so.body_timeout_s = o.body_timeout;
  so.max_connections = o.max_connections;
  so.max_body_bytes = size_t(o.max_body_mb) << 20;
  so.log_requests = !o.no_request_log;
  so.tool_call_parser = o.tool_call_parser;
  so.stream_interval = o.stream_interval;
  so.http_threads = std::max(o.http_threads, 2 * o.max_running_requests + 64);
  raise_fd_limit(so.http_threads);
  so.max_context_len = L.max_context_len;
  so.vocab_size = L.vocab_size;
  const sala::EngineInfo info = L.engine->info();
  so.server_args = {
      {"model_path", so.model_path}, {"tokenizer_path", so.model_path}, {"host", o.host},
      {"port", o.port}, {"device", o.device}, {"dtype", o.dtype},
      {"quantization", o.quantization.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.quantization)},
      {"served_model_name", o.served_model_name.empty() ? so.model_path : o.served_model_name},
      {"chunked_prefill_size", info.options.chunked_prefill_size > 0 ? info.options.chunked_prefill_size : o.chunked_prefill_size},
      {"schedule_policy", sala::schedule_policy_name(info.options.schedule_policy)},
      {"max_running_requests", info.options.max_running_requests > 0 ? info.options.max_running_requests : o.max_running_requests},
      {"max_queued_requests", o.max_queued_requests}, {"max_total_num_tokens", L.max_total_tokens},
      {"max_total_tokens", L.max_total_tokens}, {"context_length", L.max_context_len},
      {"stream_interval", o.stream_interval}, {"kv_cache_dtype", o.kv_cache_dtype},
      {"dense_as_sparse", o.dense_as_sparse}, {"disable_radix_cache", true},
      {"speculative_algorithm", o.speculative_algorithm.empty() ? nlohmann::json(nullptr)
                                                                : nlohmann::json(o.speculative_algorithm)},
      {"speculative_num_draft_tokens", lo.engine.speculative.num_draft_tokens},
      {"speculative_draft_model_path", o.speculative_draft_model_path.empty()
                                           ? nlohmann::json(nullptr)
                                           : nlohmann::json(o.speculative_draft_model_path)},
      {"api_key_set", !api_key.empty()}, {"tp_size", o.tp_size}, {"dp_size", 1},
      {"base_gpu_id", o.base_gpu_id}};

  sala::server::HttpServer server(so, *L.engine, *L.tok, L.tmpl.get());
  const int port = server.bind();
  // The waiter is joined, not detached: a detached one could still be inside
  // server.shutdown() when run() returns and `server` is destroyed (a use after free that
  // the TSan build reported on every SIGTERM). Byte 0 on the pipe (no signal is 0) ends it
  // when run() returns on its own.
  std::thread waiter([&server] {
    unsigned char sig = 0;
    while (::read(g_sig_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;
    fmt::print(stderr, "sala serve: signal {}, shutting down\n", int(sig));
    server.shutdown();
  });
  fmt::print(stderr, "sala serve: model '{}', context {} tokens, KV pool {} tokens ({} KV cache), "
             "{} running max\n", server.model_id(), L.max_context_len, L.max_total_tokens,
             o.kv_cache_dtype, o.max_running_requests);
  fmt::print("sala serve: listening on http://{}:{}\n", o.host, port);
  std::fflush(stdout);
  server.run();
  const unsigned char wake = 0;
  [[maybe_unused]] ssize_t n = ::write(g_sig_pipe[1], &wake, 1);
  waiter.join();
  L.engine->shutdown();
  return 0;
}

sala::cli::Registrar reg("serve", "Serve a model over HTTP (SGLang /generate + OpenAI /v1 APIs)", [](CLI::App& app) {
  auto o = std::make_shared<ServeOpts>();
  app.add_option("--model-path,--model", o->model_path, "Model directory (default: $SALA_MODEL_DIR or the bundled tiny model)");
  app.add_option("--host", o->host, "Address to bind")->capture_default_str();
  app.add_option("--port", o->port, "Port (0: any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--served-model-name", o->served_model_name, "Model id in /v1/models (default: --model-path as given)");
  app.add_option("--chunked-prefill-size", o->chunked_prefill_size,
                 "Max prompt tokens of one request per step (and, with the running requests' "
                 "decode rows, of a step): smaller keeps running requests' inter-token latency "
                 "down while a long prompt prefills; on the H200 2048 prefills as fast as 8192")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--schedule-policy", o->schedule_policy,
                 "fair: each step serves the least recently served work first, smaller chunks first "
                 "(a short request is not stuck behind a long prefill); fcfs: running requests first, "
                 "then admission in arrival order")
      ->capture_default_str()->check(CLI::IsMember({"fair", "fcfs"}));
  app.add_option("--max-running-requests", o->max_running_requests, "Max requests decoding together")->capture_default_str();
  app.add_option("--speculative-algorithm", o->speculative_algorithm,
                 "NGRAM: requests draft tokens by prompt lookup, STANDALONE: by a draft model "
                 "(--speculative-draft-model-path); the drafts are verified in one step (greedy "
                 "output unchanged, sampled output in distribution)")
      ->check(CLI::IsMember({"NGRAM", "STANDALONE", "EAGLE", "EAGLE3"}));
  app.add_option("--speculative-draft-model-path", o->speculative_draft_model_path,
                 "STANDALONE: the draft model's directory (a SALA checkpoint with the target's "
                 "tokenizer; its own KV pages and state slots come out of --kv-memory-mb)");
  app.add_option("--speculative-num-draft-tokens", o->speculative_num_draft_tokens,
                 "Drafts per verify step, at most (adapted per request to its acceptance)")
      ->capture_default_str()->check(CLI::Range(1, 15));
  app.add_option("--speculative-ngram-min-match-window-size", o->speculative_ngram_min,
                 "NGRAM: shortest suffix that may match")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--speculative-ngram-max-match-window-size", o->speculative_ngram_max,
                 "NGRAM: longest suffix tried")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--speculative-ngram-min-accept", o->speculative_ngram_min_accept,
                 "NGRAM: propose the j-th draft only while the measured chance that the first "
                 "j drafts all pass is at least this (0: draft whenever a suffix matches)")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--max-queued-requests", o->max_queued_requests, "Queue bound; beyond it requests get 429")->capture_default_str();
  app.add_option("--max-total-tokens", o->max_total_tokens, "KV pool size in tokens (default: from --kv-memory-mb)");
  app.add_option("--context-length", o->context_length, "Max prompt + output tokens of one request (default: the model's)");
  app.add_option("--kv-memory-mb", o->kv_memory_mb, "CPU: memory for the KV pool and state slots")->capture_default_str();
  app.add_option("--mem-fraction-static", o->mem_fraction_static, "GPU memory fraction (ignored on the CPU)");
  app.add_option("--kv-cache-dtype", o->kv_cache_dtype, "auto | fp8_e4m3 | fp8_e5m2: the sparse layers' KV pages and compressed keys in FP8 (CPU; CUDA in bf16 mode)")->capture_default_str();
  app.add_option("--quantization", o->quantization,
                 "fp8: W8A8 e4m3 projections, quantized at load; w4a16: int4 projections "
                 "(RTN, group 128; the int4 GEMV on the GPU)");
  app.add_option("--int4-prefill-gemm", o->int4_prefill_gemm,
                 "CUDA, Hopper, int4 weights: prompts multiply through a second copy of the "
                 "codes in CUTLASS's shuffled order (+0.52 bytes per weight); false: "
                 "dequantize per step")
      ->capture_default_str();
  app.add_option("--dtype", o->dtype, "auto | float32 | bfloat16 (CPU numeric mode)")->capture_default_str();
  app.add_option("--stream-interval", o->stream_interval, "Tokens between streamed chunks")->capture_default_str();
  app.add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' (also --api-key-file, $SALA_API_KEY)");
  app.add_option("--api-key-file", o->api_key_file, "Read the API key from this file (used when --api-key is not given)");
  app.add_flag("--protect-metrics", o->protect_metrics, "/metrics needs the API key too (/health never does)");
  app.add_option("--allowed-origins", o->allowed_origins,
                 "CORS: browser origins allowed to call the API ('*': any; default: none, requests carrying "
                 "another Origin get 403)");
  app.add_option("--shutdown-timeout", o->shutdown_timeout,
                 "SIGTERM/SIGINT: seconds running requests may finish (new ones get 503); then streams end "
                 "with an error event")->capture_default_str();
  app.add_option("--header-timeout", o->header_timeout, "Seconds a client has to send a request's headers")->capture_default_str();
  app.add_option("--body-timeout", o->body_timeout, "Seconds a client has, after the headers, to send the whole body (else 408)")->capture_default_str();
  app.add_option("--max-connections", o->max_connections,
                 "Open connections at once (0: --http-threads - 16); when full the oldest idle one is closed, "
                 "else new ones get 503")->capture_default_str();
  app.add_option("--max-body-mb", o->max_body_mb, "Largest request body (compressed bodies are refused with 415)")->capture_default_str();
  app.add_flag("--no-request-log", o->no_request_log, "Do not print one JSON line per request on stderr");
  app.add_option("--tool-call-parser", o->tool_call_parser,
                 "Tool-call format of answers: hermes (<tool_call>{json}</tool_call>, ChatML / Qwen models; "
                 "qwen25 is the same) or none (requests with tools get 400)")
      ->check(CLI::IsMember({"hermes", "qwen25", "none"}))->capture_default_str();
  app.add_option("--device", o->device, "cpu | cuda")->capture_default_str();
  app.add_option("--cpu-threads", o->cpu_threads, "CPU backend threads (0: all cores)")->capture_default_str();
  app.add_option("--http-threads", o->http_threads, "HTTP worker threads (>= max concurrent connections)")->capture_default_str();
  app.add_option("--log-level", o->log_level, "Log level")->capture_default_str();
  app.add_option("--tp-size,--tp", o->tp_size,
                 "Tensor-parallel ranks, one thread each (CUDA: one GPU each, over NCCL)");
  app.add_option("--base-gpu-id", o->base_gpu_id,
                 "CUDA: the GPU of rank 0 (rank r on GPU base + r), as SGLang's");
  app.add_option("--tokenizer-path", o->tokenizer_path, "Accepted for SGLang compatibility");
  app.add_option("--attention-backend", o->attention_backend, "Accepted for SGLang compatibility (ignored)");
  app.add_flag("--disable-radix-cache", o->disable_radix_cache, "Accepted for SGLang compatibility (no prefix cache)");
  app.add_flag("--disable-cuda-graph", o->disable_cuda_graph, "Run decode steps without CUDA graphs");
  app.add_flag("--skip-server-warmup", o->skip_server_warmup, "Accepted for SGLang compatibility (ignored)");
  app.add_flag("--trust-remote-code", o->trust_remote_code, "Accepted for SGLang compatibility (ignored)");
  app.add_flag("--enable-metrics", o->enable_metrics, "Accepted for SGLang compatibility (/metrics is always on)");
  app.add_flag("--dense-as-sparse", o->dense_as_sparse, "Force the sparse attention path at every length");
  return sala::cli::Run([o] { return run_serve(*o); });
});

}  // namespace
