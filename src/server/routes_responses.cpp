// POST /v1/responses, text only: OpenAI's Responses API create, streamed (the typed
// response.* events) or not. The request is mapped onto a chat request (same template,
// sampling and validation as /v1/chat/completions); tools, stored state (store,
// previous_response_id, conversation, background) and non-text formats are refused by name.
#include <fmt/format.h>

#include "server/protocol_fields.h"
#include "server/routes_extra.h"

namespace sala::server::detail {

using namespace fields;

namespace {

constexpr struct {
  const char* name;
  const char* why;
} kRefused[] = {
    {"tools", "tool calling is not implemented"},
    {"previous_response_id", "responses are not stored"},
    {"conversation", "conversations are not stored"},
    {"background", "background responses are not supported"},
    {"include", "extra output data (include) is not supported"},
    {"prompt", "prompt templates are not supported"},
    {"top_logprobs", "log probabilities are not implemented for /v1/responses"},
    {"context_management", "context management is not supported"},
};

// One input item's text: a string, or parts of type input_text / output_text / text.
std::string item_text(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array())
    bad_request(where, fmt::format("'{}' must be a string or an array of text parts, got {}", where, type_name(c)));
  std::string out;
  for (const json& p : c) {
    const std::string t = p.is_object() ? get_string(p, "type").value_or("") : "";
    if ((t != "input_text" && t != "output_text" && t != "text") || !p.contains("text") || !p["text"].is_string())
      bad_request(where, fmt::format("'{}' parts must be {{\"type\": \"input_text\", \"text\": string}}; "
                                     "other content is not supported", where));
    out += p["text"].get<std::string>();
  }
  return out;
}

// The Responses request as a chat request body (parse_chat validates the rest).
json to_chat_body(const json& b) {
  for (const auto& r : kRefused) refuse_if_present(b, r.name, r.why);
  if (auto v = get_bool(b, "store"); v && *v)
    bad_request("store", "responses are not stored: send \"store\": false");
  if (const json* t = field(b, "text")) {
    const json* f = t->is_object() ? field(*t, "format") : nullptr;
    if (!t->is_object() || (f && (!f->is_object() || f->value("type", "") != "text")))
      bad_request("text", "only text output is supported (\"text\": {\"format\": {\"type\": \"text\"}})");
  }
  if (auto v = get_string(b, "truncation"); v && *v != "disabled")
    bad_request("truncation", "only truncation \"disabled\" is supported");
  json chat = json::object();
  json msgs = json::array();
  if (auto ins = get_string(b, "instructions")) msgs.push_back({{"role", "system"}, {"content", *ins}});
  const json* in = field(b, "input");
  if (!in) bad_request("input", "'input' is required");
  if (in->is_string()) {
    msgs.push_back({{"role", "user"}, {"content", *in}});
  } else if (in->is_array() && !in->empty()) {
    for (size_t i = 0; i < in->size(); ++i) {
      const json& m = (*in)[i];
      const std::string where = fmt::format("input[{}]", i);
      if (!m.is_object() || (m.contains("type") && m["type"] != "message") || !m.contains("role"))
        bad_request(where, fmt::format("'{}' must be a message {{\"role\", \"content\"}}; other input items "
                                       "are not supported", where));
      const json* c = field(m, "content");
      if (!c) bad_request(where + ".content", fmt::format("'{}.content' is required", where));
      msgs.push_back({{"role", m["role"]}, {"content", item_text(*c, where + ".content")}});
    }
  } else {
    bad_request("input", "'input' must be a string or a non-empty array of messages");
  }
  chat["messages"] = std::move(msgs);
  for (const char* k : {"model", "temperature", "top_p", "stream", "user", "metadata", "service_tier",
                        "safety_identifier", "prompt_cache_key", "parallel_tool_calls", "tool_choice"})
    if (b.contains(k)) chat[k] = b[k];
  if (b.contains("max_output_tokens")) chat["max_completion_tokens"] = b["max_output_tokens"];
  if (const json* r = field(b, "reasoning")) {
    if (!r->is_object()) bad_request("reasoning", "'reasoning' must be an object");
    if (const json* e = field(*r, "effort")) chat["reasoning_effort"] = *e;
  }
  return chat;
}

json merged(json a, const json& b) {
  a.update(b);
  return a;
}

struct Ctx {
  std::string id, msg_id, model;
  int64_t created = 0;
  json request;  // echoed fields
};

json usage(const Seq& s) {
  return {{"input_tokens", s.r.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", 0}}},
          {"output_tokens", s.r.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", s.r.prompt_tokens + s.r.completion_tokens}};
}

json message_item(const Ctx& c, const std::string& text, bool done) {
  json content = json::array();
  if (done) content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}});
  return {{"type", "message"}, {"id", c.msg_id}, {"status", done ? "completed" : "in_progress"},
          {"role", "assistant"}, {"content", std::move(content)}};
}

// The Response object; `s` null: created, nothing generated yet.
json response_object(const Ctx& c, const Seq* s) {
  std::string status = "in_progress";
  json incomplete = nullptr, error = nullptr, output = json::array(), use = nullptr;
  if (s && s->r.finished) {
    status = s->r.finish == "length" ? "incomplete" : s->r.finish == "stop" ? "completed" : "failed";
    if (status == "incomplete") incomplete = {{"reason", "max_output_tokens"}};
    if (status == "failed") error = {{"code", "server_error"}, {"message", s->r.abort_message}};
    output.push_back(message_item(c, s->r.text, true));
    use = usage(*s);
  }
  const json& q = c.request;
  return {{"id", c.id}, {"object", "response"}, {"created_at", c.created}, {"status", status},
          {"error", error}, {"incomplete_details", incomplete},
          {"instructions", q.value("instructions", json(nullptr))},
          {"max_output_tokens", q.value("max_output_tokens", json(nullptr))}, {"model", c.model},
          {"output", std::move(output)}, {"parallel_tool_calls", true}, {"previous_response_id", nullptr},
          {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}}, {"store", false},
          {"temperature", q.value("temperature", json(1.0))}, {"text", {{"format", {{"type", "text"}}}}},
          {"tool_choice", "auto"}, {"tools", json::array()}, {"top_p", q.value("top_p", json(1.0))},
          {"truncation", "disabled"}, {"usage", use}, {"user", q.value("user", json(nullptr))},
          {"metadata", q.value("metadata", json::object())}};
}

