#include "server/http_server.h"

#include "server/conn_pool.h"
#include "server/http_guard.h"
#include "server/http_internal.h"
#include "server/routes_extra.h"
#include "server/http_policy.h"
#include "server/structured_output.h"

#include <cerrno>
#include <cstring>

namespace sala::server {

using namespace detail;
using namespace std::chrono_literals;

namespace {
constexpr const char* kVersion = "sala-0.1";  // /version, /get_server_info
}  // namespace

// ---------------------------------------------------------------- the server

struct HttpServer::Impl {
  ServerOptions opts;
  Engine& engine;
  const Tokenizer& tok;
  const ChatTemplate* tmpl;
  GuardedServer svr;
  Metrics metrics;
  ProtocolLimits lim;
  PolicyOptions policy;
  std::string model_id;
  int64_t max_seqs = 0;  // sequences of one request beyond this could never all be queued
  Clock::time_point started = Clock::now();
  size_t max_token_bytes = 1;          // the longest token's text, for the byte-length check
  std::atomic<bool> aborting{false};   // shutdown timeout passed: end every response now
  LogprobFormatter lpfmt;
  std::unique_ptr<grammar::GrammarCompiler> grammars;  // structured output (HTTP threads compile)

  Impl(ServerOptions o, Engine& e, const Tokenizer& t, const ChatTemplate* c)
      : opts(std::move(o)), engine(e), tok(t), tmpl(c), lpfmt(t) {
    lim.max_context_len = opts.max_context_len;
    lim.vocab_size = opts.vocab_size > 0 ? opts.vocab_size : tok.vocab_size();
    lim.max_n = opts.max_n;
    model_id = opts.served_model_name.empty() ? opts.model_path : opts.served_model_name;
    grammars = make_grammar_compiler(tok, lim.vocab_size, engine.info().eos_token_ids);
    max_seqs = engine.info().options.max_queued_requests;
    policy = {opts.api_key, opts.allowed_origins, opts.protect_metrics};
    // The normalizers we load (Prepend, Replace ' ' -> U+2581) only lengthen the text, so a
    // token never covers more input bytes than its own piece has.
    for (int32_t id = 0; id < tok.vocab_size(); ++id) max_token_bytes = std::max(max_token_bytes, tok.id_to_token(id).size());
    setup();
  }

  static void send_json(httplib::Response& res, const json& j, int status = 200) {
    res.status = status;
    res.set_content(dump(j), "application/json");
  }
  void send_error(httplib::Response& res, const ApiError& e) {
    metrics.http_errors++;
    if (RequestRecord* r = current_request()) r->error = e.what();
    send_json(res, e.body(), e.status);
  }

  // A prompt of B bytes has at least ceil(B / max_token_bytes) tokens: a prompt that is
  // surely too long is refused before tokenizing it (a 100 MB prompt cost 2.5 GB of RSS).
  void check_prompt_bytes(size_t bytes, const std::string& param) const {
    const uint64_t min_tokens = (uint64_t(bytes) + max_token_bytes - 1) / max_token_bytes;
    if (lim.max_context_len > 0 && min_tokens > uint64_t(lim.max_context_len))
      throw ApiError(400, fmt::format("The prompt ({} bytes, at least {} tokens) is longer than this server's "
                                      "context of {} tokens", bytes, min_tokens, lim.max_context_len),
                     param, "invalid_request_error", "context_length_exceeded");
  }

  // An unknown model is a 404 (OpenAI, vLLM).
  void check_model(const std::string& m) const {
    if (m.empty() || m == model_id || m == opts.model_path || m == "default") return;
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", m, model_id),
                   "model", "invalid_request_error", "model_not_found");
  }

