// The CUTLASS W4A16 prefill GEMM's configurations (cuda_gemm_int4_sm90.cu), each callable
// alone so that the op tests can time and check them side by side.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"  // bf16

namespace sala::cuda {

// 128 (weight rows) x 256 (x rows) x 64 tiles, cooperative, the codes in the shuffled order.
// H100, M = 2,048, one 9B forward's GEMMs (CudaInt4Sm90.Speed, session 37): fp32 scales 46.95
// ms, bf16 scales 46.61, against dequantize + cuBLASLt 64.0 and bf16 weights 47.3. Measured
// slower (bf16 scales unless said): the codes in plain k order 49.4 (fp32 scales 52.5), and
// with them 128 x 128 tiles 60.5 (fp32 scales 70.0), 128 x 128 in clusters of 2 along the
// weight rows 72.2 (fp32), 64 x 256 ping-pong and 128 x 256 x 128 tiles 3-48 % slower per
// shape; 128 x 256 in clusters of 2 along the x rows within 0.5 % per shape.
enum class Int4Sm90Config {
  kF32Scales,   // fp32 scales: int4 -> fp32, times the scale, -> bf16
  kBf16Scales,  // bf16 scales (every scale a bf16 value): CUTLASS's bf16 multiply, the same
                // products (q · s is exact in fp32, so both round it once to bf16)
};

// y [M, N] row-major (bf16) = x [M, K] row-major (bf16) · Wᵀ, W = the int4 codes [N, K] in
// the shuffled order (launch_int4_shuffle_codes) times the scales, transposed [K / group, *]
// with leading dimension ld_scales >= N (fp32, or bf16 for kBf16Scales;
// launch_int4_scales_transposed). False, launching nothing, where the GPU is not sm_90 or the
// problem is refused (N or K not multiples of 16, alignment, group).
bool launch_int4_gemm_sm90_config(Int4Sm90Config c, const bf16* x, const uint8_t* codes,
                                  const void* scales_t, int64_t ld_scales, bf16* y, int64_t M,
                                  int64_t N, int64_t K, int group, void* workspace,
                                  size_t workspace_bytes, cudaStream_t st);

// The codes of a device-layout weight [N, K] (cuda_gemv_int4.cuh) in CUTLASS's shuffled order
// for launch_int4_gemm_sm90_config; N and K multiples of 16. A part of whole 16-row blocks
// starts at its row offset x K / 2 bytes.
void launch_int4_shuffle_codes(const uint32_t* w, int64_t N, int64_t K, uint32_t* out,
                               cudaStream_t st);

}  // namespace sala::cuda
