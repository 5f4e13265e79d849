// Kernels of the CUDA communicators (cuda_comm.h): the same-GPU group's all-reduce and the
// per-rank half of the vocab-parallel argmax.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_argmax.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_comm.h"

namespace sala::cuda {
namespace {

template <typename T>
__device__ __forceinline__ float to_f32(T v) {
  if constexpr (sizeof(T) == 2) return __bfloat162float(v);
  else return v;
}

// Grid-stride over n elements; each thread sums its element over the ranks in rank order.
template <typename T>
__global__ void sum_ranks_kernel(RankParts parts, int ranks, int64_t n, T* __restrict__ out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float s = to_f32(static_cast<const T*>(parts.p[0])[i]);
    for (int k = 1; k < ranks; ++k) s += to_f32(static_cast<const T*>(parts.p[k])[i]);
    if constexpr (sizeof(T) == 2) out[i] = __float2bfloat16_rn(s);
    else out[i] = s;
  }
}

// One thread per row: the value at the row's argmax, and the id moved to the whole vocabulary.
__global__ void argmax_values_kernel(const float* __restrict__ logits, int64_t rows, int64_t cols,
                                     int64_t vocab_offset, int32_t* __restrict__ ids,
                                     float* __restrict__ vals) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int32_t j = ids[r];
  vals[r] = logits[r * cols + j];
  ids[r] = int32_t(vocab_offset + j);
}

}  // namespace

void launch_sum_ranks(RankParts parts, int ranks, int64_t n, bool bf16, void* out,
                      cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  const unsigned blocks = unsigned(std::min<int64_t>((n + threads - 1) / threads, 4096));
  if (bf16)
    sum_ranks_kernel<<<blocks, threads, 0, stream>>>(parts, ranks, n,
                                                     static_cast<__nv_bfloat16*>(out));
  else
    sum_ranks_kernel<<<blocks, threads, 0, stream>>>(parts, ranks, n, static_cast<float*>(out));
  CUDA_CHECK_LAUNCH();
}

void launch_argmax_pairs(const float* logits, int64_t rows, int64_t cols, int64_t vocab_offset,
                         int32_t* ids, float* vals, cudaStream_t stream) {
  if (rows == 0) return;
  launch_argmax_rows(logits, rows, cols, ids, stream);  // the slice's first maximum
  argmax_values_kernel<<<unsigned((rows + 127) / 128), 128, 0, stream>>>(logits, rows, cols,
                                                                        vocab_offset, ids, vals);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