  // Tokenized prompt → validated engine requests (n per prompt) → submitted sequences.
  std::vector<Seq> submit_all(const std::vector<std::vector<int32_t>>& prompts,
                              const std::vector<std::string>& echo_texts, const Sampling& sp, int n,
                              const std::string& base_id, bool id_per_seq) {
    std::vector<Seq> seqs;
    std::vector<LogprobOptions> lps;  // per prompt
    const auto start = Clock::now();
    if (RequestRecord* r = current_request()) r->id = base_id;
    // More sequences than the queue holds would get 429 "retry later" forever: refuse.
    if (max_seqs > 0 && int64_t(prompts.size()) * n > max_seqs)
      throw ApiError(400, fmt::format("The request asks for {} sequences ({} prompts x n = {}); this server "
                                      "queues at most {} (--max-queued-requests)",
                                      int64_t(prompts.size()) * n, prompts.size(), n, max_seqs),
                     (n > 1 || sp.n > 1) ? "n" : "prompt");
    for (size_t pi = 0; pi < prompts.size(); ++pi) {
      const auto& ids = prompts[pi];
      const std::string param = prompts.size() > 1 ? fmt::format("prompt[{}]", pi) : "prompt";
      const int64_t plen = int64_t(ids.size());
      SamplingParams p = sp.params;
      if (p.max_new_tokens < 0) p.max_new_tokens = int32_t(std::min<int64_t>(lim.max_context_len - plen, INT32_MAX));
      try {
        check_prompt_length(plen, lim.max_context_len, param);
        // 0 passed the route's rules (echo, /generate): a scoring request.
        check_new_tokens(p.max_new_tokens, plen, lim.max_context_len, "max_tokens",
                         /*allow_zero=*/true);
        check_min_new_tokens(p.min_new_tokens, p.max_new_tokens, "min_tokens");
      } catch (const InvalidRequest& e) {
        throw bad_request(e);
      }
      lps.push_back(engine_logprobs(sp.logprobs, plen, p.max_new_tokens));
      for (int j = 0; j < n; ++j) {
        Seq s;
        s.r.index = int32_t(pi * size_t(n) + size_t(j));
        s.r.prompt_tokens = int32_t(plen);
        s.counts_prompt = (j == 0);
        s.start = start;
        s.id = id_per_seq ? fmt::format("{}-{}", base_id, s.r.index) : base_id;
        s.detok = std::make_unique<IncrementalDetokenizer>(tok, sp.skip_special_tokens);
        s.stop = std::make_unique<StopStringMatcher>(sp.stop);
        s.keep_stop = sp.include_stop_str;
        s.min_tokens = sp.params.min_new_tokens;
        if (pi < echo_texts.size()) s.r.text = echo_texts[pi];
        seqs.push_back(std::move(s));
      }
    }
    // Compiled here, on this HTTP thread (cached by its text), never on the engine thread.
    const auto grammar = compile_request_grammar(grammars.get(), sp);
    // Submit only after everything validated; on failure cancel what was submitted.
    try {
      for (auto& s : seqs) {
        GenerationRequest req;
        req.prompt = prompts[size_t(s.r.index) / size_t(n)];
        req.sampling = sp.params;
        req.logprobs = lps[size_t(s.r.index) / size_t(n)];
        req.grammar = grammar;
        if (req.sampling.max_new_tokens < 0)
          req.sampling.max_new_tokens = int32_t(lim.max_context_len - int64_t(req.prompt.size()));
        if (req.sampling.seed && n > 1) req.sampling.seed = *req.sampling.seed + uint64_t(s.r.index % n);
        s.h = engine.submit(std::move(req));
      }
    } catch (...) {
      for (auto& s : seqs)
        if (s.h) s.h->cancel();
      throw;
    }
    return seqs;
  }

  std::vector<int32_t> encode_prompt(const Prompt& p, bool add_special) const {
    if (p.text) {
      check_prompt_bytes(p.text->size(), "prompt");
      return tok.encode(*p.text, add_special);
    }
    return p.ids;
  }

  // ---- streaming

