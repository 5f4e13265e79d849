// The roofline-implied duration of a `sala bench serve` tier (issue 18): what the H200's
// peaks allow for the requests the tier actually ran, so every run says how far it is.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace sala::cli {

struct ServeRoofline {
  double prefill_s = 0;  // every prompt: projections at the format's peak, attention at bf16's
  double decode_s = 0;   // the decode steps at the weight-streaming floor, plus each
                         // sequence's own reads (KV, compressed keys, lightning state)
  double total_s() const { return prefill_s + decode_s; }
};

// The served model as the roofline sees it: its config and how its projections are stored.
struct RooflineModel {
  ModelConfig cfg;
  std::string quantization;  // the server's --quantization ("" | fp8 | w4a16); a checkpoint's
                             // own quantization_config is read from cfg
  int64_t chunk = 8192;      // the server's chunked_prefill_size
};

// Lower bound of a tier's duration. Prefill is serialised (one GPU computes every prompt);
// decode steps: at least the longest answer's, and at least the answers' tokens over the
// concurrency (0 = unbounded), each step reading every linear weight once; sequence bytes at
// the midpoint of each answer's context. prompt_lens / output_lens: the requests' actual
// token counts (the first output token comes from the prefill).
ServeRoofline serve_roofline(const RooflineModel& m, const std::vector<int64_t>& prompt_lens,
                             const std::vector<int64_t>& output_lens, int concurrency);

}  // namespace sala::cli