// Streaming: the typed events in OpenAI's order, one delta per new piece of text.
struct ResponseStream {
  Ctx c;
  std::vector<Seq> seqs;
  Metrics* metrics = nullptr;
  int64_t seq_no = 0;
  size_t sent = 0;
  bool started = false;

  bool event(httplib::DataSink& sink, const char* type, json j) {
    j["type"] = type;
    j["sequence_number"] = seq_no++;
    const std::string out = fmt::format("event: {}\ndata: {}\n\n", type, dump(j));
    return sink.write(out.data(), out.size());
  }

  bool step(httplib::DataSink& sink) {
    Seq& s = seqs[0];
    const json part_ref = {{"item_id", c.msg_id}, {"output_index", 0}, {"content_index", 0}};
    bool ok = sink.is_writable();
    if (ok && !started) {
      started = true;
      ok = event(sink, "response.created", {{"response", response_object(c, nullptr)}}) &&
           event(sink, "response.in_progress", {{"response", response_object(c, nullptr)}}) &&
           event(sink, "response.output_item.added", {{"output_index", 0}, {"item", message_item(c, "", false)}}) &&
           event(sink, "response.content_part.added",
                 merged(part_ref, {{"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}}));
    }
    if (ok && !s.r.finished) pump_any(seqs, *metrics, std::chrono::milliseconds(100));
    if (ok && s.r.text.size() > sent) {
      ok = event(sink, "response.output_text.delta",
                 merged(part_ref, {{"delta", s.r.text.substr(sent)}, {"logprobs", json::array()}}));
      sent = s.r.text.size();
    }
    if (!ok) {
      metrics->client_disconnects++;
      s.h->cancel();
      return false;
    }
    if (!s.r.finished) return true;
    metrics->e2e.observe(s.r.e2e_latency);
    const json part = {{"type", "output_text"}, {"text", s.r.text}, {"annotations", json::array()}};
    const json done = response_object(c, &s);
    const char* last = done["status"] == "completed" ? "response.completed"
                       : done["status"] == "incomplete" ? "response.incomplete" : "response.failed";
    ok = event(sink, "response.output_text.done", merged(part_ref, {{"text", s.r.text}, {"logprobs", json::array()}})) &&
         event(sink, "response.content_part.done", merged(part_ref, {{"part", part}})) &&
         event(sink, "response.output_item.done", {{"output_index", 0}, {"item", message_item(c, s.r.text, true)}}) &&
         event(sink, last, {{"response", done}});
    sink.done();
    return ok;
  }
};

}  // namespace

void register_responses_route(httplib::Server& svr, const RouteContext& cx) {
  svr.Post("/v1/responses", cx.wrap([cx](const httplib::Request& req, httplib::Response& res) {
    const json body = parse_body(req.body);
    ChatRequest chat;
    try {
      chat = parse_chat(to_chat_body(body), *cx.lim);
    } catch (ApiError& e) {  // the chat parser names chat's field: name the Responses one
      if (e.param == "max_completion_tokens") e.param = "max_output_tokens";
      if (e.param.rfind("messages", 0) == 0) e.param = "input";
      throw;
    }
    cx.check_model(chat.model);
    Ctx c;
    c.id = "resp_" + random_hex(32);
    c.msg_id = "msg_" + random_hex(32);
    c.model = cx.model_id;
    c.created = unix_time();
    c.request = body;
    std::vector<Seq> seqs = cx.submit({chat_prompt_ids(chat, *cx.tok, cx.tmpl)}, {}, chat.sampling, 1, c.id);
    if (!chat.stream) {
      cx.respond_when_done(res, std::move(seqs), [c](std::vector<Seq>& ss) { return response_object(c, &ss[0]); });
      return;
    }
    auto st = std::make_shared<ResponseStream>();
    st->c = std::move(c);
    st->seqs = std::move(seqs);
    st->metrics = cx.metrics;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream", [st](size_t, httplib::DataSink& sink) { return st->step(sink); },
        [st](bool) { st->seqs[0].h->cancel(); });  // any end of the response frees the request
  }));
}

}  // namespace sala::server::detail
