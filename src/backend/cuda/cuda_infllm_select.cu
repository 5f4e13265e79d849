// InfLLM-v2 block selection on the tensor cores (SPEC §9.4–9.5; CPU twin: CpuBackend's
// sparse path with backend/cpu/infllm_rules.h). Three kernels per chunk of row tiles:
//
//  1. select_lse_kernel: per (row, query head) the level-2 normaliser m = max s2,
//     l = Σ exp(s2 − m) over the visible level-2 entries, in log2 units. A block is one
//     tile of ≤ 8 rows (tokens) of one sequence × one KV head; warp w owns row w's 16 query
//     heads as the 16 rows of mma m16n8k16, so the entries loaded into shared memory are
//     shared by 8 tokens. grid.z splits the entries of rows of split calls (decode and
//     verify rows, DevSeq::split_row: one row per tile); their partial (m, l) go to SelectWork::ml and are merged by the
//     next kernel in part order.
//  2. select_score_kernel: per (row, KV head) and level-1 entry j the score
//     bf16(Σ_h exp(s1_h[j] − m_h) / l_h) (0 for invisible entries, NaN → 0), then the block
//     max-pool of SPEC §9.5 over each 64-entry tile. A block's pool window (entries
//     b·r − 1 .. b·r + r − 1, r = block / stride) reaches one entry into the previous tile
//     when b·r is a multiple of 64: that entry's score is kept in SelectWork::edge and
//     merged by the top-k kernel, so the tiles (and grid.z splits) are independent.
//  3. select_topk_kernel: forced blocks (+inf), top-k by (score desc, index asc) as a
//     16-bit radix select over the bf16 scores, blocks after the query's dropped, the rest
//     written in ascending order to sel / sel_cnt.
// Exponentials are fp32 exp2 (the CPU computes exp in double); a score then rounds to bf16,
// so rare last-bit differences can swap near-tied blocks (tests/ops counts the agreement).
// FP8 KV caches: the compressed keys are read as their code values (exact bf16) and the
// layer's K scale is part of SelectParams::tau (launch_infllm_select's caller).
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace sala::cuda {
namespace {

constexpr int kW = kSparseTileRows;  // rows (warps) per tile
constexpr int kThreads = kW * 32;
constexpr int kET = kEntryTile;      // entries per shared-memory tile
constexpr float kLog2e = 1.4426950408889634f;

// Per block: the tile's sequence and the position / counts of this warp's row.
struct TileRow {
  DevSeq s;
  const int32_t* pages;
  int64_t row;       // this warp's row (the tile's first row for idle warps)
  long long t, L;    // row position, sequence length after the step
  bool active, first;
};

__device__ __forceinline__ bool tile_row(const StepRows& R, int2 tile, int warp, TileRow& tr) {
  tr.s = R.seqs[R.row_seq[tile.x]];
  if (!tr.s.sparse) return false;
  tr.pages = R.page_table + tr.s.page_begin;
  tr.active = warp < tile.y;
  tr.row = tile.x + (tr.active ? warp : 0);
  tr.t = tr.s.past_len + (tr.row - tr.s.token_begin);
  tr.L = tr.s.past_len + tr.s.num_tokens;
  tr.first = tr.s.past_len == 0;
  return true;
}

// Entries [j0, j0 + kET) of a compressed cache (KV head g) into smem rows of D + 8 halves;
// entries at or past jend are zeros. bf16 caches by cp.async; FP8 caches (KF) by plain loads
// of 8 codes converted in registers to their exact bf16 values (unscaled: the K scale is in
// SelectParams::tau), stored before the caller's __syncthreads.
template <int D, int KF>
__device__ __forceinline__ void load_entries(bf16* buf, const KvElem<KF>* cache, const CacheGeom& G,
                                             const int32_t* pages, long long j0, long long jend,
                                             int stride, int g) {
  constexpr int LD = D + 8, CH = D / 8;
  if constexpr (KF == kKvAct) {
    for (int e = threadIdx.x; e < kET * CH; e += kThreads) {
      const int j = e / CH, c = e % CH;
      const bool ok = j0 + j < jend;
      const bf16* src = ok ? cache + entry_off(G, pages, j0 + j, stride) + int64_t(g) * D + c * 8 : cache;
      cp_async16(buf + j * LD + c * 8, src, ok ? 16 : 0);
    }
  } else {
    // Every load of the thread issued before the first conversion (no cp.async for them).
    constexpr int kIt = (kET * CH + kThreads - 1) / kThreads;
    uint2 cw[kIt];
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int e = threadIdx.x + i * kThreads, j = e / CH, c = e % CH;
      cw[i] = e < kET * CH && j0 + j < jend
                  ? *reinterpret_cast<const uint2*>(cache + entry_off(G, pages, j0 + j, stride) +
                                                    int64_t(g) * D + c * 8)
                  : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int e = threadIdx.x + i * kThreads, j = e / CH, c = e % CH;
      if (e < kET * CH) *reinterpret_cast<uint4*>(buf + j * LD + c * 8) = kv_codes8_bf16<KF>(cw[i]);
    }
  }
}

// A fragments of the 16 query heads of KV head g for one row: q[row, (16 g + i) D + k].
template <int D>
__device__ __forceinline__ void load_q_frags(uint32_t (&qa)[D / 16][4], const bf16* q, int64_t row,
                                             int nh, int g, int lane) {
  const int qr = lane / 4, qc = (lane % 4) * 2;
  const bf16* base = q + row * int64_t(nh) * D + int64_t(g) * 16 * D;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int k0 = ks * 16 + qc;
    qa[ks][0] = *reinterpret_cast<const uint32_t*>(base + qr * D + k0);
    qa[ks][1] = *reinterpret_cast<const uint32_t*>(base + (qr + 8) * D + k0);
    qa[ks][2] = *reinterpret_cast<const uint32_t*>(base + qr * D + k0 + 8);
    qa[ks][3] = *reinterpret_cast<const uint32_t*>(base + (qr + 8) * D + k0 + 8);
  }
}