  void start_stream(httplib::Response& res, std::shared_ptr<StreamState> st) {
    st->interval = std::max(1, st->interval > 0 ? st->interval : opts.stream_interval);
    st->metrics = &metrics;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) {
          return stream_step(*st, sink, metrics, aborting, lpfmt);
        },
        [st](bool) { st->cancel_all(); });  // any end of the response: free the requests
  }

  // ---- routes

  void handle_generate(const httplib::Request& req, httplib::Response& res) {
    metrics.gen_requests++;
    GenerateRequest g = parse_generate(parse_body(req.body), lim);
    restore_client_order(req.body, g.sampling, nullptr);
    std::vector<std::vector<int32_t>> prompts;
    // n copies were expanded by the parser: submit each item once.
    for (auto& p : g.prompts) prompts.push_back(encode_prompt(p, true));
    Sampling sp = g.sampling;
    const std::string id = g.rid.empty() ? random_hex(32) : g.rid;
    std::vector<Seq> seqs = submit_all(prompts, {}, sp, 1, id, g.batch);
    if (g.stream) {
      auto st = std::make_shared<StreamState>();
      st->logprobs = sp.logprobs;
      st->route = Route::Generate;
      st->seqs = std::move(seqs);
      st->id = id;
      st->batch = g.batch;
      st->interval = sp.stream_interval;
      start_stream(res, st);
      return;
    }
    const bool batch = g.batch;
    const LogprobRequest lp = sp.logprobs;
    respond_when_done(res, std::move(seqs), [this, batch, lp](std::vector<Seq>& ss) {
      auto one = [&](const Seq& s) {
        json j = generate_result(s.r, s.id, false);
        if (lp.enabled) lpfmt.sglang(j["meta_info"], s.r, lp);
        return j;
      };
      if (!batch) return one(ss[0]);
      json arr = json::array();
      for (auto& s : ss) arr.push_back(one(s));
      return arr;
    });
  }

  void respond_when_done(httplib::Response& res, std::vector<Seq> seqs,
                         std::function<json(std::vector<Seq>&)> body) {
    detail::respond_when_done(res, std::move(seqs), std::move(body), metrics, aborting);
  }

  void handle_chat(const httplib::Request& req, httplib::Response& res) {
    metrics.chat_requests++;
    ChatRequest c = parse_chat(parse_body(req.body), lim);
    restore_client_order(req.body, c.sampling, &c.tools);
    check_model(c.model);
    if (c.tools.active() && opts.tool_call_parser == "none")
      throw ApiError(400, "tool calling is off on this server (--tool-call-parser none)", "tools");
    const std::string rendered = chat_prompt_text(c, tmpl);
    check_prompt_bytes(rendered.size(), "messages");
    std::vector<std::vector<int32_t>> prompts{tok.encode(rendered, c.add_special_tokens)};
    const std::string id = "chatcmpl-" + random_hex(24);
    std::vector<std::string> echo;
    if (c.echo) echo.push_back(chat_echo_text(c));
    std::vector<Seq> seqs = submit_all(prompts, echo, c.sampling, c.sampling.n, id, false);
    if (c.tools.active())
      for (auto& s : seqs) s.tools = std::make_unique<ToolCallParser>();
    respond_openai(res, Route::Chat, std::move(seqs), id, c.stream, c.include_usage,
                   c.sampling.logprobs);
  }

  void handle_completion(const httplib::Request& req, httplib::Response& res) {
    metrics.completion_requests++;
    CompletionRequest c = parse_completion(parse_body(req.body), lim);
    restore_client_order(req.body, c.sampling, nullptr);
    check_model(c.model);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> echo;
    for (auto& p : c.prompts) {
      prompts.push_back(encode_prompt(p, true));
      if (c.echo) echo.push_back(p.text ? *p.text : tok.decode(p.ids, true));
    }
    const std::string id = "cmpl-" + random_hex(24);
    std::vector<Seq> seqs = submit_all(prompts, echo, c.sampling, c.sampling.n, id, false);
    respond_openai(res, Route::Completion, std::move(seqs), id, c.stream, c.include_usage,
                   c.sampling.logprobs);
  }

  // The OpenAI routes' common tail: stream the sequences, or wait for them and answer once.
  void respond_openai(httplib::Response& res, Route route, std::vector<Seq> seqs,
                      const std::string& id, bool stream, bool include_usage,
                      const LogprobRequest& lp) {
    const int64_t created = unix_time();
    if (stream) {
      auto st = std::make_shared<StreamState>();
      st->logprobs = lp;
      st->route = route;
      st->seqs = std::move(seqs);
      st->id = id;
      st->model = model_id;
      st->created = created;
      st->include_usage = include_usage;
      start_stream(res, st);
      return;
    }
    respond_when_done(res, std::move(seqs), [this, route, id, created, lp](std::vector<Seq>& ss) {
      std::vector<SeqResult> rs;
      for (auto& s : ss) rs.push_back(s.r);
      json j = route == Route::Chat ? chat_response(id, model_id, created, rs, usage_of(ss))
                                    : completion_response(id, model_id, created, rs, usage_of(ss));
      for (size_t i = 0; i < ss.size(); ++i)
        if (ss[i].tools) apply_tool_calls(j["choices"][i], rs[i].text);
      for (size_t i = 0; lp.enabled && i < rs.size(); ++i) {
        int64_t offset = 0;
        j["choices"][i]["logprobs"] = lpfmt.openai(route == Route::Chat, lp, rs[i], 0, lp.prompt, &offset);
      }
      return j;
    });
  }

  // What routes_extra.cpp needs: the tokenizer, limits and the generation machinery.
  RouteContext route_context() {
    RouteContext cx;
    cx.tok = &tok;
    cx.tmpl = tmpl;
    cx.lim = &lim;
    cx.model_id = model_id;
    cx.model_path = opts.model_path;
    cx.version = kVersion;
    cx.metrics = &metrics;
    cx.check_model = [this](const std::string& m) { check_model(m); };
    cx.submit = [this](const std::vector<std::vector<int32_t>>& prompts, const std::vector<std::string>& echo,
                       const Sampling& sp, int n, const std::string& id) {
      return submit_all(prompts, echo, sp, n, id, false);
    };
    cx.respond_when_done = [this](httplib::Response& res, std::vector<Seq> seqs,
                                  std::function<json(std::vector<Seq>&)> body) {
      respond_when_done(res, std::move(seqs), std::move(body));
    };
    cx.wrap = [this](httplib::Server::Handler fn) { return wrap(std::move(fn)); };
    return cx;
  }

  // Wraps a handler: counts, maps exceptions to OpenAI error bodies.
  httplib::Server::Handler wrap(void (Impl::*fn)(const httplib::Request&, httplib::Response&)) {
    return wrap([this, fn](const httplib::Request& req, httplib::Response& res) { (this->*fn)(req, res); });
  }
  httplib::Server::Handler wrap(httplib::Server::Handler fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      metrics.http_requests++;
      metrics.in_flight++;
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const QueueFull& e) {
        send_error(res, ApiError(429, "The server is busy: the request queue is full; retry later"));
      } catch (const InvalidRequest& e) {  // the engine's request rules (engine/request_check.h)
        send_error(res, bad_request(e));
      } catch (const sala::Error& e) {  // engine refused the request (e.g. too long for the KV pool)
        send_error(res, ApiError(400, e.what()));
      } catch (const std::exception& e) {  // the details go to the log, not to the client
        send_error(res, ApiError(500, "internal error (see the server log)"));
        if (RequestRecord* r = current_request()) r->error = fmt::format("internal error: {}", e.what());
      }
      metrics.in_flight--;
    };
  }

  void setup() {
    const int threads = std::max(32, opts.http_threads);
    // Newest first past 64 queued connections: a flood does not hold a fresh one (conn_pool.h).
    svr.new_task_queue = [threads] { return new ConnectionPool(size_t(threads), 64); };
    GuardOptions g;
    g.header_timeout_s = opts.header_timeout_s;
    g.body_timeout_s = opts.body_timeout_s;
    g.keep_alive_timeout_s = opts.keep_alive_timeout_s;
    // Workers beyond the cap stay free to refuse (or make room for) new connections at once.
    g.max_connections = opts.max_connections > 0 ? std::min(opts.max_connections, threads - 16) : threads - 16;
    g.max_body_bytes = opts.max_body_bytes;
    g.log_requests = opts.log_requests;
    svr.configure(g);
    svr.set_keep_alive_timeout(opts.keep_alive_timeout_s);
    svr.set_keep_alive_max_count(100000);
    svr.set_tcp_nodelay(true);
    svr.set_read_timeout(60, 0);
    svr.set_write_timeout(60, 0);
    svr.set_payload_max_length(opts.max_body_bytes);

    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (RequestRecord* r = current_request()) r->method = req.method, r->path = req.path;
      const auto h = apply_policy(policy, svr.draining(), req, res);
      if (h == httplib::Server::HandlerResponse::Handled && res.status >= 400) metrics.http_errors++;
      return h;
    });
    // Every response passes here before its headers are written: its status for the log.
    svr.set_post_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      if (RequestRecord* r = current_request()) {
        r->status = res.status;
        if (r->path.empty()) r->method = req.method, r->path = req.path;
      }
    });
    // Fill the body only for errors that have none (unknown route, bad method).
    const int body_timeout_s = g.body_timeout_s;
    svr.set_error_handler(httplib::Server::HandlerWithResponse([body_timeout_s](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      RequestRecord* r = current_request();
      // httplib says 400 for any failed body read
      if (r && r->body_timed_out) res.status = 408;
      if (r && r->evicted) res.status = 503, res.set_header("Retry-After", "1");
      const std::string msg =
          res.status == 404   ? fmt::format("Unknown route {} {}", req.method, req.path)
          : res.status == 408 ? fmt::format("request body not received within {} s", body_timeout_s)
          : res.status == 503 ? std::string("connection closed to make room: the server is at its connection limit "
                                            "and this request's body had been arriving the longest; retry later")
                              : fmt::format("HTTP error {}", res.status);
      if (r) r->error = msg;
      res.set_content(dump(error_body(res.status, msg)), "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }));
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      if (RequestRecord* r = current_request()) r->error = "internal error: " + what;
      res.status = 500;  // the details go to the log only
      res.set_content(dump(error_body(500, "internal error (see the server log)")), "application/json");
    });

    svr.Post("/generate", wrap(&Impl::handle_generate));
    svr.Post("/v1/chat/completions", wrap(&Impl::handle_chat));
    svr.Post("/v1/completions", wrap(&Impl::handle_completion));
    auto health = [this](const httplib::Request&, httplib::Response& res) {
      if (engine.alive()) {
        res.status = 200;
        res.set_content("", "text/plain");
      } else {
        send_json(res, error_body(503, "the engine loop is not running"), 503);
      }
    };
    svr.Get("/health", health);
    svr.Get("/health_generate", health);
    auto flush = [](const httplib::Request&, httplib::Response& res) {
      res.status = 200;
      res.set_content("Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                      "waiting requests, the operation will not be performed.)\n",
                      "text/plain");
    };
    svr.Post("/flush_cache", flush);  // state-changing: POST only (GET is a 405)
    auto info = [this](const httplib::Request&, httplib::Response& res) {
      json j = opts.server_args;
      j["model_path"] = opts.model_path;
      j["served_model_name"] = model_id;
      j["stream_interval"] = opts.stream_interval;
      j["context_length"] = lim.max_context_len;
      j["version"] = kVersion;
      j["uptime_s"] = seconds_since(started);
      j["engine_stats"] = stats_json(engine.stats());
      j["internal_states"] = internal_states_json(engine.stats());
      send_json(res, j);
    };
    svr.Get("/get_server_info", info);
    svr.Get("/server_info", info);
    svr.Get("/get_model_info", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, {{"model_path", opts.model_path}, {"tokenizer_path", opts.model_path}, {"is_generation", true}});
    });
    register_extra_routes(svr, route_context());
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(render_metrics(engine.stats(), metrics, svr), "text/plain; version=0.0.4");
    });
  }
};

