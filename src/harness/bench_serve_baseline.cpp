// `sala bench serve --baseline FILE`: the tier durations of an earlier run, from our own
// --out JSON or from SGLang bench_serving's JSONL output (bench_serve.h).
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "harness/bench_serve.h"

namespace sala::harness {

namespace {
// Python's json.dumps writes Infinity / -Infinity / NaN (bench_serving's request_rate is
// Infinity): turn them into null outside strings so that the line parses.
std::string python_json_to_json(const std::string& l) {
  std::string o;
  o.reserve(l.size());
  bool in_str = false;
  for (size_t i = 0; i < l.size(); ++i) {
    char c = l[i];
    if (in_str) {
      o += c;
      if (c == '\\' && i + 1 < l.size()) o += l[++i];
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    if (l.compare(i, 9, "-Infinity") == 0) {
      o += "null";
      i += 8;
    } else if (l.compare(i, 8, "Infinity") == 0) {
      o += "null";
      i += 7;
    } else if (l.compare(i, 3, "NaN") == 0) {
      o += "null";
      i += 2;
    } else {
      o += c;
    }
  }
  return o;
}
}  // namespace

std::map<std::string, double> load_baseline(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("cannot open baseline '{}'", path);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::map<std::string, double> out;
  try {
    auto j = nlohmann::json::parse(all);
    if (j.is_object() && j.contains("tiers")) {
      for (const auto& t : j["tiers"]) out[t.at("label").get<std::string>()] = t.at("duration_s").get<double>();
      if (out.empty()) fail("baseline '{}' has no tiers", path);
      return out;
    }
  } catch (const nlohmann::json::exception&) {
    // not one JSON document: try JSON lines below
  }
  size_t pos = 0;
  while (pos < all.size()) {
    size_t e = all.find('\n', pos);
    std::string l = all.substr(pos, e == std::string::npos ? std::string::npos : e - pos);
    pos = e == std::string::npos ? all.size() : e + 1;
    if (l.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      auto j = nlohmann::json::parse(python_json_to_json(l));
      if (!j.is_object() || !j.contains("duration")) continue;
      int c = 0;
      if (j.contains("max_concurrency") && j["max_concurrency"].is_number_integer())
        c = j["max_concurrency"].get<int>();
      out[tier_label(c)] = j["duration"].get<double>();  // a later line for a tier wins
    } catch (const nlohmann::json::exception&) {
      continue;
    }
  }
  if (out.empty())
    fail("baseline '{}' is neither a `sala bench serve --out` file nor bench_serving JSONL output", path);
  return out;
}

}  // namespace sala::harness