// s[n] = Q (16 heads) · entries[n·8 .. n·8+7]ᵀ of a smem tile (64 entries).
template <int D>
__device__ __forceinline__ void qk_tile(float (&s)[8][4], const uint32_t (&qa)[D / 16][4],
                                        const bf16* buf, int lane) {
  constexpr int LD = D + 8;
  const int qr = lane / 4, qc = (lane % 4) * 2;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const bf16* kp = buf + (n * 8 + qr) * LD + ks * 16 + qc;
      mma16816(s[n], qa[ks], *reinterpret_cast<const uint32_t*>(kp),
               *reinterpret_cast<const uint32_t*>(kp + 8));
    }
  }
}

// Merge of two (max, sum) pairs of one softmax row, log2 units.
__device__ __forceinline__ void merge_ml(float& m, float& l, float m2, float l2) {
  const float M = fmaxf(m, m2);
  if (M == -INFINITY) return;
  l = l * exp2f(m - M) + l2 * exp2f(m2 - M);
  m = M;
}

//                                  grid: (tiles, kvh, lse_splits), block: kThreads
template <int D, int KF>
__global__ void __launch_bounds__(kThreads) select_lse_kernel(
    const bf16* __restrict__ q, StepRows R, const int2* __restrict__ tiles, int tile_begin,
    const KvElem<KF>* __restrict__ c2, SelectParams P, float2* __restrict__ ml) {
  pdl_begin();  // launch_pdl: before any read or write
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* buf = reinterpret_cast<bf16*>(smem_raw);  // [2][kET][D + 8]
  constexpr int kBuf = kET * (D + 8);
  const int2 tile = tiles[tile_begin + blockIdx.x];
  const int g = blockIdx.y, z = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, qc = (lane % 4) * 2;
  TileRow tr;
  if (!tile_row(R, tile, warp, tr)) return;
  const int S = tr.s.split_row >= 0 ? int(gridDim.z) : 1;  // parts of this row
  if (z >= S) return;
  const CacheGeom& G = P.g;
  const long long n2 = num_entries(tr.L, G.k2, G.s2);
  const long long cnt = visible_count(tr.t, n2, tr.s.num_tokens, G.k2, G.s2, tr.first);
  const long long t_last = tr.s.past_len + (tile.x + tile.y - 1 - tr.s.token_begin);
  const long long cmax = visible_count(t_last, n2, tr.s.num_tokens, G.k2, G.s2, tr.first);
  const int ntile = int((cmax + kET - 1) / kET);
  const int per = (ntile + S - 1) / S, i0 = z * per, i1 = min(ntile, i0 + per);
  uint32_t qa[D / 16][4];
  if (tr.active) load_q_frags<D>(qa, q, tr.row, P.nh, g, lane);
  const float sc = P.tau * kLog2e;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows qr, qr + 8 (lane-local)
  if (i0 < i1) load_entries<D, KF>(buf, c2, G, tr.pages, 1LL * i0 * kET, cmax, G.s2, g);
  cp_async_commit();
  for (int i = i0; i < i1; ++i) {
    if (i + 1 < i1)
      load_entries<D, KF>(buf + ((i + 1 - i0) & 1) * kBuf, c2, G, tr.pages, 1LL * (i + 1) * kET, cmax, G.s2, g);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (tr.active && 1LL * i * kET < cnt) {
      float s[8][4];
      qk_tile<D>(s, qa, buf + ((i - i0) & 1) * kBuf, lane);
      float tm[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const long long j = 1LL * i * kET + n * 8 + qc + (e & 1);
          s[n][e] = j < cnt ? s[n][e] * sc : -INFINITY;
          tm[e >> 1] = fmaxf(tm[e >> 1], s[n][e]);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float M = fmaxf(m[h], tm[h]);
        if (M == -INFINITY) continue;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < 8; ++n) sum += exp2f(s[n][2 * h] - M) + exp2f(s[n][2 * h + 1] - M);
        l[h] = l[h] * exp2f(m[h] - M) + sum;
        m[h] = M;
      }
    }
    __syncthreads();  // the buffer is refilled two iterations on
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[h], o), l2 = __shfl_xor_sync(0xffffffffu, l[h], o);
      merge_ml(m[h], l[h], m2, l2);
    }
  if (tr.active && lane % 4 == 0) {
    const int64_t lrow = int64_t(blockIdx.x) * kW + warp;
    for (int h = 0; h < 2; ++h) {
      const int head = g * 16 + lane / 4 + 8 * h;
      ml[(lrow * P.nh + head) * P.lse_splits + z] = make_float2(m[h], l[h]);
    }
  }
}

