// What the skinny Hopper GEMMs share (cuda_skinny_sm90.cu: bf16 and FP8 weights;
// cuda_skinny_int4_sm90.cu: W4A16): the tile geometry (two consumer warpgroups of 64 weight
// rows, the x rows as wgmma's 64 columns), the launch arguments, the accumulator layout, the
// K chunks and splits, and the epilogue of a unit (store, silu_pair, or the split launches'
// ordered sum of chunk sums). cuda_skinny_sm90.cu's header comment describes the design.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_ring.cuh"  // store_gemv_out, silu_pair_value
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"  // pdl_wait
#include "backend/cuda/cuda_tma_sm90.cuh"

namespace sala::cuda::skinny {

constexpr int kBM = 128;  // weight rows per tile: two consumer warpgroups of 64
constexpr int kNX = 64;   // x rows per MMA (rows past M: whatever the stage holds)
// K chunks summed apart and added in order (at most; fewer where K holds fewer whole stages).
// 4 rather than 8: a split launch stores and re-reads every chunk sum, and 8 cost 4096 x 4096
// at 40 rows 21.3 µs instead of 14.8 with one sum per split (H200, session 20).
constexpr int kMaxChunks = 4;
constexpr int kThreads = 384;         // producer warpgroup + two consumer warpgroups
constexpr int kXchg = 64 * kNX * 4;  // silu_pair: the up sums [64 rows][64 x rows], fp32
// ws: the per-tile counters first (at fixed offsets whatever the shape, so that partial sums
// of another shape never land on them), then the partials.
constexpr int64_t counter_bytes(int64_t tiles) { return (std::max<int64_t>(4096, tiles * 4) + 255) / 256 * 256; }
// Split launches keep every chunk sum of every tile: tiles x chunks <= kMaxChunkTilesPerSm x
// SMs bounds the workspace (8.6 MB on 132 SMs).
constexpr int kMaxChunkTilesPerSm = 2;

struct SkinnyArgs {
  GemvOut o;         // outputs as the GEMV's: parts, fp32 logits, or silu_pair
  float* partial;    // [tiles][n_chunks][kNX][kBM]
  int* counters;     // [tiles]
  int N, M, tiles, splits, k_per_split, n_chunks, k_per_chunk;
  uint32_t x_bytes;  // per stage: the x box's rows (M rounded up to 8) x 128 bytes
  const float* sx;   // FP8: per-row activation scales [M] (the quantize kernel's)
  const float* sw;   // FP8: per-channel weight scales [N]
};

// A finished sum of weight row n and x row m: bf16 as is; FP8 (sum · sx[m]) · sw[n], the CPU's
// order, unfused (the FP8 GEMV's Scale).
template <bool kFp8>
__device__ __forceinline__ float scaled(const SkinnyArgs& a, float v, int m, int64_t n) {
  if constexpr (kFp8) return __fmul_rn(__fmul_rn(v, a.sx[m]), a.sw[n]);
  return v;
}

// f(i, r, m) for this thread's accumulators: d[i] holds weight row r of its warpgroup's 64 and
// x row m (wgmma's accumulator layout: d[4j + 2h + e] is row 16 warp + lane / 4 + 8 h,
// column 8 j + 2 (lane % 4) + e).
template <class F>
__device__ __forceinline__ void for_each_acc(int warp, int lane, F&& f) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        f(4 * j + 2 * h + e, warp * 16 + lane / 4 + 8 * h, 8 * j + 2 * (lane % 4) + e);
}

// The first weight row of consumer warpgroup c's 64 rows in tile t: 128 t + 64 c, or with
// silu_pair the gate rows 64 t (c = 0) and the up rows N / 2 + 64 t (c = 1).
__device__ __forceinline__ int64_t half_row0(const SkinnyArgs& a, int t, int c) {
  return a.o.silu_pair ? int64_t(c) * (a.N / 2) + 64 * int64_t(t) : 128 * int64_t(t) + 64 * c;
}


// Split launches: chunk ch of the tile's sums (this warpgroup's 64 rows) to the workspace.
__device__ __forceinline__ void store_partial(const SkinnyArgs& a, int tile, int ch, int c,
                                              int warp, int lane, const float (&d)[32]) {
  float* part = a.partial + (size_t(tile) * a.n_chunks + ch) * (kNX * kBM);
  for_each_acc(warp, lane, [&](int i, int r, int m) {
    if (m < a.M) part[m * kBM + c * 64 + r] = d[i];
  });
}

