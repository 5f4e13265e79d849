// Greedy decoding on the device: argmax of each fp32 logit row, ties to the lowest id
// (torch.argmax semantics), so a decode step moves R ids to the host instead of R × vocab
// floats (64 × 73,448 × 4 B = 18.8 MB per step at batch 64).
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/cuda_argmax.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_launch.cuh"

namespace sala::cuda {
namespace {

constexpr int kThreads = 1024;

struct Best {
  float v;
  int32_t i;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  // NaN never wins; equal values keep the lower index.
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

// One block per row: logits [rows, cols] fp32 → out[rows].
__global__ void argmax_rows_kernel(const float* __restrict__ logits, int64_t cols,
                                   int32_t* __restrict__ out) {
  pdl_begin();  // launch_pdl: before any read or write
  const float* row = logits + int64_t(blockIdx.x) * cols;
  Best b{-FLT_MAX, INT32_MAX};
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) b = better(b, Best{row[j], int32_t(j)});
  for (int off = 16; off > 0; off >>= 1) {
    Best o{__shfl_down_sync(0xffffffffu, b.v, off), __shfl_down_sync(0xffffffffu, b.i, off)};
    b = better(b, o);
  }
  __shared__ Best warp_best[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_best[warp] = b;
  __syncthreads();
  if (warp == 0) {
    b = lane < int(blockDim.x / 32) ? warp_best[lane] : Best{-FLT_MAX, INT32_MAX};
    for (int off = 16; off > 0; off >>= 1) {
      Best o{__shfl_down_sync(0xffffffffu, b.v, off), __shfl_down_sync(0xffffffffu, b.i, off)};
      b = better(b, o);
    }
    if (lane == 0) out[blockIdx.x] = b.i == INT32_MAX ? 0 : b.i;
  }
}

}  // namespace

void launch_argmax_rows(const float* logits, int64_t rows, int64_t cols, int32_t* out,
                        cudaStream_t stream) {
  if (rows == 0) return;
  launch_pdl(argmax_rows_kernel, unsigned(rows), kThreads, 0, stream, logits, cols, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