//                                grid: (tiles, kvh, score_splits), block: kThreads
template <int D, int KF>
__global__ void __launch_bounds__(kThreads) select_score_kernel(
    const bf16* __restrict__ q, StepRows R, const int2* __restrict__ tiles, int tile_begin,
    const KvElem<KF>* __restrict__ c1, SelectParams P, const float2* __restrict__ ml,
    bf16* __restrict__ bscore, float* __restrict__ edge) {
  pdl_begin();  // launch_pdl: before any read or write
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kBuf = kET * (D + 8);
  bf16* buf = reinterpret_cast<bf16*>(smem_raw);                  // [2][kET][D + 8]
  float* esc = reinterpret_cast<float*>(buf + 2 * kBuf);          // [kW][kET] entry scores
  const int2 tile = tiles[tile_begin + blockIdx.x];
  const int g = blockIdx.y, z = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, qc = (lane % 4) * 2;
  TileRow tr;
  if (!tile_row(R, tile, warp, tr)) return;
  const bool one = tr.s.split_row >= 0;  // a row of a split call: one row per tile
  const int S = one ? int(gridDim.z) : 1;  // parts of the entries
  if (z >= S) return;
  const CacheGeom& G = P.g;
  const long long n1 = num_entries(tr.L, G.k1, G.s1), n2 = num_entries(tr.L, G.k2, G.s2);
  const long long cnt1 = visible_count(tr.t, n1, tr.s.num_tokens, G.k1, G.s1, tr.first);
  const bool has2 = visible_count(tr.t, n2, tr.s.num_tokens, G.k2, G.s2, tr.first) > 0;
  const long long t_last = tr.s.past_len + (tile.x + tile.y - 1 - tr.s.token_begin);
  const long long cmax = visible_count(t_last, n1, tr.s.num_tokens, G.k1, G.s1, tr.first);
  const int64_t lrow = int64_t(blockIdx.x) * kW + warp;
  // The row's normalisers: log2 l + m per head (rows qr and qr + 8 of the fragments).
  // The 4 lanes of a head (lane % 4) each merge every 4th part, 8 loads issued before any
  // merge, then combine by shuffles: a decode row's 32 parts are independent L2 loads, not a
  // chain of 32 load-then-merge steps (warp-uniform: tr.active and has2 are the row's).
  float lnorm[2] = {0.f, 0.f};
  if (tr.active && has2) {
    const int parts = one ? P.lse_splits : 1, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      const int head = g * 16 + lane / 4 + 8 * h;
      const float2* src = ml + (lrow * P.nh + head) * P.lse_splits;
      float m = -INFINITY, l = 0.f;
      for (int base = t; base < parts; base += 32) {
        float2 v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i)
          v[i] = base + 4 * i < parts ? src[base + 4 * i] : make_float2(-INFINITY, 0.f);
#pragma unroll
        for (int i = 0; i < 8; ++i) merge_ml(m, l, v[i].x, v[i].y);
      }
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
        merge_ml(m, l, m2, l2);
      }
      lnorm[h] = m + log2f(l);
    }
  }
  uint32_t qa[D / 16][4];
  if (tr.active) load_q_frags<D>(qa, q, tr.row, P.nh, g, lane);
  const float sc = P.tau * kLog2e;
  const int r = G.bs / G.s1, nbt = kET / r;  // pool ratio, blocks per entry tile
  const long long nb = (tr.L + G.bs - 1) / G.bs;
  const int ntile = int((n1 + kET - 1) / kET);
  const int per = (ntile + S - 1) / S, i0 = z * per, i1 = min(ntile, i0 + per);
  bf16* brow = bscore + (lrow * G.kvh + g) * P.nb_stride;
  float* erow = edge + (lrow * G.kvh + g) * P.et_stride;
  float* es = esc + warp * kET;
  auto need = [&](int i) { return 1LL * i * kET < cmax; };  // some row of the tile sees it
  if (i0 < i1 && need(i0)) load_entries<D, KF>(buf, c1, G, tr.pages, 1LL * i0 * kET, cmax, G.s1, g);
  cp_async_commit();
  for (int i = i0; i < i1; ++i) {
    if (i + 1 < i1 && need(i + 1))
      load_entries<D, KF>(buf + ((i + 1 - i0) & 1) * kBuf, c1, G, tr.pages, 1LL * (i + 1) * kET, cmax, G.s1, g);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (tr.active) {
      float v[8][2];
      if (has2 && 1LL * i * kET < cnt1) {
        float s[8][4];
        qk_tile<D>(s, qa, buf + ((i - i0) & 1) * kBuf, lane);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const long long j = 1LL * i * kET + n * 8 + qc + (e & 1);
            s[n][e] = j < cnt1 ? exp2f(s[n][e] * sc - lnorm[e >> 1]) : 0.f;
          }
          v[n][0] = s[n][0] + s[n][2];  // the lane's two heads; the other 14 are across lanes
          v[n][1] = s[n][1] + s[n][3];
#pragma unroll
          for (int o = 4; o <= 16; o <<= 1) {
            v[n][0] += __shfl_xor_sync(0xffffffffu, v[n][0], o);
            v[n][1] += __shfl_xor_sync(0xffffffffu, v[n][1], o);
          }
          v[n][0] = isnan(v[n][0]) ? 0.f : rb(v[n][0]);
          v[n][1] = isnan(v[n][1]) ? 0.f : rb(v[n][1]);
        }
      } else {
#pragma unroll
        for (int n = 0; n < 8; ++n) v[n][0] = v[n][1] = 0.f;
      }
      if (lane < 4)
