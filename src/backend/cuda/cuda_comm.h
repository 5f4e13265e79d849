// The device side of tensor parallelism's CUDA communicators (cuda_comm_*.cpp; the interface
// is backend/comm.h): the kernels they launch. Included by .cu files (no fmt).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace sala::cuda {

inline constexpr int kMaxCommRanks = 8;

// The ranks' partials of an all-reduce, each [n] elements on this device (or one it can read).
struct RankParts {
  const void* p[kMaxCommRanks];
};

// out[i] = parts.p[0][i] + parts.p[1][i] + ... + parts.p[ranks-1][i], summed in fp32 in rank
// order, then rounded once to the element type (bf16: round to nearest even; fp32: as is).
// For two ranks that is NCCL's bf16 sum bit for bit (one rounding of a + b).
void launch_sum_ranks(RankParts parts, int ranks, int64_t n, bool bf16, void* out,
                      cudaStream_t stream);

// Each row's maximum of a vocabulary slice: ids[r] = vocab_offset + the first maximum's column
// of logits [rows, cols] fp32 (NaN never wins), vals[r] = its value.
void launch_argmax_pairs(const float* logits, int64_t rows, int64_t cols, int64_t vocab_offset,
                         int32_t* ids, float* vals, cudaStream_t stream);

}  // namespace sala::cuda