// The unit's outputs once its chunks are summed: total (the chunks added in order) stored or
// combined through silu_pair; split launches (a.splits > 1) instead count the tile's arrivals
// and the last CTA adds the tile's chunk sums in order. Called by both consumer warpgroups
// (ct 0..255: named barrier 1); xchg, last_flag: this CTA's shared memory.
template <bool kFp8>
__device__ __forceinline__ void finish_unit(const SkinnyArgs& a, int tile, int c, int warp,
                                            int lane, int ct, const float (&total)[32],
                                            float* xchg, int* last_flag) {
  if (a.splits == 1) {
    const int64_t r0 = half_row0(a, tile, c);
    if (a.o.silu_pair) {  // the up sums go to the gate's warpgroup through shared memory
      if (c == 1)
        for_each_acc(warp, lane, [&](int i, int r, int m) {
          // (rows past M or N hold no scale: any in-range one, the value is never stored)
          xchg[r * kNX + m] =
              scaled<kFp8>(a, total[i], m < a.M ? m : 0, r0 + r < a.N ? r0 + r : r0);
        });
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      if (c == 0)
        for_each_acc(warp, lane, [&](int i, int r, int m) {
          if (m < a.M && r0 + r < a.N / 2)
            static_cast<bf16*>(a.o.y[0])[m * a.o.cols[0] + r0 + r] =
                gemv::silu_pair_value(rb(scaled<kFp8>(a, total[i], m, r0 + r)), xchg[r * kNX + m]);
        });
      asm volatile("bar.sync 1, 256;\n" ::: "memory");  // xchg free for the next unit
      return;
    }
    for_each_acc(warp, lane, [&](int i, int r, int m) {
      if (m < a.M && r0 + r < a.N)
        gemv::store_gemv_out(a.o, m, r0 + r, scaled<kFp8>(a, total[i], m, r0 + r));
    });
    return;
  }
  __threadfence();
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  if (ct == 0) *last_flag = atomicAdd(&a.counters[tile], 1) == a.splits - 1;
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  if (*last_flag) {
    // Sum the chunks in order, 4 outputs per thread and pass (float4 loads from L2).
    __threadfence();
    const float4* p0 = reinterpret_cast<const float4*>(a.partial + size_t(tile) * a.n_chunks * (kNX * kBM));
    auto chunk_sum = [&](int i) {  // float4 i of the tile's [M][128] sums
      float4 q[kMaxChunks];  // every chunk's load in flight before the first add
#pragma unroll
      for (int ch = 0; ch < kMaxChunks; ++ch)
        if (ch < a.n_chunks) q[ch] = __ldcg(p0 + size_t(ch) * (kNX * kBM / 4) + i);
      float4 v = q[0];
#pragma unroll
      for (int ch = 1; ch < kMaxChunks; ++ch) {
        if (ch >= a.n_chunks) break;
        v.x += q[ch].x;
        v.y += q[ch].y;
        v.z += q[ch].z;
        v.w += q[ch].w;
      }
      return v;
    };
    if (a.o.silu_pair) {
      for (int i = ct; i < a.M * 16; i += 256) {  // 4 gate rows and their up rows
        const int m = i / 16, lr = (i % 16) * 4;
        const float4 g = chunk_sum(m * 32 + i % 16), u = chunk_sum(m * 32 + 16 + i % 16);
        const float gf[4] = {g.x, g.y, g.z, g.w}, uf[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t n = 64 * int64_t(tile) + lr + e;
          if (n < a.N / 2)
            static_cast<bf16*>(a.o.y[0])[m * a.o.cols[0] + n] = gemv::silu_pair_value(
                rb(scaled<kFp8>(a, gf[e], m, n)), scaled<kFp8>(a, uf[e], m, a.N / 2 + n));
        }
      }
    } else {
      for (int i = ct; i < a.M * (kBM / 4); i += 256) {
        const float4 v = chunk_sum(i);
        const int m = i / (kBM / 4), lr = (i % (kBM / 4)) * 4;
        const int64_t n0 = half_row0(a, tile, lr / 64) + lr % 64;
        const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (n0 + e < a.N) gemv::store_gemv_out(a.o, m, n0 + e, scaled<kFp8>(a, f[e], m, n0 + e));
      }
    }
    if (ct == 0) a.counters[tile] = 0;
  }
  asm volatile("bar.sync 1, 256;\n" ::: "memory");  // last_flag reused by the next unit
}