#pragma unroll
        for (int n = 0; n < 8; ++n) es[n * 8 + qc] = v[n][0], es[n * 8 + qc + 1] = v[n][1];
      __syncwarp();
      const long long jbase = 1LL * i * kET;
      for (int k = lane; k < nbt; k += 32) {
        const long long b = 1LL * i * nbt + k;
        if (b >= nb || b * r >= n1) continue;  // no entry of its own: the top-k kernel decides
        float mx = -INFINITY;
        const int e1 = min(k * r + r, kET);
        for (int e = max(k * r - 1, 0); e < e1 && jbase + e < n1; ++e) mx = fmaxf(mx, es[e]);
        brow[b] = f2b(mx);
      }
      if (lane == 0) erow[i] = jbase + kET - 1 < n1 ? es[kET - 1] : -INFINITY;
      __syncwarp();
    }
    __syncthreads();
  }
}

// bf16 bits -> 16-bit key in float order (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float v) {
  const bf16 b = f2b(v);
  const uint32_t x = *reinterpret_cast<const uint16_t*>(&b);
  return (x & 0x8000u) ? (~x & 0xffffu) : (x | 0x8000u);
}

// Threads of a top-k block: 128 for steps of prompt rows (one block per row, many rows);
// 512 for steps with decode rows, where a handful of blocks scan every block of a long
// context (2048 at 128K) and the kernel's latency is the step's.
constexpr int kTopkThreads = 128, kTopkThreadsDecode = 512;

