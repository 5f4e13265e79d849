// What the two InfLLM-v2 stage-2 kernels share (cuda_infllm_attn.cu: mma.sync, sm_80+;
// cuda_infllm_attn_sm90.cu: wgmma, Hopper): the 64-key tile, the SFU exp2, a row's key mask
// in a tile, and the union of a row tile's selected key tiles.
#pragma once
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma.cuh"

namespace sala::cuda::stage2 {

constexpr int kKT = 64;  // keys per tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x by the SFU (ex2.approx.ftz: rel. error ≈ 2^-22, −inf → 0), as flash attention does;
// exp2f adds range handling around it.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The maxima (sums) of a and b over the 4 lanes of a quad, in every lane of it: an mma C
// fragment row's values are spread over a quad.
__device__ __forceinline__ void quad_max2(float& a, float& b) {
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
  b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, 1));
  b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, 2));
}
__device__ __forceinline__ void quad_sum2(float& a, float& b) {
  a += __shfl_xor_sync(0xffffffffu, a, 1);
  a += __shfl_xor_sync(0xffffffffu, a, 2);
  b += __shfl_xor_sync(0xffffffffu, b, 1);
  b += __shfl_xor_sync(0xffffffffu, b, 2);
}

// The keys of 64-key tile kt that a row attends: bit j set iff key kt·64 + j is in a block
// of the row's selection (bits) and at or before the row's position t. 32-bit arithmetic
// only, and a shift for power-of-two block sizes (bs_log2 >= 0; else -1): this runs per warp
// per tile of the union, and a division by bs was a tenth of the consumers' instructions.
__device__ __forceinline__ uint64_t tile_keys(const uint32_t* bits, int kt, int bs, int bs_log2,
                                              int t) {
  const int k0 = kt * kKT;
  uint64_t m = 0;
  if (bs >= kKT) {
    const int b = bs_log2 >= 0 ? k0 >> bs_log2 : k0 / bs;
    m = ((bits[b >> 5] >> (b & 31)) & 1u) ? ~0ull : 0ull;
  } else {
    const uint64_t block_mask = bs == 64 ? ~0ull : ((1ull << bs) - 1);
    for (int i = 0, b = k0 / bs; i < kKT / bs; ++i, ++b)
      if ((bits[b >> 5] >> (b & 31)) & 1u) m |= block_mask << (i * bs);
  }
  const int last = t - k0;  // keys j <= last
  if (last < kKT - 1) m &= last < 0 ? 0ull : ((2ull << last) - 1);
  return m;
}

// One row of a row tile, as the warp that fills its bitmap sees it.
struct UnionRow {
  int slot;     // its bitmap: rbits + slot * nb_words; -1: this warp fills none
  bool dense;   // every block up to its own (SPEC §9.1), else its selection
  int64_t row;  // the step row (its selection: sel[(row * kvh + g) * total_topk ..])
  long long t;  // its position
};

// The union of a row tile's selected 64-key tiles (every thread of the block calls it; it
// syncs the block). Each warp with a row sets that row's selected blocks in its bitmap
// (rbits, nb_words words each) and its 64-key tiles (keys ≤ t) in ubits. The union's tiles
// go to list in ascending order; returns their count. L: the sequence's length.
template <int kThreads>
__device__ int tile_union(uint32_t* rbits, int nb_words, int rows, uint32_t* ubits,
                          int32_t* list, long long L, const CacheGeom& G, int g,
                          const int32_t* sel, const int32_t* sel_cnt, int total_topk,
                          const UnionRow& me) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int n_list;
  const int tid = threadIdx.x, lane = tid % 32;
  const int nkt = int((L + kKT - 1) / kKT), words = (nkt + 31) / 32;
  const int nbw = int(((L + G.bs - 1) / G.bs + 31) / 32);
  for (int i = tid; i < rows * nb_words; i += kThreads)
    if (i % nb_words < nbw) rbits[i] = 0;
  for (int i = tid; i < words; i += kThreads) ubits[i] = 0;
  __syncthreads();
  if (me.slot >= 0) {
    uint32_t* mybits = rbits + me.slot * nb_words;
    auto set_tile = [&](long long kt) { atomicOr(&ubits[kt >> 5], 1u << (kt & 31)); };
    const long long t = me.t;
    if (me.dense) {
      for (long long b = lane; b <= t / G.bs; b += 32) atomicOr(&mybits[b >> 5], 1u << (b & 31));
      for (long long kt = lane; kt <= t / kKT; kt += 32) set_tile(kt);
    } else {
      const int cnt = sel_cnt[me.row * G.kvh + g];
      const int32_t* lst = sel + (me.row * G.kvh + g) * total_topk;
      for (int i = lane; i < cnt; i += 32) {
        const long long b = lst[i];
        atomicOr(&mybits[b >> 5], 1u << (b & 31));
        const long long kt1 = min((b * G.bs + G.bs - 1) / kKT, t / kKT);
        for (long long kt = b * G.bs / kKT; kt <= kt1; ++kt) set_tile(kt);
      }
    }
  }
  __syncthreads();
  {
    const int per = (words + kThreads - 1) / kThreads;
    const int w0 = min(words, tid * per), w1 = min(words, w0 + per);
    int c = 0;
    for (int w = w0; w < w1; ++w) c += __popc(ubits[w]);
    int pos, total;
    Scan(scan_tmp).ExclusiveSum(c, pos, total);
    for (int w = w0; w < w1; ++w)
      for (uint32_t m = ubits[w]; m; m &= m - 1) list[pos++] = w * 32 + __ffs(m) - 1;
    if (tid == 0) n_list = total;
  }
  __syncthreads();
  return n_list;
}

}  // namespace sala::cuda::stage2