#ifdef SALA_SM90A_DEVICE
// The ring's barriers (thread 0, then the whole CTA waits): full[s] completes on the producer's
// arrival and its TMA bytes, empty[s] on one arrival per consumer warp (lane 0 of 8).
template <int S>
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
}

// The producer thread (warp 0 of warpgroup 0): per stage of every unit, wait for the slot,
// expect its bytes (W's w_bytes + x's a.x_bytes), load_w(stage, kc, tile) issues the weight
// boxes and x's box [a.x_bytes / 128 rows, 128 bytes] at k = kc goes to sx + stage * x_stage.
// The first S stages' weights go out before waiting for the previous kernel; their x loads (x
// may be its output) after.
template <int S, class LoadW>
__device__ __forceinline__ void produce(const SkinnyArgs& a, int units, int nk, int stage_k,
                                        uint32_t w_bytes, const CUtensorMap* tm_x, uint8_t* sx,
                                        int x_stage, uint64_t* full, uint64_t* empty,
                                        LoadW&& load_w) {
  int stage = 0, it = 0, deferred[S];
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int tile = u / a.splits, split = u % a.splits;
    for (int kb = 0; kb < nk; ++kb) {
      const int kc = split * a.k_per_split + kb * stage_k;
      mbar_wait(&empty[stage], phase ^ 1);
      mbar_expect_tx(&full[stage], w_bytes + a.x_bytes);
      load_w(stage, kc, tile);
      if (it < S) {
        deferred[it] = kc;
      } else {
        tma_load_2d(sx + size_t(stage) * x_stage, tm_x, kc, 0, &full[stage]);
      }
      if (++it == S) {
        pdl_wait();
        for (int s = 0; s < S; ++s)
          tma_load_2d(sx + size_t(s) * x_stage, tm_x, deferred[s], 0, &full[s]);
      }
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
  if (it < S) {
    pdl_wait();
    for (int s = 0; s < it; ++s)
      tma_load_2d(sx + size_t(s) * x_stage, tm_x, deferred[s], 0, &full[s]);
  }
}
#endif

// ---- host ----
inline int num_sms() {
  static const int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v;
  }();
  return n;
}

// Chunks of K: kMaxChunks, or the most that K holds in whole stages (bf16 64 k, FP8 128 k;
// K = 128 in bf16: 2).
inline int chunks_of(int64_t K, int stage_k) {
  int n = kMaxChunks;
  while (n > 1 && K % (int64_t(n) * stage_k) != 0) n /= 2;
  return n;
}


// The time of a split s, modelled from the H200's measurements (session 20, skinny_ab): the
// weights stream at ~3.6 TB/s when every SM pulls, and one SM pulls at most ~45 GB/s, so a
// launch takes max(bytes / 3.6 TB/s, busiest SM's bytes / 45 GB/s), plus ~1.5 µs for the
// partial sums' round trip when split. Measured per shape (bf16): 4096 x 4096 best at 4 splits
// (14.8 µs; 1: 26.8, 2: 18.6), 12288 x 4096 at 1 (33.3; 4: 36.2), 4096 x 16384 at 4 (42.3;
// 1: 88.8). row_bytes: one weight row's bytes; chunks: chunks_of K (splits divide them).
inline int splits_model(int64_t N, double row_bytes, int64_t chunks) {
  const int64_t tiles = (N + kBM - 1) / kBM, sms = num_sms();
  int best = 1;
  double best_us = 1e30;
  for (int s = 1; s <= chunks; s *= 2) {
    if (s > 1 && tiles * chunks > kMaxChunkTilesPerSm * sms) break;
    const double unit_bytes = double(kBM) * row_bytes / s;
    const double per_sm = double((tiles * s + sms - 1) / sms) * unit_bytes;
    const double us = std::max(double(tiles) * kBM * row_bytes / 3.6e6, per_sm / 45e3) +
                      (s > 1 ? 1.5 : 0);
    if (us < best_us * 0.97) {  // a split must buy 3 %
      best_us = us;
      best = s;
    }
  }
  return best;
}

}  // namespace sala::cuda::skinny
