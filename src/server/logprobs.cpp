#include "server/logprobs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "backend/logprobs.h"

namespace sala::server {
namespace {

const json* present(const json& o, const char* k) {
  auto it = o.find(k);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

bool bool_field(const json& o, const char* k) {
  const json* v = present(o, k);
  if (!v) return false;
  if (!v->is_boolean()) bad_request(k, fmt::format("'{}' must be a boolean", k));
  return v->get<bool>();
}

// An integer in [lo, hi], or nullopt when absent.
std::optional<int64_t> int_field(const json& o, const char* k, int64_t lo, int64_t hi) {
  const json* v = present(o, k);
  if (!v) return std::nullopt;
  if (!v->is_number_integer())
    bad_request(k, fmt::format("'{}' must be an integer in [{}, {}]", k, lo, hi));
  const int64_t x = v->is_number_unsigned() ? int64_t(std::min<uint64_t>(v->get<uint64_t>(), INT64_MAX))
                                            : v->get<int64_t>();
  if (x < lo || x > hi) bad_request(k, fmt::format("'{}' must be in [{}, {}], got {}", k, lo, hi, x));
  return x;
}

// Characters (code points) of a token's text: what text_offset counts, as Python's len().
int64_t chars(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

}  // namespace

void parse_chat_logprobs(const json& body, LogprobRequest& lp) {
  lp.enabled = bool_field(body, "logprobs");
  if (auto n = int_field(body, "top_logprobs", 0, kMaxTopLogprobs)) {
    if (*n > 0 && !lp.enabled)
      bad_request("top_logprobs", "'top_logprobs' requires 'logprobs': true");
    lp.top_n = int32_t(*n);
  }
}

void parse_completion_logprobs(const json& body, bool echo, LogprobRequest& lp) {
  const json* v = present(body, "logprobs");
  if (v && v->is_boolean())  // a chat-style flag sent to completions: say what is expected
    bad_request("logprobs", fmt::format("'logprobs' must be an integer in [0, {}] on "
                                        "/v1/completions (the number of alternatives)",
                                        kMaxTopLogprobs));
  if (auto n = int_field(body, "logprobs", 0, kMaxTopLogprobs)) {
    lp.enabled = true;
    lp.top_n = int32_t(*n);
    lp.prompt = echo;
    lp.start = 0;
  }
  if (present(body, "top_logprobs"))
    bad_request("top_logprobs", "'top_logprobs' is a chat parameter; on /v1/completions "
                                "'logprobs' gives the number of alternatives");
}

void parse_generate_logprobs(const json& body, LogprobRequest& lp) {
  for (const char* k : {"return_logprob", "top_logprobs_num", "logprob_start_len"}) {
    const json* v = present(body, k);
    if (v && v->is_array())
      bad_request(k, fmt::format("per-prompt '{}' lists are not supported; give one value", k));
  }
  lp.enabled = bool_field(body, "return_logprob");
  const auto top = int_field(body, "top_logprobs_num", 0, kMaxTopLogprobs);
  const auto start = int_field(body, "logprob_start_len", -1, INT64_MAX);
  lp.return_text = bool_field(body, "return_text_in_logprobs");
  if (!lp.enabled) return;  // SGLang ignores the others without return_logprob
  lp.top_n = int32_t(top.value_or(0));
  lp.prompt = true;
  lp.start = start.value_or(-1);
}

LogprobOptions engine_logprobs(const LogprobRequest& lp, int64_t prompt_len,
                               int32_t max_new_tokens) {
  LogprobOptions o;
  o.output = lp.enabled;
  o.top_n = lp.enabled ? lp.top_n : 0;
  if (lp.enabled && lp.prompt) {
    if (lp.start >= prompt_len)
      bad_request("logprob_start_len",
                  fmt::format("'logprob_start_len' {} is not a position of the prompt ({} tokens)",
                              lp.start, prompt_len));
    o.prompt_start = lp.start < 0 ? prompt_len - 1 : lp.start;
  }
  if (max_new_tokens == 0 && o.prompt_start < 0) o.prompt_start = prompt_len - 1;
  return o;
}

json LogprobFormatter::value(float lp) const {
  return std::isnan(lp) ? json(nullptr) : json(lp);
}

json LogprobFormatter::chat(const std::vector<TokenLogprob>& lps, size_t from, size_t to) const {
  json content = json::array();
  for (size_t i = from; i < to && i < lps.size(); ++i) {
    const TokenLogprob& t = lps[i];
    const std::string s = text(t.token);
    json top = json::array();
    for (size_t k = 0; k < t.top_ids.size(); ++k) {
      const std::string ks = text(t.top_ids[k]);
      top.push_back({{"token", ks}, {"logprob", value(t.top_logprobs[k])}, {"bytes", bytes_of(ks)}});
    }
    content.push_back({{"token", s}, {"logprob", value(t.logprob)}, {"bytes", bytes_of(s)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

json LogprobFormatter::completion(const std::vector<TokenLogprob>* prompt,
                                  const std::vector<TokenLogprob>& out, size_t from, size_t to,
                                  int32_t top_n, int64_t* offset) const {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  auto add = [&](const TokenLogprob& t) {
    const std::string s = text(t.token);
    tokens.push_back(s);
    lps.push_back(value(t.logprob));
    offs.push_back(*offset);
    *offset += chars(s);
    if (std::isnan(t.logprob)) {  // the prompt's first token: no distribution before it
      tops.push_back(nullptr);
      return;
    }
    // The top_n alternatives and the chosen token (OpenAI: "as well the chosen tokens").
    json d = json::object();
    for (size_t k = 0; k < t.top_ids.size() && int32_t(k) < top_n; ++k)
      d[text(t.top_ids[k])] = t.top_logprobs[k];
    d[s] = t.logprob;
    tops.push_back(std::move(d));
  };
  if (prompt)
    for (const TokenLogprob& t : *prompt) add(t);
  for (size_t i = from; i < to && i < out.size(); ++i) add(out[i]);
  return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)}, {"text_offset", std::move(offs)}};
}

void LogprobFormatter::sglang(json& meta, const SeqResult& r, const LogprobRequest& lp) const {
  auto tuple = [&](float v, int32_t id) {
    return json::array({value(v), id, lp.return_text ? json(text(id)) : json(nullptr)});
  };
  auto lists = [&](const std::vector<TokenLogprob>& v, const char* tok_key, const char* top_key) {
    json toks = json::array(), tops = json::array();
    for (const TokenLogprob& t : v) {
      toks.push_back(tuple(t.logprob, t.token));
      if (lp.top_n == 0) continue;
      if (std::isnan(t.logprob)) {
        tops.push_back(nullptr);
        continue;
      }
      json row = json::array();
      for (size_t k = 0; k < t.top_ids.size(); ++k) row.push_back(tuple(t.top_logprobs[k], t.top_ids[k]));
      tops.push_back(std::move(row));
    }
    meta[tok_key] = std::move(toks);
    if (lp.top_n > 0) meta[top_key] = std::move(tops);
  };
  lists(r.prompt_logprobs, "input_token_logprobs", "input_top_logprobs");
  lists(r.output_logprobs, "output_token_logprobs", "output_top_logprobs");
}

}  // namespace sala::server
