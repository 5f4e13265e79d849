// Skinny bf16 GEMM on Hopper (cuda_skinny_sm90.cu): y[M, N] = x[M, K] · W[N, K]^T for M <= 64,
// TMA + wgmma with the weights as the MMA's A operand (128 weight rows per tile) and the x rows
// as its B operand (always 64 columns), so every M runs the same instructions and row m's bits
// do not depend on M (batch invariance without a per-M kernel); K is summed in 4 fixed chunks
// added in order, so the bits depend on neither N nor the K split chosen for the GPU.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"  // GemvOut

namespace sala::cuda {

// K splits of an [N, K] weight of elem_bytes per weight (bf16 2, FP8 1) on this GPU (1, 2 or
// 4; a function of N, K and the SM count only, never of M).
int skinny_sm90_splits(int64_t N, int64_t K, int elem_bytes = 2);
// Workspace of any launch on this GPU: fp32 partial sums and per-tile counters (bytes; zeroed
// once, the kernel leaves the counters zeroed).
size_t skinny_sm90_workspace_bytes();
// An sm_90 device and a driver with TMA descriptors.
bool skinny_sm90_available();
// Kernel attributes now (outside any stream capture).
void skinny_sm90_init();
// skinny_sm90_available, K % 64 == 0, 16-byte aligned x rows and w, M in 1..64.
bool skinny_sm90_supported(const void* x, int64_t ldx, const void* w, int64_t K, int64_t M);
// Outputs through o exactly as launch_gemv's: parts by weight-row ranges, fp32 logits holding
// bf16-rounded values, or silu_pair (weight rows [0, N/2) the gate, [N/2, N) the up
// projection; y[0] = bf16(bf16(silu(g)) * u)). ws: skinny_sm90_workspace_bytes. splits: 0
// for skinny_sm90_splits (tests force others; the bits are the same).
void launch_skinny_sm90(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t N,
                        int K, int M, const GemvOut& o, void* ws, cudaStream_t st,
                        int splits = 0);

// W8A8 FP8: y = (Σ_k xq[m, k] · wq[n, k]) · sx[m] · w_scales[n] (the FP8 GEMV's epilogue order)
// with e4m3 codes xq [M, ldq] and their per-row scales sx (launch_quantize_rows_fp8's), wq
// [N, K]; wgmma.m64n64k32 e4m3, each 128-k stage's sums promoted into fp32, then the same
// chunk order and outputs as the bf16 kernel. K % 128 == 0, ldq % 16 == 0.
bool skinny_fp8_sm90_supported(const void* xq, int64_t ldq, const void* w, int64_t K, int64_t M);
void launch_skinny_fp8_sm90(const uint8_t* xq, int64_t ldq, const float* sx, const uint8_t* w,
                            const float* w_scales, int64_t N, int K, int M, const GemvOut& o,
                            void* ws, cudaStream_t st, int splits = 0);

// W4A16 (cuda_skinny_int4_sm90.cu): w the int4 GEMV's device words [N, K / 8] (repacked at
// upload) with fp32 scales [N, K / group]; y = Σ_g s_g Σ_{k in g} q_k x_k per output, rounded
// once; outputs through o as launch_gemv_int4's. Supported: skinny_sm90_available, M in 1..64,
// K and group multiples of 128, K's chunks holding whole groups, 16-byte aligned x rows and w.
// skinny_int4_sm90_init: the kernel's attributes (outside any capture). splits: 0 for
// skinny_int4_sm90_splits (a function of N and K only; the bits are the same for any split).
bool skinny_int4_sm90_supported(const void* x, int64_t ldx, const void* w, int64_t K,
                                int64_t group, int64_t M);
void skinny_int4_sm90_init();
int skinny_int4_sm90_splits(int64_t N, int64_t K);
void launch_skinny_int4_sm90(const __nv_bfloat16* x, int64_t ldx, const uint32_t* w,
                             const float* w_scales, int64_t N, int K, int group, int M,
                             const GemvOut& o, void* ws, cudaStream_t st, int splits = 0);

}  // namespace sala::cuda
