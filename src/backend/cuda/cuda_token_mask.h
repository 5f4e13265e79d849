// Structured output's token masks applied to device logits (see cuda_token_mask.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace sala::cuda {
// For each i < n: row rows[i] of logits [*, cols] fp32 gets -inf wherever masks[i * words ..]
// has the token's bit clear (ids at or beyond 32 * words: clear). rows and masks in device
// memory. The same numbers as sala::mask_logits_row (backend/token_mask.h).
void launch_mask_logits(float* logits, int64_t cols, const int32_t* rows, int64_t n,
                        const uint32_t* masks, int32_t words, cudaStream_t stream);
}  // namespace sala::cuda
