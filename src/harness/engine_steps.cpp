#include "harness/engine_steps.h"

#include <fmt/format.h>

#include <utility>

#include "core/error.h"
#include "harness/http.h"

namespace sala::harness {

namespace {
constexpr std::pair<const char*, EngineSteps::Kind EngineSteps::*> kKinds[] = {
    {"prefill", &EngineSteps::prefill}, {"mixed", &EngineSteps::mixed},
    {"decode", &EngineSteps::decode}};
}  // namespace

std::optional<EngineSteps> read_engine_steps(const std::string& base_url, const std::string& path) {
  nlohmann::json info;
  try {
    info = get_json(base_url, path, 60);
  } catch (const sala::Error&) {
    return std::nullopt;  // bench_serving only asks for it; a server without it still counts
  }
  if (!info.is_object() || !info.contains("engine_stats") ||
      !info["engine_stats"].is_object() || !info["engine_stats"].contains("step_kinds"))
    return std::nullopt;
  const nlohmann::json& j = info["engine_stats"]["step_kinds"];
  EngineSteps s;
  try {
    for (const auto& [name, member] : kKinds) {
      const nlohmann::json& k = j.at(name);
      s.*member = {k.at("steps").get<int64_t>(), k.at("seconds").get<double>(),
                   k.at("forward_seconds").get<double>()};
    }
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  return s;
}

EngineSteps steps_between(const EngineSteps& before, const EngineSteps& after) {
  EngineSteps d;
  for (const auto& [name, member] : kKinds) {
    (void)name;
    const EngineSteps::Kind &a = before.*member, &b = after.*member;
    d.*member = {b.steps - a.steps, b.seconds - a.seconds, b.forward_seconds - a.forward_seconds};
  }
  return d;
}

std::string format_engine_steps(const EngineSteps& s) {
  std::string o;
  for (const auto& [name, member] : kKinds) {
    const EngineSteps::Kind& k = s.*member;
    if (k.steps <= 0) continue;
    o += fmt::format("{}{} {} x {:.2f} ms (forward {:.2f})", o.empty() ? "" : ", ", name, k.steps,
                     1e3 * k.seconds / double(k.steps), 1e3 * k.forward_seconds / double(k.steps));
  }
  return o.empty() ? "no steps" : o;
}

nlohmann::json engine_steps_json(const EngineSteps& s) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, member] : kKinds) {
    const EngineSteps::Kind& k = s.*member;
    j[name] = {{"steps", k.steps}, {"seconds", k.seconds}, {"forward_seconds", k.forward_seconds}};
  }
  return j;
}

}  // namespace sala::harness
