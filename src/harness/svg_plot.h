// An SVG report of a `sala bench serve` run, written by our own code (no plotting library):
// CDFs of TTFT, ITL and end-to-end latency per tier (log-scale time axis), output tokens per
// second over time per tier, and bars of duration and output throughput per tier.
#pragma once
#include <string>
#include <vector>

#include "harness/bench_serve.h"

namespace sala::harness {

std::string render_bench_svg(const std::vector<TierResult>& tiers, const std::string& title);

}  // namespace sala::harness
