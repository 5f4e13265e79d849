// The two forms of simple GLA for one head (SPEC §8.3-8.4), shared by the CPU backend and
// the tests. q/k/v rows are `stride` floats apart; S is the [d, d] fp32 state (updated).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/gla.h"  // kGlaChunk

namespace sala {

void gla_recurrent(const float* q, const float* k, const float* v, int64_t T, int64_t stride,
                   int d, float g, float scale, float* S, float* o, int64_t o_stride);
void gla_chunked(const float* q, const float* k, const float* v, int64_t T, int64_t stride, int d,
                 float g, float scale, float* S, float* o, int64_t o_stride, int chunk);

}  // namespace sala
