// /metrics (Prometheus text) and the engine stats of /get_server_info.
#include "server/http_internal.h"

#include <cstdlib>
#include <fstream>
#include <tuple>
#include <utility>

namespace sala::server::detail {

namespace {
// A value of /proc/self/status in its unit (kB for Vm*), -1 where it cannot be read (not
// Linux). The soak test (tests/soak) checks threads and RSS through /metrics.
int64_t proc_status(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.compare(0, key.size() + 1, key + ":") == 0) return std::strtoll(line.c_str() + key.size() + 1, nullptr, 10);
  return -1;
}
}  // namespace

std::string render_metrics(const EngineStats& s, const Metrics& metrics, const GuardedServer& svr) {
  std::string o;
  auto gauge = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  counter("sala_http_requests_total", "HTTP requests received", double(metrics.http_requests.load()));
  counter("sala_http_errors_total", "HTTP requests answered with an error status", double(metrics.http_errors.load()));
  counter("sala_client_disconnects_total", "Streams aborted because the client went away", double(metrics.client_disconnects.load()));
  counter("sala_stop_string_matches_total", "Sequences ended by a stop string", double(metrics.stop_string_matches.load()));
  counter("sala_http_connections_refused_total", "Connections refused with 503 (connection cap)", double(svr.connections_refused()));
  counter("sala_http_connections_evicted_total", "Idle connections, or ones sending their request the longest, closed to make room at the cap", double(svr.connections_evicted()));
  gauge("sala_http_connections_open", "Open HTTP connections", double(svr.connections_open()));
  counter("sala_requests_total", "Generation requests submitted to the engine", double(s.requests_total));
  counter("sala_requests_finished_total", "Generation requests finished", double(s.requests_finished));
  counter("sala_requests_aborted_total", "Generation requests aborted", double(s.requests_aborted));
  counter("sala_preemptions_total", "Requests preempted (pages freed, recomputed later)", double(s.preemptions));
  counter("sala_prompt_tokens_total", "Prompt tokens processed", double(s.prompt_tokens_total));
  counter("sala_generation_tokens_total", "Tokens generated", double(s.generated_tokens_total));
  counter("sala_engine_steps_total", "Engine forward steps", double(s.steps));
  // Per step kind (EngineStats): prompt chunks only, decode rows only, or both.
  const std::pair<const char*, const StepKindStats*> kinds[] = {
      {"prefill", &s.prefill_steps}, {"mixed", &s.mixed_steps}, {"decode", &s.decode_steps}};
  for (const auto& [name, help, field] :
       {std::tuple{"sala_engine_steps_by_kind_total", "Engine steps by kind", 0},
        std::tuple{"sala_engine_step_seconds_total", "Wall seconds of engine steps by kind", 1},
        std::tuple{"sala_engine_forward_seconds_total",
                   "Seconds of engine steps inside the model's forward, by kind", 2}}) {
    o += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
    for (const auto& [kind, k] : kinds)
      o += fmt::format("{}{{kind=\"{}\"}} {}\n", name, kind,
                       field == 0 ? double(k->steps) : field == 1 ? k->seconds : k->forward_seconds);
  }
  counter("sala_spec_verify_calls_total", "Speculative verify calls", double(s.spec_verify_calls));
  counter("sala_spec_draft_tokens_total", "Speculative draft tokens verified", double(s.spec_drafted_tokens));
  counter("sala_spec_accepted_tokens_total", "Speculative draft tokens accepted", double(s.spec_accepted_tokens));
  counter("sala_spec_rollbacks_total", "Speculative verify calls that rejected a draft", double(s.spec_rollbacks));
  counter("sala_spec_draft_model_rollbacks_total", "Draft model state rollbacks (STANDALONE)", double(s.spec_draft_rollbacks));
  gauge("sala_num_running_reqs", "Requests running in the engine", double(s.running));
  gauge("sala_num_queued_reqs", "Requests waiting in the engine queue", double(s.queued));
  gauge("sala_kv_pages_used", "KV pages in use (sparse layers)", double(s.kv_pages_used));
  gauge("sala_kv_pages_total", "KV pages in the pool", double(s.kv_pages_total));
  gauge("sala_state_slots_used", "Lightning-state slots in use", double(s.state_slots_used));
  gauge("sala_state_slots_total", "Lightning-state slots in the pool", double(s.state_slots_total));
  gauge("sala_kv_usage_ratio", "Fraction of KV pages in use",
        s.kv_pages_total ? double(s.kv_pages_used) / double(s.kv_pages_total) : 0.0);
  gauge("sala_http_in_flight", "HTTP generation requests in flight", double(metrics.in_flight.load()));
  // Prometheus' standard process metrics (the names client libraries export).
  gauge("process_resident_memory_bytes", "Resident memory size in bytes", 
        proc_status("VmRSS") < 0 ? -1.0 : double(proc_status("VmRSS")) * 1024);
  gauge("process_threads", "OS threads of the server process", double(proc_status("Threads")));
  metrics.ttft.render(o, "sala_time_to_first_token_seconds", "Time to first token (server side)");
  metrics.itl.render(o, "sala_inter_token_latency_seconds", "Inter-token latency (server side)");
  metrics.e2e.render(o, "sala_e2e_request_latency_seconds", "End-to-end request latency");
  return o;
}

json stats_json(const EngineStats& s) {
  return {{"running", s.running}, {"queued", s.queued},
          {"kv_pages_used", s.kv_pages_used}, {"kv_pages_total", s.kv_pages_total},
          {"state_slots_used", s.state_slots_used}, {"state_slots_total", s.state_slots_total},
          {"requests_total", s.requests_total}, {"requests_finished", s.requests_finished},
          {"requests_aborted", s.requests_aborted}, {"preemptions", s.preemptions},
          {"prompt_tokens_total", s.prompt_tokens_total},
          {"generated_tokens_total", s.generated_tokens_total}, {"steps", s.steps},
          {"spec_verify_calls", s.spec_verify_calls}, {"spec_drafted_tokens", s.spec_drafted_tokens},
          {"spec_accepted_tokens", s.spec_accepted_tokens}, {"spec_rollbacks", s.spec_rollbacks},
          {"spec_draft_rollbacks", s.spec_draft_rollbacks},
          {"spec_draft_pages_used", s.spec_draft_pages_used},
          {"spec_draft_slots_used", s.spec_draft_slots_used},
          {"step_kinds", step_kinds_json(s)}};
}

json step_kinds_json(const EngineStats& s) {
  json j = json::object();
  for (const auto& [name, k] : {std::pair{"prefill", &s.prefill_steps},
                                std::pair{"mixed", &s.mixed_steps},
                                std::pair{"decode", &s.decode_steps}})
    j[name] = {{"steps", k->steps}, {"seconds", k->seconds}, {"forward_seconds", k->forward_seconds}};
  return j;
}

json internal_states_json(const EngineStats& s) {
  // SGLang's field, read by its benchmark client: tokens per verify call, bonus included
  // (1.0 without speculation).
  const double accept_len =
      s.spec_verify_calls ? 1.0 + double(s.spec_accepted_tokens) / double(s.spec_verify_calls) : 1.0;
  return json::array({{{"avg_spec_accept_length", accept_len}}});
}

}  // namespace sala::server::detail
