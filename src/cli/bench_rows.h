// `sala bench offline`'s result rows: the keys every row of its JSON carries.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>

namespace sala::cli {

// Keys every row carries, whatever its kind (docs/PERF.md's tables and
// scripts/gpu_check.sh's summary read these): name (the table line's label), batch,
// context (tokens before the timed steps, or the prompt length of a prefill), the measured
// value with its unit, the floor in the same unit and ratio (share of the floor reached:
// floor / time, or throughput / ceiling).
// decode_in: the decode runs' prompt length (their context).
void add_common_keys(nlohmann::json& row, int64_t decode_in);

}  // namespace sala::cli
