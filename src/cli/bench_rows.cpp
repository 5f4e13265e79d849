#include "cli/bench_rows.h"

#include <fmt/format.h>

#include <string>

#include "core/check.h"

namespace sala::cli {

void add_common_keys(nlohmann::json& row, int64_t decode_in) {
  const std::string kind = row.at("kind");
  const int batch = row.at("batch");
  auto set = [&](int64_t context, const std::string& label, const char* unit, double value,
                 double floor, double ratio) {
    row["name"] = fmt::format("{} B={} {}", kind, batch, label);
    row["context"] = context;
    row["unit"] = unit;
    row["value"] = value;
    row["floor"] = floor;
    row["ratio"] = ratio;
  };
  if (kind == "decode") {
    set(decode_in, fmt::format("C={}", decode_in), "ms_per_step", row["ms_per_step"],
        row["floor_ms"], row["fraction_of_floor"]);
  } else if (kind == "prefill") {
    const int64_t L = row["input_len"];
    const double tok_s = row["tok_s"], ceiling = row["ceiling_tok_s"];
    set(L, fmt::format("L={}", L), "tok_s", tok_s, ceiling, tok_s / ceiling);
  } else if (kind == "long_prefill") {
    const int64_t L = row["input_len"];
    set(L, fmt::format("L={}", L), "seconds", row["seconds"], row["floor_seconds"],
        row["fraction_of_floor"]);
  } else if (kind == "decode_grammar") {
    set(decode_in, fmt::format("C={} {}", decode_in, std::string(row["grammar"])), "ms_per_step",
        row["ms_per_step"], row["decode_ms"], double(row["decode_ms"]) / double(row["ms_per_step"]));
  } else if (kind == "verify") {
    set(decode_in, fmt::format("C={} K={}", decode_in, int(row["draft_tokens"])), "ms_per_step",
        row["ms_per_step"], row["decode_ms"], double(row["decode_ms"]) / double(row["ms_per_step"]));
  } else if (kind == "decode_sampling") {  // floor: the greedy step of the same run
    set(decode_in, fmt::format("C={} sampled", decode_in), "ms_per_step", row["ms_per_step"],
        row["greedy_ms"], double(row["greedy_ms"]) / double(row["ms_per_step"]));
  } else if (kind == "long_prefill_beside") {  // floor: the plain prefill of the same run
    const int64_t L = row["input_len"];
    set(L, fmt::format("L={} beside {}", L, int(row["decoding"])), "seconds", row["seconds"],
        row["plain_seconds"], double(row["plain_seconds"]) / double(row["seconds"]));
  } else {
    SALA_CHECK(kind == "long_decode");
    const int64_t C = row["context"];
    set(C, fmt::format("C={}", C), "ms_per_step", row["ms_per_step"], row["floor_ms"],
        row["fraction_of_floor"]);
  }
}

}  // namespace sala::cli
