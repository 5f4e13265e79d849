// Device sampling of fp32 logit rows (see cuda_sample.cu; host twin: HostSampler).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/sampling.h"

namespace sala::cuda {
// One token per row: rows[n] index logits [*, vocab]; params[n] and edits in device memory;
// pen_table [slots, vocab] (rows with penalty_slot >= 0 read it and count their token);
// scratch [n, 2, vocab] fp32; out[n] device ids.
void launch_sample_rows(const float* logits, int32_t vocab, const int32_t* rows, int64_t n,
                        const RowSampling* params, const LogitEdit* edits, int32_t* pen_table,
                        float* scratch, int32_t* out, cudaStream_t stream);
}  // namespace sala::cuda
