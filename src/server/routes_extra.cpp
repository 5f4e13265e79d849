#include "server/routes_extra.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "server/protocol_fields.h"

namespace sala::server::detail {

using namespace fields;

std::string chat_prompt_text(const ChatRequest& c, const ChatTemplate* tmpl) {
  if (!tmpl)
    throw ApiError(400, "This model has no chat template; use /v1/completions or /generate", "messages");
  // Tools are rendered even with tool_choice "none" (vLLM's default): the model knows them.
  std::string text = tmpl->render(c.messages, c.add_generation_prompt, c.template_kwargs, c.tools.tools);
  if (c.continue_final_message) {
    try {
      text = cut_after_final_message(text, c.messages.back().content);
    } catch (const sala::Error& e) {
      throw ApiError(400, e.what(), "continue_final_message");
    }
  }
  return text;
}

std::vector<int32_t> chat_prompt_ids(const ChatRequest& c, const Tokenizer& tok, const ChatTemplate* tmpl) {
  return tok.encode(chat_prompt_text(c, tmpl), c.add_special_tokens);
}

std::string chat_echo_text(const ChatRequest& c) {
  if (!c.echo || c.messages.empty()) return "";
  const ChatMessage& last = c.messages.back();
  return (!c.add_generation_prompt || last.role == "assistant") ? last.content : "";
}

namespace {

json model_card(const RouteContext& cx) {
  return {{"id", cx.model_id}, {"object", "model"}, {"created", unix_time()}, {"owned_by", "sala"},
          {"root", cx.model_id}, {"max_model_len", cx.lim->max_context_len}};
}

void send(httplib::Response& res, const json& j) {
  res.status = 200;
  res.set_content(dump(j), "application/json");
}

// ---------------------------------------------------------------- tokenizer routes

// vLLM: {prompt | messages, add_special_tokens, return_token_strs} → {tokens, count,
// max_model_len[, token_strs]}; SGLang: "prompt" may be a list of strings (lists answered).
json tokenize(const RouteContext& cx, const json& body) {
  cx.check_model(get_string(body, "model").value_or(""));
  const bool strs = get_bool(body, "return_token_strs").value_or(false);
  auto one = [&](const std::vector<int32_t>& ids, json& tokens, json& count, json& token_strs) {
    tokens = ids;
    count = ids.size();
    if (!strs) return;
    token_strs = json::array();
    for (int32_t id : ids) token_strs.push_back(cx.tok->id_to_token(id));
  };
  json out = {{"max_model_len", cx.lim->max_context_len}};
  json tokens, count, token_strs;
  const json* prompt = field(body, "prompt");
  if (field(body, "messages")) {
    if (prompt) bad_request("prompt", "give either 'prompt' or 'messages', not both");
    // The chat request's own parser and prompt: the same ids /v1/chat/completions would use.
    json chat = body;
    chat.erase("return_token_strs");
    ChatRequest c = parse_chat(chat, *cx.lim);
    one(chat_prompt_ids(c, *cx.tok, cx.tmpl), tokens, count, token_strs);
  } else if (!prompt) {
    bad_request("prompt", "one of 'prompt' or 'messages' is required");
  } else {
    const bool add_special = get_bool(body, "add_special_tokens").value_or(true);
    if (prompt->is_string()) {
      one(cx.tok->encode(prompt->get<std::string>(), add_special), tokens, count, token_strs);
    } else if (prompt->is_array() && !prompt->empty() &&
               std::all_of(prompt->begin(), prompt->end(), [](const json& x) { return x.is_string(); })) {
      tokens = count = token_strs = json::array();
      for (const json& p : *prompt) {
        json t, c, s;
        one(cx.tok->encode(p.get<std::string>(), add_special), t, c, s);
        tokens.push_back(t);
        count.push_back(c);
        token_strs.push_back(s);
      }
    } else {
      bad_request("prompt", "'prompt' must be a string or a non-empty array of strings");
    }
  }
  out["tokens"] = tokens;
  out["count"] = count;
  if (strs) out["token_strs"] = token_strs;
  return out;
}

// {tokens, skip_special_tokens (default false: HF decode's default)} → {prompt} (vLLM) and
// {text} (SGLang).
json detokenize(const RouteContext& cx, const json& body) {
  cx.check_model(get_string(body, "model").value_or(""));
  const json* t = field(body, "tokens");
  if (!t || !t->is_array()) bad_request("tokens", "'tokens' must be an array of token ids");
  const std::string text = cx.tok->decode(token_ids(*t, "tokens", *cx.lim),
                                          get_bool(body, "skip_special_tokens").value_or(false));
  return {{"prompt", text}, {"text", text}};
}

// vLLM's /tokenizer_info: the tokenizer config, with the special tokens as strings and the
// chat template text (what lm-evaluation-harness's RemoteTokenizer reads).
json tokenizer_info(const RouteContext& cx) {
  namespace fs = std::filesystem;
  json info = json::object();
  const fs::path cfg = fs::path(cx.model_path) / "tokenizer_config.json";
  if (std::ifstream f(cfg); f) {
    try {
      info = json::parse(f);
    } catch (const json::exception&) {
      info = json::object();  // the tokenizer loaded without it: report what we know
    }
  }
  if (!info.is_object()) info = json::object();
  info.erase("added_tokens_decoder");  // thousands of entries; not part of the contract
  auto tok_or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  info["bos_token"] = tok_or_null(cx.tok->bos_token());
  info["eos_token"] = tok_or_null(cx.tok->eos_token());
  if (info.contains("pad_token") && info["pad_token"].is_object())
    info["pad_token"] = info["pad_token"].value("content", "");
  if (!info.contains("pad_token")) info["pad_token"] = nullptr;
  info["chat_template"] = cx.tmpl ? json(cx.tmpl->source()) : json(nullptr);
  info["model_max_length"] = cx.lim->max_context_len;
  info["vocab_size"] = cx.tok->vocab_size();
  if (!info.contains("tokenizer_class")) info["tokenizer_class"] = "PreTrainedTokenizerFast";
  return info;
}

}  // namespace

void register_responses_route(httplib::Server& svr, const RouteContext& cx);  // routes_responses.cpp

void register_extra_routes(httplib::Server& svr, RouteContext cx) {
  auto post_json = [&](const char* path, std::function<json(const json&)> fn) {
    svr.Post(path, cx.wrap([fn](const httplib::Request& req, httplib::Response& res) {
      send(res, fn(parse_body(req.body)));
    }));
  };
  for (const char* p : {"/tokenize", "/v1/tokenize"})
    post_json(p, [cx](const json& b) { return tokenize(cx, b); });
  for (const char* p : {"/detokenize", "/v1/detokenize"})
    post_json(p, [cx](const json& b) { return detokenize(cx, b); });
  svr.Get("/tokenizer_info", cx.wrap([cx](const httplib::Request&, httplib::Response& res) {
    send(res, tokenizer_info(cx));
  }));
  svr.Get("/version", cx.wrap([cx](const httplib::Request&, httplib::Response& res) {
    send(res, {{"version", cx.version}});
  }));
  svr.Get("/v1/models", [cx](const httplib::Request&, httplib::Response& res) {
    send(res, {{"object", "list"}, {"data", json::array({model_card(cx)})}});
  });
  // Model ids are paths (SGLang's default): the id may contain '/'.
  svr.Get(R"(/v1/models/(.+))", cx.wrap([cx](const httplib::Request& req, httplib::Response& res) {
    cx.check_model(req.matches[1].str());
    send(res, model_card(cx));
  }));
  register_responses_route(svr, cx);
}

}  // namespace sala::server::detail