HttpServer::HttpServer(ServerOptions opts, Engine& engine, const Tokenizer& tok, const ChatTemplate* tmpl)
    : impl_(std::make_unique<Impl>(std::move(opts), engine, tok, tmpl)) {}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  int port = impl_->svr.bind_exclusive(impl_->opts.host, impl_->opts.port, impl_->opts.listen_backlog);
  if (port < 0) {
    if (errno == EADDRINUSE)
      fail("cannot listen on {}:{}: the port is already in use (another server?)", impl_->opts.host, impl_->opts.port);
    fail("cannot listen on {}:{}: {}", impl_->opts.host, impl_->opts.port, std::strerror(errno));
  }
  impl_->opts.port = port;
  return port;
}

void HttpServer::run() { impl_->svr.listen_after_bind(); }

void HttpServer::shutdown() {
  Impl& I = *impl_;
  I.svr.set_draining(true);
  const auto deadline = Clock::now() + std::chrono::seconds(I.opts.shutdown_timeout_s);
  fmt::print(stderr, "sala serve: draining {} request(s), at most {} s\n", I.svr.requests_in_progress(),
             I.opts.shutdown_timeout_s);
  while (I.svr.requests_in_progress() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  if (I.svr.requests_in_progress() > 0) {
    fmt::print(stderr, "sala serve: shutdown timeout; aborting {} request(s)\n", I.svr.requests_in_progress());
    I.aborting = true;
    const auto grace = Clock::now() + 5s;  // their error events and [DONE] get written
    while (I.svr.requests_in_progress() > 0 && Clock::now() < grace) std::this_thread::sleep_for(20ms);
  }
  stop();
}

void HttpServer::stop() {
  if (impl_ && impl_->svr.is_running()) impl_->svr.stop();
}

std::string HttpServer::model_id() const { return impl_->model_id; }

}  // namespace sala::server
