// The server's engine steps during a bench tier, by kind: prompt chunks only, decode rows
// only, or both in one step (sala's /get_server_info `engine_stats.step_kinds`, EngineStats
// in engine/engine.h; other servers report none). Read before a tier's timer starts and
// before it stops, the difference says where the tier's time went on the server: mean wall
// time per step of each kind and the part of it inside the model's forward.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace sala::harness {

struct EngineSteps {
  struct Kind {
    int64_t steps = 0;
    double seconds = 0, forward_seconds = 0;
  };
  Kind prefill, mixed, decode;
};

// GET base_url + path and read engine_stats.step_kinds; nullopt when the request fails or
// the server reports no step kinds.
std::optional<EngineSteps> read_engine_steps(const std::string& base_url, const std::string& path);

// What happened between two readings (after - before), per kind.
EngineSteps steps_between(const EngineSteps& before, const EngineSteps& after);

// "prefill 12 x 95.10 ms (forward 94.02), mixed ..., decode ..." (kinds without steps left out).
std::string format_engine_steps(const EngineSteps& s);

nlohmann::json engine_steps_json(const EngineSteps& s);

}  // namespace sala::harness
