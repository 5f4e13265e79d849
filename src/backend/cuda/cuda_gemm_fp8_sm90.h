// The CUTLASS FP8 GEMM's configurations (cuda_gemm_fp8_sm90.cu), each callable alone so that
// the op tests can time and check them side by side; launch_fp8_scaled_gemm_sm90
// (cuda_kernels.h) is the production choice among them.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"  // bf16

namespace sala::cuda {

enum class Fp8Sm90Config {
  kNone,     // no CUTLASS kernel: the caller takes cuBLASLt
  kPrefill,  // 128 x 128 x 128 tiles, cooperative, clusters of 2 along M: runs of > 64 rows
  kDecode,   // 64 x 128 x 128, ping-pong: decode-only steps of 32..64 rows, N >= 2 K
};

// launch_fp8_scaled_gemm_sm90's contract for configuration c, any M >= 1.
bool launch_fp8_scaled_gemm_sm90_config(Fp8Sm90Config c, const uint8_t* xq, const float* sx,
                                        const uint8_t* wq, const float* sw, bf16* y, int64_t M,
                                        int64_t N, int64_t K, void* workspace,
                                        size_t workspace_bytes, cudaStream_t st);

}  // namespace sala::cuda
