// The int8 tensor-core int4 GEMV (int4_imma_gemv.cu), an experiment of issue 22 kept beside the
// product: written as product code in session 35, tested on the H200 (the op tests of the time
// passed) and slower than the ring GEMV (cuda_gemv_int4.cu) at every shape and M = 1..8, so it
// left the product (docs/PERF.md, "The int8 int4 GEMV"). int4_imma_ab.cu times it beside the
// ring GEMV; int4_imma_emu.py emulates its digit layout.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace sala::cuda {

// Runs of at most this many x rows (1, 2 or 4 n8 tiles of two rows).
inline constexpr int kInt4ImmaMaxRows = 8;
void gemv_int4_imma_init();
// Device bytes of the digit scratch for K (a multiple of 128) and every K' <= K.
size_t gemv_int4_imma_scratch_bytes(int64_t K);
bool gemv_int4_imma_supported(const void* w, int64_t K, int64_t group, int64_t M);
// y = x · Wᵀ as launch_gemv_int4 (the same device words and fp32 scales, group 128, GemvOut's
// parts / fp32 / silu_pair), within its error class (<= 2 bf16 ulps of the exact product), not
// its bits; a digit kernel writes x's digits into `scratch` first (both under PDL).
void launch_gemv_int4_imma(const bf16* x, int64_t ldx, const uint32_t* w, const float* w_scales,
                           int64_t N, int K, int M, const GemvOut& o, void* scratch,
                           int64_t scratch_k, cudaStream_t st);

}  // namespace sala::cuda
