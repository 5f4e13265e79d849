#include "harness/sse.h"

#include <nlohmann/json.hpp>

namespace sala::harness {

namespace {
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }
std::string strip(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return std::string(s.substr(a, b - a));
}
}  // namespace

std::vector<std::string> LineSplitter::feed(std::string_view bytes) {
  std::vector<std::string> lines;
  buf_.append(bytes);
  size_t pos = 0;
  for (;;) {
    size_t nl = buf_.find('\n', pos);
    if (nl == std::string::npos) break;
    std::string l = strip(std::string_view(buf_).substr(pos, nl - pos));
    if (!l.empty()) lines.push_back(std::move(l));
    pos = nl + 1;
  }
  buf_.erase(0, pos);
  return lines;
}

std::string LineSplitter::flush() {
  std::string l = strip(buf_);
  buf_.clear();
  return l;
}

SglangStreamParser::SglangStreamParser(RequestOutput& out, int64_t requested_output_len)
    : out_(out) {
  out_.output_len = requested_output_len;
  most_recent_ = out_.start_s;
}

bool SglangStreamParser::feed(std::string_view bytes, double now) {
  if (!ok()) return false;
  for (auto& l : split_.feed(bytes))
    if (!line(l, now)) return false;
  return true;
}

bool SglangStreamParser::finish(double now) {
  if (!ok()) return false;
  std::string l = split_.flush();
  if (!l.empty()) return line(l, now);
  return true;
}

bool SglangStreamParser::line(const std::string& l, double now) {
  std::string_view data = l;
  if (data.rfind("data: ", 0) == 0) data.remove_prefix(6);
  out_.latency_s = now - out_.start_s;
  if (data == "[DONE]") {
    saw_done_ = true;
    return true;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data);
  } catch (const std::exception& e) {
    error_ = "stream line is not JSON: " + std::string(data.substr(0, 200));
    return false;
  }
  if (!j.is_object()) {
    error_ = "stream chunk is not a JSON object: " + std::string(data.substr(0, 200));
    return false;
  }
  if (j.contains("error")) {
    error_ = "server error in stream: " + j["error"].dump().substr(0, 500);
    return false;
  }
  const nlohmann::json* meta = nullptr;
  if (j.contains("meta_info") && j["meta_info"].is_object()) {
    meta = &j["meta_info"];
    auto it = meta->find("prompt_tokens");
    if (it != meta->end() && it->is_number_integer()) out_.server_prompt_len = it->get<int64_t>();
  }
  auto t = j.find("text");
  if (t == j.end() || !t->is_string() || t->get_ref<const std::string&>().empty()) return true;
  out_.generated_text = t->get<std::string>();
  if (!meta || !meta->contains("completion_tokens") || !(*meta)["completion_tokens"].is_number()) {
    error_ = "stream chunk has text but no meta_info.completion_tokens";
    return false;
  }
  int64_t len = (*meta)["completion_tokens"].get<int64_t>();
  out_.output_len = len;
  if (!have_first_) {
    have_first_ = true;
    out_.ttft_s = now - out_.start_s;
  } else {
    int64_t k = len - last_len_;
    if (k == 0) return true;
    double gap = now - most_recent_;
    // bench_serving would extend by a negative count (a no-op) if the count went backwards.
    for (int64_t i = 0; i < k; ++i) out_.itl.push_back(gap / static_cast<double>(k));
  }
  most_recent_ = now;
  last_len_ = len;
  return true;
}

}  // namespace sala::harness