// The bin (of 256) holding the need-th largest key: returns it, and in *above the number of
// keys in higher bins. Warp 0 scans; lane i owns bins 255 − 8i .. 248 − 8i.
__device__ __forceinline__ void find_bin(const int* hist, int need, int* out_bin, int* out_above) {
  const int lane = threadIdx.x % 32;
  int c = 0;
  for (int k = 0; k < 8; ++k) c += hist[255 - 8 * lane - k];
  int incl = c;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  const unsigned hit = __ballot_sync(0xffffffffu, incl >= need);
  if (lane == __ffs(hit) - 1) {
    int acc = incl - c;
    for (int k = 0; k < 8; ++k) {
      const int bin = 255 - 8 * lane - k;
      if (acc + hist[bin] >= need) {
        *out_bin = bin;
        *out_above = acc;
        break;
      }
      acc += hist[bin];
    }
  }
}

//                                    grid: (tiles · kW, kvh), block: NT
template <int NT>
__global__ void __launch_bounds__(NT) select_topk_kernel(
    StepRows R, const int2* __restrict__ tiles, int tile_begin, SelectParams P,
    const bf16* __restrict__ bscore, const float* __restrict__ edge, int32_t* __restrict__ sel,
    int32_t* __restrict__ sel_cnt) {
  pdl_begin();  // launch_pdl: before any read or write
  extern __shared__ uint16_t keys[];  // [nb_stride]
  __shared__ int hist[256];
  __shared__ int sh_bin, sh_above;
  using Scan = cub::BlockScan<int, NT>;
  __shared__ typename Scan::TempStorage scan_tmp;
  const int w = blockIdx.x % kW, g = blockIdx.y, tid = threadIdx.x;
  const int2 tile = tiles[tile_begin + blockIdx.x / kW];
  if (w >= tile.y) return;
  const int64_t row = tile.x + w;
  const DevSeq s = R.seqs[R.row_seq[row]];
  if (!s.sparse) return;
  const CacheGeom& G = P.g;
  const long long t = s.past_len + (row - s.token_begin), L = s.past_len + s.num_tokens;
  const int nb = int((L + G.bs - 1) / G.bs), qb = int(t / G.bs), r = G.bs / G.s1;
  const long long n1 = num_entries(L, G.k1, G.s1);
  const int K = min(P.total_topk, nb);
  int32_t* out = sel + (row * G.kvh + g) * P.total_topk;
  if (K == nb) {  // every block is selected; those after the query's are dropped
    for (int b = tid; b <= qb; b += NT) out[b] = b;
    if (tid == 0) sel_cnt[row * G.kvh + g] = qb + 1;
    return;
  }
  const int64_t lrow = int64_t(blockIdx.x / kW) * kW + w;
  const bf16* brow = bscore + (lrow * G.kvh + g) * P.nb_stride;
  const float* erow = edge + (lrow * G.kvh + g) * P.et_stride;
  for (int b = tid; b < nb; b += NT) {
    float v;
    if (b < P.init_blocks || (b >= qb - P.local_blocks && b <= qb)) {
      v = INFINITY;
    } else if (max(1LL * b * r - 1, 0LL) >= n1) {
      v = -INFINITY;  // no level-1 entry overlaps the block
    } else {
      v = 1LL * b * r < n1 ? b2f(brow[b]) : -INFINITY;
      if (b > 0 && (b * r) % kET == 0) v = fmaxf(v, erow[(b * r) / kET - 1]);
    }
    keys[b] = uint16_t(order_key(v));
  }
  for (int i = tid; i < 256; i += NT) hist[i] = 0;
  __syncthreads();
  for (int b = tid; b < nb; b += NT) atomicAdd(&hist[keys[b] >> 8], 1);
  __syncthreads();
  if (tid < 32) find_bin(hist, K, &sh_bin, &sh_above);
  __syncthreads();
  const int hi = sh_bin, above1 = sh_above;
  __syncthreads();
  for (int i = tid; i < 256; i += NT) hist[i] = 0;
  __syncthreads();
  for (int b = tid; b < nb; b += NT)
    if ((keys[b] >> 8) == hi) atomicAdd(&hist[keys[b] & 255], 1);
  __syncthreads();
  if (tid < 32) find_bin(hist, K - above1, &sh_bin, &sh_above);
  __syncthreads();
  const uint32_t thr = uint32_t(hi << 8 | sh_bin);
  const int ties_take = K - above1 - sh_above;  // keys equal to thr taken, lowest index first
  // Each thread a contiguous range of blocks, so ranks and output follow the block order.
  const int per = (nb + NT - 1) / NT;
  const int b0 = min(nb, tid * per), b1 = min(nb, b0 + per);
  int ties = 0;
  for (int b = b0; b < b1; ++b) ties += keys[b] == thr;
  int tie_rank;
  Scan(scan_tmp).ExclusiveSum(ties, tie_rank);
  __syncthreads();
  int n_out = 0;
  for (int b = b0, tr_ = tie_rank; b < b1; ++b) {
    const bool take = keys[b] > thr || (keys[b] == thr && tr_++ < ties_take);
    n_out += take && b <= qb;
  }
  int pos, total;
  Scan(scan_tmp).ExclusiveSum(n_out, pos, total);
  for (int b = b0, tr_ = tie_rank; b < b1; ++b) {
    const bool take = keys[b] > thr || (keys[b] == thr && tr_++ < ties_take);
    if (take && b <= qb) out[pos++] = b;
  }
  if (tid == 0) sel_cnt[row * G.kvh + g] = total;
}

