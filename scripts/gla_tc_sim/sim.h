// Shim of the CUDA device environment for scripts/gla_tc_sim (see run.sh).
// Host simulation of the tc kernel: one std::thread per CUDA thread of a block, std::barrier
// for __syncthreads, mma.sync m16n8k16 and ldmatrix emulated per warp from the PTX fragment
// layouts, cp.async as plain copies.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#undef __global__
#define __global__
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __device__
#define __device__
#undef __shared__
#define __shared__ static
#undef __align__
#define __align__(n)
#include "backend/gla.h"
namespace sala::cuda {
using bf16 = __nv_bfloat16;
inline constexpr int kGlaDecayStride = 65;
struct DevSeq { int32_t token_begin, num_tokens, state_slot, page_begin, num_pages, sparse, split_row, state_dst_slot; long long past_len; };
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 gridDim;
inline std::barrier<>* g_block_bar;
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline int min(int a, int b) { return a < b ? a : b; }
inline bf16 f2b(float x) { return __float2bfloat16_rn(x); }
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
// cp.async runs synchronously here: a copy (or zeros) at once, commit / wait do nothing.
inline void cp_async16(void* smem, const void* gmem, int src_bytes) {
  if (src_bytes == 16) std::memcpy(smem, gmem, 16); else std::memset(smem, 0, 16);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
inline uint32_t pack_raw(bf16 lo, bf16 hi) {
  uint16_t a, b; std::memcpy(&a, &lo, 2); std::memcpy(&b, &hi, 2);
  return uint32_t(a) | (uint32_t(b) << 16);
}
inline uint32_t pack_bf16(float lo, float hi) { return pack_raw(f2b(lo), f2b(hi)); }
inline float lo16(uint32_t u) { uint32_t x = (u & 0xffffu) << 16; float f; std::memcpy(&f, &x, 4); return f; }
inline float hi16(uint32_t u) { uint32_t x = u & 0xffff0000u; float f; std::memcpy(&f, &x, 4); return f; }
struct WarpStage { uint32_t a[32][4]; uint32_t b[32][2]; const bf16* addr[32]; std::barrier<>* bar; long calls = 0, ldsm = 0; };
inline WarpStage g_warp[16];
// PTX m16n8k16 .row.col bf16: groupID g = lane/4, t = lane%4.
// A: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
// B: b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g); C: c0,c1 (g, 2t..2t+1), c2,c3 (g+8, ..)
inline void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  WarpStage& S = g_warp[w];
  for (int i = 0; i < 4; ++i) S.a[lane][i] = a[i];
  S.b[lane][0] = b0, S.b[lane][1] = b1;
  S.bar->arrive_and_wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const int ar[4] = {g, g + 8, g, g + 8}, ac[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int i = 0; i < 4; ++i) A[ar[i]][ac[i]] = lo16(S.a[l][i]), A[ar[i]][ac[i] + 1] = hi16(S.a[l][i]);
    B[2 * t][g] = lo16(S.b[l][0]), B[2 * t + 1][g] = hi16(S.b[l][0]);
    B[2 * t + 8][g] = lo16(S.b[l][1]), B[2 * t + 9][g] = hi16(S.b[l][1]);
  }
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int r = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    double s = 0;
    for (int k = 0; k < 16; ++k) s += double(A[r][k]) * B[k][col];
    c[e] = float(double(c[e]) + s);
  }
  if (lane == 0) ++S.calls;
  S.bar->arrive_and_wait();
}
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the address of row l % 8 of
// matrix l / 8 (8 contiguous b16, 16-byte aligned). Lane l receives in r[i] two elements of
// matrix i (low half first): (row l/4, cols 2(l%4), 2(l%4)+1), or transposed (rows 2(l%4),
// 2(l%4)+1, col l/4).
inline void ldmatrix_sim(uint32_t* r, const bf16* row_addr, bool trans) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  WarpStage& S = g_warp[w];
  if ((reinterpret_cast<uintptr_t>(row_addr) & 15) != 0) { std::fprintf(stderr, "ldmatrix: unaligned\n"); std::abort(); }
  S.addr[lane] = row_addr;
  S.bar->arrive_and_wait();
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i)
    r[i] = trans ? pack_raw(S.addr[8 * i + 2 * t][g], S.addr[8 * i + 2 * t + 1][g])
                 : pack_raw(S.addr[8 * i + g][2 * t], S.addr[8 * i + g][2 * t + 1]);
  if (lane == 0) ++S.ldsm;
  S.bar->arrive_and_wait();
}
inline void ldmatrix_x4(uint32_t* r, const bf16* row_addr) { ldmatrix_sim(r, row_addr, false); }
inline void ldmatrix_x4_trans(uint32_t* r, const bf16* row_addr) { ldmatrix_sim(r, row_addr, true); }
}  // namespace sala::cuda
