// The int4 GEMVs' arithmetic on one chunk group (128 k of a 16-row half: 4 chunks of 16 B,
// lane (g, t) taking chunk t of rows g and g + 8), the ring kernel's (cuda_gemv_int4.cu).
// Layout and numerics: cuda_gemv_int4.cu's header.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_gemv_ring.cuh"

namespace sala::cuda::gemv {

// (a & b) | c in one instruction.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// A repacked word (nibble j: k 2j, nibble j + 4: k 2j + 1, each q + 8) as the four bf16 pairs
// p[j] = (q_2j, q_2j+1), exact.
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t (&p)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t h = and_or(w >> (4 * j), 0x000f000fu, 0x43004300u);  // 128 + (q + 8)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(p[j]) : "r"(h), "r"(0x3f803f80u), "r"(0xc308c308u));
  }
}

// x of chunk c (4 uint4 = 32 k) of n-tiles nt0 .. nt0 + G - 1 when ok, undefined registers
// otherwise (a chunk past the warp's K slice: the chunk loop stops before using it).
template <int G>
__device__ __forceinline__ void load_x(uint4 (&X)[G][4], const XLane& xl, int nt0, int c,
                                       bool ok) {
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const uint4* r = xl.row(nt0 + j) + 4 * c;
#pragma unroll
    for (int i = 0; i < 4; ++i) X[j][i] = ldg_if(r + i, ok);
  }
}

// One 16-row half's chunk: the raw words of rows g / g + 8 as bf16 code pairs a[i][j] / b[i][j]
// (word i, pair j).
__device__ __forceinline__ void dequant_chunk(const uint4& Wg, const uint4& W8, uint32_t (&a)[4][4],
                                              uint32_t (&b)[4][4]) {
  const uint32_t wg[4] = {Wg.x, Wg.y, Wg.z, Wg.w}, w8[4] = {W8.x, W8.y, W8.z, W8.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    dequant_word(wg[i], a[i]);
    dequant_word(w8[i], b[i]);
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

// acc[nt0 + j] += part[j] · scale of its weight row (c0, c1: row g; c2, c3: row g + 8).
template <int G, int NT>
__device__ __forceinline__ void add_scaled(float (&acc)[NT][4], int nt0, const float (&part)[G][4],
                                           const float (&sc)[2]) {
#pragma unroll
  for (int j = 0; j < G; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt0 + j][i] = fmaf(part[j][i], sc[i / 2], acc[nt0 + j][i]);
}

}  // namespace sala::cuda::gemv
