// Device argmax of fp32 logit rows (see cuda_argmax.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace sala::cuda {
// logits [rows, cols] fp32 on the device → out[rows] int32 on the device.
void launch_argmax_rows(const float* logits, int64_t rows, int64_t cols, int32_t* out,
                        cudaStream_t stream);
}  // namespace sala::cuda
