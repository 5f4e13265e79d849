// `sala bench offline --long-prefill-beside N`: each long prefill again with N sequences
// decoding beside it, one decode row of each in every chunk's step, as the server's mixed steps
// (a prompt chunk beside the running requests' decodes: what --chunked-prefill-size bounds).
// Timed against the plain prefill of the same run, it shows what the decode rows add to each
// chunk's step; with --profile-ops, in which ops.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "model/minicpm_sala.h"

namespace sala::cli {

struct MixedPrefill {
  int64_t len = 0, chunk = 0, context = 0;
  int decoding = 0;
  double seconds = 0;  // the chunk steps with their decode rows (the decode prefills untimed)
  int64_t steps = 0;   // chunk steps, each with one decode row per decoding sequence
  // The bench's JSON row (kind long_prefill_beside) and table line, against the plain
  // prefill's seconds of the same run.
  std::pair<nlohmann::json, std::string> result(double plain_seconds) const;
};

// Prefills prompt[0, len) in state slot 0 and pages [0, pages_for(len)) in chunks of `chunk`,
// each step also carrying one greedy decode row of each of `decoding` sequences, which were
// first prefilled (untimed) with prompt[0, context) into slots 1..decoding and pages from
// `first_page` on, pages_for(context + ceil(len / chunk)) each.
MixedPrefill time_prefill_beside_decodes(Model& model, const std::vector<int32_t>& prompt,
                                         int64_t len, int64_t chunk, int decoding,
                                         int64_t context, int32_t first_page);

// Raises lim (its page size set) to what that run needs for prompts of up to max_len tokens:
// chunk + decoding rows per step, decoding + 1 logit rows and state slots, the long prompt's
// pages and the decoding sequences' after them.
void plan_mixed_prefill(ModelLimits& lim, int64_t max_len, int64_t chunk, int decoding,
                        int64_t context);

}  // namespace sala::cli
