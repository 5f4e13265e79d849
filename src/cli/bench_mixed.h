// `sala bench offline --long-prefill-beside N`: each long prefill again with N sequences
// decoding beside it, one decode row of each in every chunk's step, as the server's mixed steps
// (a prompt chunk beside the running requests' decodes: what --chunked-prefill-size bounds).
// Timed against the plain prefill of the same run, it shows what the decode rows add to each
// chunk's step; with --profile-ops, in which ops.
#pragma once
#include <cstdint>
#include <vector>

#include "model/minicpm_sala.h"

namespace sala::cli {

struct MixedPrefill {
  double seconds = 0;  // the chunk steps with their decode rows (the decode prefills untimed)
  int64_t steps = 0;   // chunk steps, each with one decode row per decoding sequence
};

// Prefills prompt[0, len) in state slot 0 and pages [0, pages_for(len)) in chunks of `chunk`,
// each step also carrying one greedy decode row of each of `decoding` sequences, which were
// first prefilled (untimed) with prompt[0, context) into slots 1..decoding and pages from
// `first_page` on, pages_for(context + ceil(len / chunk)) each.
MixedPrefill time_prefill_beside_decodes(Model& model, const std::vector<int32_t>& prompt,
                                         int64_t len, int64_t chunk, int decoding,
                                         int64_t context, int32_t first_page);

// The pages that run needs beyond the long prompt's (its decoding sequences'); it also needs
// decoding + 1 state slots and logit rows and chunk + decoding rows per step.
int64_t mixed_prefill_pages(int64_t len, int64_t chunk, int decoding, int64_t context,
                            int32_t page_size);

}  // namespace sala::cli