template <int D, int KF>
void launch_select_d(const bf16* q, const StepRows& s, const int2* tiles, int tile_begin,
                     int n_tiles, const void* c1, const void* c2, const SelectParams& p,
                     const SelectWork& w, cudaStream_t st) {
  const size_t smem_lse = size_t(2) * kET * (D + 8) * 2;
  const size_t smem_score = smem_lse + size_t(kW) * kET * 4;
  launch_pdl(select_lse_kernel<D, KF>,
             dim3(unsigned(n_tiles), unsigned(p.g.kvh), unsigned(p.lse_splits)), kThreads, smem_lse,
             st, q, s, tiles, tile_begin, static_cast<const KvElem<KF>*>(c2), p, w.ml);
  CUDA_CHECK_LAUNCH();
  launch_pdl(select_score_kernel<D, KF>,
             dim3(unsigned(n_tiles), unsigned(p.g.kvh), unsigned(p.score_splits)), kThreads,
             smem_score, st, q, s, tiles, tile_begin, static_cast<const KvElem<KF>*>(c1), p, w.ml,
             w.bscore, w.edge);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_select_fmt(int kf, const bf16* q, const StepRows& s, const int2* tiles,
                       int tile_begin, int n_tiles, const void* c1, const void* c2,
                       const SelectParams& p, const SelectWork& w, cudaStream_t st) {
  if (kf == kKvE4m3)
    launch_select_d<D, kKvE4m3>(q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st);
  else if (kf == kKvE5m2)
    launch_select_d<D, kKvE5m2>(q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st);
  else
    launch_select_d<D, kKvAct>(q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st);
}

template <int NT>
void launch_topk(const StepRows& s, const int2* tiles, int tile_begin, int n_tiles,
                 const SelectParams& p, const SelectWork& w, int32_t* sel, int32_t* sel_cnt,
                 cudaStream_t st) {
  const size_t smem = select_topk_smem_bytes(p.nb_stride);
  static size_t smem_set = 48 * 1024;  // static shared memory counts too: ask for what is needed
  if (smem > smem_set) {
    CUDA_CHECK(cudaFuncSetAttribute(select_topk_kernel<NT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    smem_set = smem;
  }
  launch_pdl(select_topk_kernel<NT>, dim3(unsigned(n_tiles * kW), unsigned(p.g.kvh)), NT, smem, st,
             s, tiles, tile_begin, p, w.bscore, w.edge, sel, sel_cnt);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool infllm_head_dim_supported(int d) { return d == 16 || d == 32 || d == 64 || d == 128; }

size_t select_topk_smem_bytes(int nb_stride) { return size_t(nb_stride) * 2; }

void launch_infllm_select(int d, const bf16* q, const StepRows& s, const int2* tiles,
                          int tile_begin, int n_tiles, const void* c1, const void* c2,
                          const SelectParams& p, const SelectWork& w, int32_t* sel,
                          int32_t* sel_cnt, cudaStream_t st, int kf) {
  if (n_tiles <= 0) return;
  switch (d) {
    case 16: launch_select_fmt<16>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st); break;
    case 32: launch_select_fmt<32>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st); break;
    case 64: launch_select_fmt<64>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st); break;
    case 128: launch_select_fmt<128>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st); break;
    default: return;
  }
  // lse_splits > 1: the step has decode rows (see SelectParams).
  if (p.lse_splits > 1)
    launch_topk<kTopkThreadsDecode>(s, tiles, tile_begin, n_tiles, p, w, sel, sel_cnt, st);
  else
    launch_topk<kTopkThreads>(s, tiles, tile_begin, n_tiles, p, w, sel, sel_cnt, st);
}

}  // namespace sala::cuda
