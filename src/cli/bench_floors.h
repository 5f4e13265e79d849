// The floors of `sala bench offline` (../shared/PERF.md): the H200 peaks, what a long
// prefill computes in its attention, what one sequence adds to a decode step's reads.
#pragma once
#include <cstdint>

#include "core/config.h"

namespace sala::cli {

inline constexpr double kPeakFlops = 790e12;      // bf16 GEMM, H200 (PERF.md)
inline constexpr double kPeakFlopsFp8 = 1370e12;  // FP8 e4m3 GEMM (cuBLASLt, M = 8192), H200 (PERF.md)
inline constexpr double kPeakBytes = 4.30e12;     // device copy, H200 (PERF.md)

// Attention FLOPs of prefilling L tokens in chunks of `chunk`, all layers. Sparse layers
// (SPEC §9.2-9.6): a chunk is dense or sparse by the sequence's length after it; per query
// token at position t, dense: q·k and p·v over t+1 keys; sparse: stage 1 over the level-1
// and level-2 entries visible at t, stage 2 over at most total_topk blocks. Lightning layers:
// the recurrent form's minimum, state update k·vᵀ and readout q·S (2·d² each per head).
double prefill_attention_flops(const sala::ModelConfig& c, int64_t L, int64_t chunk);

// Bytes one sequence adds to a decode step at context C (bf16 caches, fp32 states; the
// step's length is C + 1): sparse layers read all K and V below dense_len, else the
// compressed keys and at most total_topk blocks of K and V; lightning layers read and write
// their [nh, d, d] state.
double decode_seq_bytes(const sala::ModelConfig& c, int64_t C);

}  // namespace sala::cli
