// Structured output on the device: the grammar's allowed-token bitmask (one per constrained
// logit row, filled by the engine thread on the host) sets every disallowed logit to -inf, so
// the device argmax and the host sampler see only allowed tokens and a greedy step still
// moves R ids, not R x vocab logits. Word-parallel: one thread per 32 tokens.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_token_mask.h"

namespace sala::cuda {
namespace {

constexpr int kThreads = 256;

// grid (ceil(ceil(cols/32) / kThreads), n): thread w of row i handles tokens 32w .. 32w+31.
__global__ void mask_logits_kernel(float* __restrict__ logits, int64_t cols,
                                   const int32_t* __restrict__ rows,
                                   const uint32_t* __restrict__ masks, int32_t words) {
  const int64_t i = blockIdx.y;
  const int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t first = w * 32;
  if (first >= cols) return;
  float* row = logits + int64_t(rows[i]) * cols;
  const uint32_t bits = w < words ? masks[i * words + w] : 0u;
  if (bits == 0xffffffffu) return;  // every token of the word allowed: nothing to write
  const int64_t end = first + 32 < cols ? first + 32 : cols;
  for (int64_t j = first; j < end; ++j)
    if (!((bits >> (j - first)) & 1u)) row[j] = -INFINITY;
}

}  // namespace

void launch_mask_logits(float* logits, int64_t cols, const int32_t* rows, int64_t n,
                        const uint32_t* masks, int32_t words, cudaStream_t stream) {
  if (n == 0 || cols == 0) return;
  const int64_t col_words = (cols + 31) / 32;
  const dim3 grid(unsigned((col_words + kThreads - 1) / kThreads), unsigned(n));
  mask_logits_kernel<<<grid, kThreads, 0, stream>>>(logits, cols, rows, masks, words);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
