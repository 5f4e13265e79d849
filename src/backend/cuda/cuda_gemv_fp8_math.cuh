// The FP8 GEMVs' arithmetic (e4m3 codes as exact f16, f16 MMAs with fp32 accumulation, a fresh
// partial per group of 256 k, the epilogue's scaling), shared by the ring and tile kernels
// (cuda_gemv_fp8.cu) so that both do the same operations in the same order: the same bits.
// Numerics: cuda_gemv_fp8.cu's header.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_gemv_ring.cuh"

namespace sala::cuda::gemv8 {
using namespace gemv;

constexpr int kChunkK = 16;  // k per 16-byte chunk of a weight row

// ---- e4m3 conversions and MMAs ----
// Four e4m3 codes c (bytes 0..3: k, k+1, k+2, k+3) as two f16x2 of their exact values (e4m3 ⊂
// f16): lo = (k, k+1), hi = (k+2, k+3), the lower k in the lower half.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// sm_89+: the hardware conversion, one instruction per pair (F2FP.F16.E4M3.UNPACK_B).
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t c, uint32_t& lo, uint32_t& hi) {
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
      : "=r"(lo), "=r"(hi)
      : "r"(c));
}
#else
// GPUs without FP8 instructions (the sm_80 build): the code S.EEEE.MMM in the top byte of a
// half, then S kept and EEEE.MMM moved right by one: the f16 S.0EEEE.MMM0000000, which is the
// e4m3 value · 2^-8 (subnormals included: f16 subnormal M·2^-17 = M·2^-9 · 2^-8); · 256 in f16
// is exact.
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t c, uint32_t& lo, uint32_t& hi) {
  const auto f16 = [](uint32_t v) {
    const uint32_t h = (v & 0x80008000u) | ((v >> 1) & 0x3f803f80u);
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(0x5c005c00u));  // 256, 256
    return r;
  };
  lo = f16(__byte_perm(c, 0, 0x1404));  // byte 1 -> bits 31..24, byte 0 -> bits 15..8
  hi = f16(__byte_perm(c, 0, 0x3424));  // byte 3, byte 2
}
#endif

// sx of the M rows into sxs[kGemvMaxRows] (1 past M), for every thread of the CTA.
__device__ __forceinline__ void load_row_scales(const float* sx, int M, float* sxs) {
  if (threadIdx.x < kGemvMaxRows) sxs[threadIdx.x] = int(threadIdx.x) < M ? sx[threadIdx.x] : 1.f;
  __syncthreads();
}

// The MMAs of one group (16 chunks: 256 k of the warp's slice) of a 16-row tile, n-tiles nt0 ..
// nt0 + G - 1: fresh partials part[G][4], chunk_mma for v = 0..3, add_part. k16 step j of a
// chunk uses bytes 4j..4j+3 converted to f16 (W and x alike: the same permutation of k, so the
// same dot products) as the pairs 2j, 2j + 1; f16 MMAs with fp32 accumulation chained within
// the group, whose sum is then added to acc in fp32. sm_90 has no FP8 mma.sync: ptxas lowered
// the m16n8k32 e4m3 form (used before session 30) into these same conversions and f16 MMAs,
// each from a zero accumulator, plus 4 FADDs per MMA into the partials (72 of a stage's ~500
// instructions at M = 1, SASS).
// Chunk v of the group: W0 / W8 = chunk 4v + t of weight rows g / g + 8, X[j][v] the same
// chunk of the x codes of n-tile j of the group, into the group's partials part[j].
template <int G>
__device__ __forceinline__ void chunk_mma(float (&part)[G][4], const uint4& W0, const uint4& W8,
                                          const uint4 (&X)[G][4], int v) {
  const uint32_t a[4] = {W0.x, W0.y, W0.z, W0.w}, b[4] = {W8.x, W8.y, W8.z, W8.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t a_lo, a_hi, b_lo, b_hi;
    e4m3x4_to_f16x2(a[k], a_lo, a_hi);
    e4m3x4_to_f16x2(b[k], b_lo, b_hi);
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const uint32_t xc[4] = {X[j][v].x, X[j][v].y, X[j][v].z, X[j][v].w};
      uint32_t x_lo, x_hi;
      e4m3x4_to_f16x2(xc[k], x_lo, x_hi);
      mma_f16(part[j], a_lo, b_lo, a_hi, b_hi, x_lo, x_hi);
    }
  }
}

// The group's partials added to the fp32 totals of n-tiles nt0 .. nt0 + G - 1.
template <int G, int NT>
__device__ __forceinline__ void add_part(float (&acc)[NT][4], int nt0, const float (&part)[G][4]) {
#pragma unroll
  for (int j = 0; j < G; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt0 + j][i] += part[j][i];
}

// The weight scale this thread applies in finish<ROWS> for the tile of rows from n0.
template <int ROWS>
__device__ __forceinline__ float tile_scale(const float* __restrict__ ws, int64_t n0, int64_t N) {
  static_assert(kThreads % ROWS == 0, "finish's thread -> row map");
  return __ldg(ws + min(n0 + int64_t(threadIdx.x % ROWS), N - 1));
}

// finish's scaling: (sum · sx[m]) · ws[n], the CPU's order. Thread i only finishes weight row
// n0 + i % ROWS (kThreads is a multiple of ROWS), whose scale wsn it loaded when the tile
// started (tile_scale): a load from DRAM in the epilogue would stall every tile by its latency.
struct Scale {
  const float* sxs;
  float wsn;
  __device__ float operator()(float v, int m) const {
    return __fmul_rn(__fmul_rn(v, sxs[m]), wsn);
  }
};

}  // namespace sala::cuda::gemv8
