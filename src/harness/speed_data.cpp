#include "harness/speed_data.h"

#include <fmt/core.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "harness/py_random.h"

namespace sala::harness {

namespace {
struct RawRow {
  std::string prompt, response;
  size_t line_no = 0;
};

std::optional<std::string> str_field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it != j.end() && it->is_string()) return it->get<std::string>();
  return std::nullopt;
}

std::string turn_text(const nlohmann::json& t) {
  if (t.is_object()) {
    if (auto s = str_field(t, "content")) return *s;
    if (auto s = str_field(t, "value")) return *s;
  }
  return {};
}
}  // namespace

std::vector<SpeedRow> load_speed_rows(const std::string& path, const TokenCounter& counter,
                                      const SpeedDataOptions& opt) {
  std::ifstream f(path);
  if (!f) fail("cannot open speed data '{}'", path);
  std::vector<RawRow> raw;
  std::string line;
  size_t line_no = 0, bad_json = 0, incomplete = 0;
  while (std::getline(f, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      ++bad_json;  // bench_serving skips lines that are not JSON
      continue;
    }
    if (!j.is_object()) {
      ++bad_json;
      continue;
    }
    RawRow r;
    r.line_no = line_no;
    std::optional<std::string> q = str_field(j, "question");
    if (!q) q = str_field(j, "input");
    if (!q) q = str_field(j, "prompt");
    std::optional<std::string> a = str_field(j, "model_response");
    if ((!q || !a) && (j.contains("conversations") || j.contains("conversation"))) {
      const auto& c = j.contains("conversations") ? j["conversations"] : j["conversation"];
      if (c.is_array() && c.size() >= 2) {
        q = turn_text(c[0]);
        a = turn_text(c[1]);
      }
    }
    if (!q || !a) {
      ++incomplete;
      continue;
    }
    r.prompt = std::move(*q);
    r.response = std::move(*a);
    raw.push_back(std::move(r));
  }
  if (bad_json) fmt::print(stderr, "warning: {}: skipped {} lines that are not JSON objects\n", path, bad_json);
  if (incomplete)
    fmt::print(stderr, "warning: {}: skipped {} lines without question/input/prompt and model_response\n",
               path, incomplete);
  if (raw.empty()) fail("speed data '{}' has no usable rows", path);

  if (opt.shuffle_seed) PyRandom(*opt.shuffle_seed).shuffle(raw);

  std::vector<SpeedRow> rows;
  size_t pruned = 0;
  for (auto& r : raw) {
    if (opt.num_prompts >= 0 && static_cast<int64_t>(rows.size()) == opt.num_prompts) break;
    SpeedRow s;
    s.prompt_len = counter.count(r.prompt);
    s.output_len = counter.count(r.response);
    if (s.prompt_len < 2 || s.output_len < 2) {
      ++pruned;  // bench_serving prunes too-short sequences
      continue;
    }
    s.prompt = std::move(r.prompt);
    rows.push_back(std::move(s));
  }
  if (pruned) fmt::print(stderr, "warning: {}: dropped {} rows with < 2 prompt or output tokens\n", path, pruned);
  if (rows.empty()) fail("speed data '{}' has no rows left after pruning", path);
  return rows;
}

}  // namespace sala::harness
