// Device helpers shared by the int4 GEMV kernels: cuda_gemv_int4.cu (the first ring kernel,
// Int4GemvVariant::kLegacy) and cuda_gemv_int4_lean.cu (the variants issue 22 measures against
// it). Weight layout and numerics: cuda_gemv_int4.cu's header comment.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_ring.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace sala::cuda::int4g {

constexpr int kChunkK = 32;           // k per 16-byte chunk of a packed row (4 words)
constexpr int kGroupK = 4 * kChunkK;  // k of the 4 chunks one mma covers: the group unit
constexpr int kPass = 8;              // epilogue columns per pass (finish<..., kPass>)
constexpr int kRed4Bytes = gemv::kWarps * gemv::kRows * (kPass + 1) * 4;  // 9,216

__device__ __forceinline__ void cp4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ float lds_f32(uint32_t a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
  return v;
}

// (a & b) | c in one instruction.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// A repacked word (nibble j: k 2j, nibble j + 4: k 2j + 1, each q + 8) as the four bf16 pairs
// p[j] = (q_2j, q_2j+1), exact: 11 instructions per word.
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t (&p)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t h = and_or(w >> (4 * j), 0x000f000fu, 0x43004300u);  // 128 + (q + 8)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(p[j]) : "r"(h), "r"(0x3f803f80u), "r"(0xc308c308u));
  }
}

// The same pairs biased by 136: p[j] = (136 + q_2j, 136 + q_2j+1), exact in bf16 (128..143):
// 7 instructions per word (the biased variants subtract 136 · Σ x per group instead).
__device__ __forceinline__ void dequant_word_biased(uint32_t w, uint32_t (&p)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) p[j] = and_or(w >> (4 * j), 0x000f000fu, 0x43004300u);
}
constexpr uint32_t kBias2 = 0x43084308u;  // bf16x2 (136, 136)

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 16-row half's chunk: the raw words of rows g / g + 8 as bf16 code pairs a[i][j] / b[i][j]
// (word i, pair j); BIASED: the pairs + 136 (dequant_word_biased).
template <bool BIASED = false>
__device__ __forceinline__ void dequant_chunk(const uint4& Wg, const uint4& W8, uint32_t (&a)[4][4],
                                              uint32_t (&b)[4][4]) {
  const uint32_t wg[4] = {Wg.x, Wg.y, Wg.z, Wg.w}, w8[4] = {W8.x, W8.y, W8.z, W8.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (BIASED) {
      dequant_word_biased(wg[i], a[i]);
      dequant_word_biased(w8[i], b[i]);
    } else {
      dequant_word(wg[i], a[i]);
      dequant_word(w8[i], b[i]);
    }
  }
}

// The chunk's MMAs into part[j] for the G n-tiles of X: per word i, the k16 of its pairs 0, 1,
// then of 2, 3 (every accumulator sees this order, whatever G and NT are).
template <int G>
__device__ __forceinline__ void chunk_mma(float (&part)[G][4], const uint32_t (&a)[4][4],
                                          const uint32_t (&b)[4][4], const uint4 (&X)[G][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const uint32_t xs[4] = {X[j][i].x, X[j][i].y, X[j][i].z, X[j][i].w};
      mma_bf16(part[j], a[i][0], b[i][0], a[i][1], b[i][1], xs[0], xs[1]);
      mma_bf16(part[j], a[i][2], b[i][2], a[i][3], b[i][3], xs[2], xs[3]);
    }
}

// 136 · Σ x over the chunk's k for the G n-tiles of X, in chunk_mma's order (A: every entry
// 136, so the 16 rows of the result are equal; c0, c1 = c2, c3).
template <int G>
__device__ __forceinline__ void bias_mma(float (&corr)[G][4], const uint4 (&X)[G][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < G; ++j) {
      mma_bf16(corr[j], kBias2, kBias2, kBias2, kBias2, X[j][i].x, X[j][i].y);
      mma_bf16(corr[j], kBias2, kBias2, kBias2, kBias2, X[j][i].z, X[j][i].w);
    }
}

// acc[nt0 + j] += part[j] · scale of its weight row (c0, c1: row g; c2, c3: row g + 8).
template <int G, int NT>
__device__ __forceinline__ void add_scaled(float (&acc)[NT][4], int nt0, const float (&part)[G][4],
                                           const float (&sc)[2]) {
#pragma unroll
  for (int j = 0; j < G; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt0 + j][i] = fmaf(part[j][i], sc[i / 2], acc[nt0 + j][i]);
}

struct Unscaled {  // the scales are applied per group, before the epilogue
  __device__ float operator()(float v, int) const { return v; }
};

}  // namespace sala::cuda::int4g

namespace sala::cuda {
// cuda_gemv_int4_lean.cu: its kernels' attributes (once, outside capture) and launch. CTAS = 2:
// the two-CTAs-per-SM ring for M <= 16 (Int4GemvVariant's comment).
void gemv_int4_lean_init();
void launch_gemv_int4_lean(Int4GemvVariant v, const bf16* x, int64_t ldx, const uint32_t* w,
                           const float* w_scales, int64_t N, int K, int group, int M,
                           const GemvOut& o, int sms, cudaStream_t st);
}  // namespace sala::cuda
