// The row-per-warp InfLLM-v2 stage-1 kernels (select_lse_kernel, select_score_kernel as of
// 8002222), kept for one A/B on the H200 against the transposed kernels of
// cuda_infllm_select.cu (BackendOptions::select_v1, `sala bench offline --select-v1`,
// CudaOps.SparseLayerInfLLMv2SelectV1); delete after the A/B. Same outputs in
// SelectWork::ml / bscore / edge (the top-k kernel of cuda_infllm_select.cu reads them).
// Layout: a block is one tile of <= 8 rows x one KV head; warp w owns row w's 16 query heads
// as the 16 rows of mma m16n8k16 (A fragments in registers), B = 64 compressed entries of a
// shared-memory tile loaded per MMA; the 16-head sum by shuffles over 8 lane groups.
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

}  // namespace

void launch_infllm_select_scores_v1(int d, const bf16* q, const StepRows& s, const int2* tiles,
                                    int tile_begin, int n_tiles, const void* c1, const void* c2,
                                    const SelectParams& p, const SelectWork& w, cudaStream_t st,
                                    int kf) {
  switch (d) {
    case 16: launch_select_fmt<16>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st); break;
    case 32: launch_select_fmt<32>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st); break;
    case 64: launch_select_fmt<64>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st); break;
    case 128: launch_select_fmt<128>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st); break;
    default: return;
  }
}

}  // namespace sala::cuda
