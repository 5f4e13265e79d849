// Device log-probabilities of fp32 logit rows (see cuda_logprobs.cu; host twin: logprobs_of_row,
// backend/logprobs.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace sala::cuda {
// One block per requested row: rows[n] index logits [*, vocab]; targets[n] (-1: none); top_n
// in [0, kMaxTopLogprobs]. Outputs in device memory: logprob[n], top_ids [n, top_n],
// top_logprobs [n, top_n]. rows and targets are device memory too.
void launch_logprobs_rows(const float* logits, int32_t vocab, const int32_t* rows,
                          const int32_t* targets, int64_t n, int top_n, float* logprob,
                          int32_t* top_ids, float* top_logprobs, cudaStream_t stream);
}  // namespace sala::cuda
