// InfLLM-v2 block selection on the tensor cores (SPEC §9.4–9.5; CPU twin: CpuBackend's
// sparse path with backend/cpu/infllm_rules.h), the scoring kernels per chunk of row tiles:
//
//  1. select_lse_kernel: per (row, query head) the level-2 normaliser m = max s2,
//     l = Σ exp(s2 − m) over the visible level-2 entries, in log2 units.
//  2. select_score_kernel: per (row, KV head) and level-1 entry j the score
//     bf16(Σ_h exp(s1_h[j] − m_h) / l_h) (0 for invisible entries, NaN → 0), then the block
//     max-pool of SPEC §9.5 over each 64-entry tile. A block's pool window (entries
//     b·r − 1 .. b·r + r − 1, r = block / stride) reaches one entry into the previous tile
//     when b·r is a multiple of 64: that entry's score is kept in SelectWork::edge and
//     merged by the top-k kernel (cuda_infllm_topk.cu, which also holds the entry point
//     launch_infllm_select), so the tiles (and grid.z splits) are independent.
// A block is one tile of ≤ 8 rows (tokens) of one sequence × one KV head,
// the compressed keys walked in 64-entry shared-memory tiles (double-buffered) shared by the
// tile's 8 rows; warp w owns row w. The product is transposed, Sᵀ[64 entries × 16 heads] =
// C·Qᵀ: the entries are the A operand (4 m-tiles of 16, fragments by ldmatrix), the row's
// 16 query heads the B operand (2 n-tiles of 8, held in registers for the whole kernel). A
// lane's C fragments hold 4 heads (2t, 2t+1, 2t+8, 2t+9; t = lane % 4) of 8 entries, so the
// 16-head sum is 3 lane-local adds and a reduce-scatter over the 4 lanes of a quad (6
// shuffles per tile), and the level-2 (max, sum) stays per lane over all tiles, merged
// across the 8 quads once at the end. The head sum adds in the order of the former
// head-row layout (((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), a_k = e_k + e_{k+8}),
// so from the same (m, l) the scores are the former kernel's bit for bit; the level-2 sums
// add per lane over the tiles first, so m is the same and l differs in the last fp32 bits
// (then a rare bf16 score flips by one ulp). scripts/select_sim/run.sh runs these kernels
// on the host against the former ones (git 8002222's row-per-warp kernels, 1.9x slower on
// the H200 at the last chunk of a 128K prompt, session 14) and a double reference.
// grid.z splits the entries of rows of split calls (decode and verify rows,
// DevSeq::split_row: one row per tile); their partial (m, l) go to SelectWork::ml and are
// merged by the score kernel in part order.
// Exponentials are fp32 exp2 (the CPU computes exp in double); a score then rounds to bf16,
// so rare last-bit differences can swap near-tied blocks (tests/ops counts the agreement).
// FP8 KV caches: the compressed keys are read as their code values (exact bf16) and the
// layer's K scale is part of SelectParams::tau (launch_infllm_select's caller).
#include <algorithm>

#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_infllm_select.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace sala::cuda {
namespace {

using namespace stage1;

constexpr int kW = kSparseTileRows;  // rows (warps) per tile
constexpr int kThreads = kW * 32;
constexpr int kET = kEntryTile;  // entries per shared-memory tile
constexpr float kLog2e = 1.4426950408889634f;
// Blocks per SM the score kernel is compiled for: 3 caps it at 80 registers (d 128 would take
// 124, 2 blocks: the former kernel's occupancy, whose issue stalls were on dependencies with
// ~4 warps per scheduler; ptxas -v: d 128 spills 28–64 bytes, d <= 64 none), its entry-tile
// parts keep the last round of blocks nearly full. The lse kernel cannot split an unsplit
// row's entries without changing its sums, so it keeps 2 (100 registers at d 128, no
// spills): a 2048-row chunk's 512 blocks are then 1.94 rounds of 132 SMs, at 3 they are 1.3.
constexpr int kMinBlocks = 3, kLseMinBlocks = 2;

// Entries [j0, j0 + kET) of a compressed cache (KV head g) into smem rows of D + 8 halves
// (conflict-free for ldmatrix at every D); entries at or past jend are zeros. bf16 caches by
// cp.async; FP8 caches (KF) by plain loads of 8 codes converted in registers to their exact
// bf16 values (unscaled: the K scale is in SelectParams::tau), stored before the caller's
// __syncthreads.
template <int D, int KF>
__device__ __forceinline__ void load_entries(bf16* buf, const KvElem<KF>* cache,
                                             const EntryPages& P, int j0, int jend, int g) {
  constexpr int LD = D + 8, CH = D / 8;
  const KvElem<KF>* base = cache + g * D;
  // d >= 32: thread t copies chunk t % CH of kPer consecutive entries (one EntryRun: a page-
  // table read per page, not per entry); d 16 (fewer chunks than threads): one chunk each.
  constexpr int kPer = kET * CH / kThreads;
  if constexpr (kPer >= 1 && kET * CH % kThreads == 0) {
    const int c = threadIdx.x % CH;
    copy_entry_run<KF, kPer>([&](int j) { return buf + j * LD + c * 8; }, base, P, j0,
                             threadIdx.x / CH * kPer, c, jend);
  } else if constexpr (KF == kKvAct) {
    for (int e = threadIdx.x; e < kET * CH; e += kThreads) {
      const int j = e / CH, c = e % CH;
      const bool ok = j0 + j < jend;
      cp_async16(buf + j * LD + c * 8, ok ? base + P.off(j0 + j) + c * 8 : cache, ok ? 16 : 0);
    }
  } else {
    // Every load of the thread issued before the first conversion (no cp.async for them).
    constexpr int kIt = (kET * CH + kThreads - 1) / kThreads;
    uint2 cw[kIt];
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int e = threadIdx.x + i * kThreads, j = e / CH, c = e % CH;
      cw[i] = e < kET * CH && j0 + j < jend
                  ? *reinterpret_cast<const uint2*>(base + P.off(j0 + j) + c * 8)
                  : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int e = threadIdx.x + i * kThreads, j = e / CH, c = e % CH;
      if (e < kET * CH) *reinterpret_cast<uint4*>(buf + j * LD + c * 8) = kv_codes8_bf16<KF>(cw[i]);
    }
  }
}

// B fragments of Qᵀ (k = dim, n = query head) for the 16 query heads of KV head g of one
// row, Q[h][k] = q[row, (16 g + h) D + k]: qb[ks][n] = {Q[8n + qr][16 ks + qc ..],
// Q[8n + qr][16 ks + qc + 8 ..]}.
template <int D>
__device__ __forceinline__ void load_qt_frags(uint32_t (&qb)[D / 16][2][2], const bf16* q,
                                              int64_t row, int nh, int g, int lane) {
  const int qr = lane / 4, qc = (lane % 4) * 2;
  const bf16* base = q + row * int64_t(nh) * D + int64_t(g) * 16 * D + qr * D + qc;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      qb[ks][n][0] = *reinterpret_cast<const uint32_t*>(base + n * 8 * D + ks * 16);
      qb[ks][n][1] = *reinterpret_cast<const uint32_t*>(base + n * 8 * D + ks * 16 + 8);
    }
}

// c[n] = Sᵀ of entries 16·mt .. 16·mt + 15 of a smem tile × heads 8n .. 8n + 7: c[n][0..1] =
// entry qr, heads 8n + qc, +1; c[n][2..3] = entry qr + 8. `tb` = tile + this lane's ldmatrix
// row / column offset.
template <int D>
__device__ __forceinline__ void st_mtile(float (&c)[2][4], const uint32_t (&qb)[D / 16][2][2],
                                         const bf16* tb, int mt) {
  constexpr int LD = D + 8;
#pragma unroll
  for (int n = 0; n < 2; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(a, tb + mt * 16 * LD + ks * 16);
    mma16816(c[0], a, qb[ks][0][0], qb[ks][0][1]);
    mma16816(c[1], a, qb[ks][1][0], qb[ks][1][1]);
  }
}

// The lane's ldmatrix.x4 address within a tile: row lane % 16, column 8 · (lane / 16).
template <int D>
__device__ __forceinline__ int ldsm_off(int lane) {
  return (lane & 15) * (D + 8) + (lane >> 4) * 8;
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
__global__ void __launch_bounds__(kThreads, kLseMinBlocks)
    select_lse_kernel(const bf16* __restrict__ q, StepRows R, const int2* __restrict__ tiles,
                      int tile_begin, const KvElem<KF>* __restrict__ c2, SelectParams P,
                      float2* __restrict__ ml) {
  pdl_begin();  // launch_pdl: before any read or write
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* buf = reinterpret_cast<bf16*>(smem_raw);  // [2][kET][D + 8]
  constexpr int kBuf = kET * (D + 8);
  const int2 tile = tiles[tile_begin + blockIdx.x];
  const int g = blockIdx.y, z = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, qr = lane / 4;
  TileRow tr;
  if (!tile_row(R, tile, warp, tr)) return;
  const int S = tr.s.split_row >= 0 ? int(gridDim.z) : 1;  // parts of this row
  if (z >= S) return;
  const CacheGeom& G = P.g;
  const long long n2 = num_entries(tr.L, G.k2, G.s2);
  const int cnt = int(visible_count(tr.t, n2, tr.s.num_tokens, G.k2, G.s2, tr.first));
  const long long t_last = tr.s.past_len + (tile.x + tile.y - 1 - tr.s.token_begin);
  const int cmax = int(visible_count(t_last, n2, tr.s.num_tokens, G.k2, G.s2, tr.first));
  const int ntile = (cmax + kET - 1) / kET;
  const int per = (ntile + S - 1) / S, i0 = z * per, i1 = min(ntile, i0 + per);
  const EntryPages EP(tr.pages, G, G.s2);
  uint32_t qb[D / 16][2][2];
  if (tr.active) load_qt_frags<D>(qb, q, tr.row, P.nh, g, lane);
  const float sc = P.tau * kLog2e;
  // The lane's heads 2t, 2t + 1, 2t + 8, 2t + 9 (index 2n + k: c[n][k], c[n][k + 2]).
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, l[4] = {0.f, 0.f, 0.f, 0.f};
  const int aoff = ldsm_off<D>(lane);
  if (i0 < i1) load_entries<D, KF>(buf, c2, EP, i0 * kET, cmax, g);
  cp_async_commit();
  for (int i = i0; i < i1; ++i) {
    if (i + 1 < i1)
      load_entries<D, KF>(buf + ((i + 1 - i0) & 1) * kBuf, c2, EP, (i + 1) * kET, cmax, g);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int lim = cnt - i * kET;  // entries of the tile this row sees
    if (tr.active && lim > 0) {
      const bf16* tb = buf + ((i - i0) & 1) * kBuf + aoff;
      // Two halves of 32 entries (16 scores live per half, not 32): per head a max over the
      // lane's 4 entries, a rescale only when the lane's max grows, 4 exponentials.
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float s[2][2][4];
#pragma unroll
        for (int u = 0; u < 2; ++u) st_mtile<D>(s[u], qb, tb, 2 * hf + u);
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const bool vis = lim >= kET || (2 * hf + u) * 16 + qr + (e & 2) * 4 < lim;
            s[u][0][e] = vis ? s[u][0][e] * sc : -INFINITY;
            s[u][1][e] = vis ? s[u][1][e] * sc : -INFINITY;
          }
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          const int n = h >> 1, k = h & 1;
          const float tm =
              fmaxf(fmaxf(s[0][n][k], s[0][n][k + 2]), fmaxf(s[1][n][k], s[1][n][k + 2]));
          if (tm > m[h]) {  // l is 0 while m is −inf
            l[h] *= exp2f(m[h] - tm);
            m[h] = tm;
          }
          const float M = m[h] == -INFINITY ? 0.f : m[h];  // all −inf: every term 0
          l[h] += (exp2f(s[0][n][k] - M) + exp2f(s[0][n][k + 2] - M)) +
                  (exp2f(s[1][n][k] - M) + exp2f(s[1][n][k + 2] - M));
        }
      }
    }
    __syncthreads();  // the buffer is refilled two iterations on
  }
  // Merge the 8 quads (the lanes of a head: same lane % 4).
#pragma unroll
  for (int h = 0; h < 4; ++h)
#pragma unroll
    for (int o = 4; o <= 16; o <<= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[h], o),
                  l2 = __shfl_xor_sync(0xffffffffu, l[h], o);
      merge_ml(m[h], l[h], m2, l2);
    }
  if (tr.active && lane < 4) {
    const int64_t lrow = int64_t(blockIdx.x) * kW + warp;
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const int head = g * 16 + (h >> 1) * 8 + 2 * lane + (h & 1);
      ml[(lrow * P.nh + head) * P.lse_splits + z] = make_float2(m[h], l[h]);
    }
  }
}

// The row's normalisers log2 l + m of heads qr and qr + 8 (every lane of quad qr), from the
// lse kernel's parts: the 4 lanes of a head each merge every 4th part, 8 loads issued before
// any merge, then combine by shuffles (a decode row's parts are independent L2 loads, not a
// chain of load-then-merge steps). Warp-uniform call.
__device__ __forceinline__ void row_lnorm(float (&lnorm)[2], const float2* __restrict__ ml,
                                          int64_t lrow, const SelectParams& P, int g, int parts,
                                          int lane) {
  for (int h = 0; h < 2; ++h) {
    const int head = g * 16 + lane / 4 + 8 * h;
    const float2* src = ml + (lrow * P.nh + head) * P.lse_splits;
    float m = -INFINITY, l = 0.f;
    for (int base = lane % 4; base < parts; base += 32) {
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

// grid: (tiles, kvh, max(score_splits, pparts)), block: kThreads. pparts: parts of the entry
// tiles of rows of unsplit calls (rows of split calls: P.score_splits); the tiles are
// independent (own pool, own edge), so every part count gives the same numbers.
// skip_unsplit: those rows are the wgmma kernel's (cuda_infllm_select_sm90.cu).
template <int D, int KF>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    select_score_kernel(const bf16* __restrict__ q, StepRows R, const int2* __restrict__ tiles,
                        int tile_begin, const KvElem<KF>* __restrict__ c1, SelectParams P,
                        int pparts, bool skip_unsplit, const float2* __restrict__ ml,
                        bf16* __restrict__ bscore, float* __restrict__ edge) {
  pdl_begin();  // launch_pdl: before any read or write
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kBuf = kET * (D + 8);
  bf16* buf = reinterpret_cast<bf16*>(smem_raw);          // [2][kET][D + 8]
  float* esc = reinterpret_cast<float*>(buf + 2 * kBuf);  // [kW][kET] entry scores
  const int2 tile = tiles[tile_begin + blockIdx.x];
  const int g = blockIdx.y, z = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, qr = lane / 4, t = lane % 4;
  TileRow tr;
  if (!tile_row(R, tile, warp, tr)) return;
  const bool one = tr.s.split_row >= 0;         // a row of a split call: one row per tile
  if (!one && skip_unsplit) return;             // launch_select_score_sm90's rows
  const int S = one ? P.score_splits : pparts;  // parts of the entries
  if (z >= S) return;
  const CacheGeom& G = P.g;
  const int n1 = int(num_entries(tr.L, G.k1, G.s1));
  const long long n2 = num_entries(tr.L, G.k2, G.s2);
  const int cnt1 = int(visible_count(tr.t, n1, tr.s.num_tokens, G.k1, G.s1, tr.first));
  const bool has2 = visible_count(tr.t, n2, tr.s.num_tokens, G.k2, G.s2, tr.first) > 0;
  const long long t_last = tr.s.past_len + (tile.x + tile.y - 1 - tr.s.token_begin);
  const int cmax = int(visible_count(t_last, n1, tr.s.num_tokens, G.k1, G.s1, tr.first));
  const int64_t lrow = int64_t(blockIdx.x) * kW + warp;
  // lnorm of the lane's heads 2t, 2t + 1, 2t + 8, 2t + 9 (from the lanes 4·head of row_lnorm).
  float lno[2] = {0.f, 0.f}, ln[4];
  if (tr.active && has2) row_lnorm(lno, ml, lrow, P, g, one ? P.lse_splits : 1, lane);
  ln[0] = __shfl_sync(0xffffffffu, lno[0], 8 * t);
  ln[1] = __shfl_sync(0xffffffffu, lno[0], 8 * t + 4);
  ln[2] = __shfl_sync(0xffffffffu, lno[1], 8 * t);
  ln[3] = __shfl_sync(0xffffffffu, lno[1], 8 * t + 4);
  uint32_t qb[D / 16][2][2];
  if (tr.active) load_qt_frags<D>(qb, q, tr.row, P.nh, g, lane);
  const float sc = P.tau * kLog2e;
  const int r = G.bs / G.s1, nbt = kET / r;  // pool ratio, blocks per entry tile
  const int nb = int((tr.L + G.bs - 1) / G.bs);
  const int ntile = (n1 + kET - 1) / kET;
  const int per = (ntile + S - 1) / S, i0 = z * per, i1 = min(ntile, i0 + per);
  bf16* brow = bscore + (lrow * G.kvh + g) * P.nb_stride;
  float* erow = edge + (lrow * G.kvh + g) * P.et_stride;
  float* es = esc + warp * kET;
  const EntryPages EP(tr.pages, G, G.s1);
  const int aoff = ldsm_off<D>(lane);
  // After the reduce-scatter lane (qr, t) holds entries 16·(2j + t1) + qr + 8·t0, j = 0, 1.
  const int t0 = t & 1, t1 = t >> 1;
  auto need = [&](int i) { return i * kET < cmax; };  // some row of the tile sees it
  if (i0 < i1 && need(i0)) load_entries<D, KF>(buf, c1, EP, i0 * kET, cmax, g);
  cp_async_commit();
  for (int i = i0; i < i1; ++i) {
    if (i + 1 < i1 && need(i + 1))
      load_entries<D, KF>(buf + ((i + 1 - i0) & 1) * kBuf, c1, EP, (i + 1) * kET, cmax, g);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (tr.active) {
      const int jbase = i * kET, lim = cnt1 - jbase;  // entries of the tile this row sees
      if (has2 && lim > 0) {
        const bf16* tb = buf + ((i - i0) & 1) * kBuf + aoff;
        float v[8];  // [2·mt + k]: the lane's 4 heads of entry 16·mt + qr + 8k
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          float c[2][4];
          st_mtile<D>(c, qb, tb, mt);
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const float a0 = exp2f(c[0][2 * k] * sc - ln[0]) + exp2f(c[1][2 * k] * sc - ln[2]);
            const float a1 =
                exp2f(c[0][2 * k + 1] * sc - ln[1]) + exp2f(c[1][2 * k + 1] * sc - ln[3]);
            v[2 * mt + k] = a0 + a1;
          }
        }
        // Reduce-scatter over the quad: xor 1 keeps the entries of parity t0, xor 2 of m-tile
        // parity t1; each sum adds a lane's own part first.
        float w[4], u[2];
#pragma unroll
        for (int k = 0; k < 4; ++k)
          w[k] = (t0 ? v[2 * k + 1] : v[2 * k]) +
                 __shfl_xor_sync(0xffffffffu, t0 ? v[2 * k] : v[2 * k + 1], 1);
#pragma unroll
        for (int k = 0; k < 2; ++k)
          u[k] = (t1 ? w[2 * k + 1] : w[2 * k]) +
                 __shfl_xor_sync(0xffffffffu, t1 ? w[2 * k] : w[2 * k + 1], 2);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int e = 16 * (2 * k + t1) + qr + 8 * t0;
          es[e] = e < lim && !isnan(u[k]) ? rb(u[k]) : 0.f;
        }
      } else {
        for (int e = lane; e < kET; e += 32) es[e] = 0.f;
      }
      __syncwarp();
      for (int k = lane; k < nbt; k += 32) {
        const int b = i * nbt + k;
        if (b >= nb || b * r >= n1) continue;  // no entry of its own: the top-k kernel decides
        float mx = -INFINITY;
        const int e1 = min(k * r + r, min(kET, n1 - jbase));
        for (int e = max(k * r - 1, 0); e < e1; ++e) mx = fmaxf(mx, es[e]);
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
  // SelectParams::sm90_scores (Hopper, d = 128): unsplit rows' level-1 scores on wgmma, this
  // kernel the split rows only.
  const bool sm90 = D == 128 && p.sm90_scores;
  // Entry-tile parts of unsplit rows' score blocks: a chunk of 256 tiles × 2 KV heads is 512
  // equal blocks, 1.3 rounds of the H200's 132 SMs × 3, so the second round would run a
  // third full (resident blocks: kMinBlocks per SM, 80 registers, <= 37 KB smem).
  const int pparts = score_entry_parts(1LL * n_tiles * p.g.kvh, kMinBlocks);
  launch_pdl(select_lse_kernel<D, KF>,
             dim3(unsigned(n_tiles), unsigned(p.g.kvh), unsigned(p.lse_splits)), kThreads, smem_lse,
             st, q, s, tiles, tile_begin, static_cast<const KvElem<KF>*>(c2), p, w.ml);
  CUDA_CHECK_LAUNCH();
  if (sm90) launch_select_score_sm90(q, s, tiles, tile_begin, n_tiles, c1, p, w, KF, st);
  const int zs = sm90 ? p.score_splits : std::max(p.score_splits, pparts);
  launch_pdl(select_score_kernel<D, KF>, dim3(unsigned(n_tiles), unsigned(p.g.kvh), unsigned(zs)),
             kThreads, smem_score, st, q, s, tiles, tile_begin, static_cast<const KvElem<KF>*>(c1),
             p, pparts, sm90, w.ml, w.bscore, w.edge);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_select_fmt(int kf, const bf16* q, const StepRows& s, const int2* tiles, int tile_begin,
                       int n_tiles, const void* c1, const void* c2, const SelectParams& p,
                       const SelectWork& w, cudaStream_t st) {
  if (kf == kKvE4m3)
    launch_select_d<D, kKvE4m3>(q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st);
  else if (kf == kKvE5m2)
    launch_select_d<D, kKvE5m2>(q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st);
  else
    launch_select_d<D, kKvAct>(q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st);
}

}  // namespace

void launch_infllm_select_scores(int d, const bf16* q, const StepRows& s, const int2* tiles,
                                 int tile_begin, int n_tiles, const void* c1, const void* c2,
                                 const SelectParams& p, const SelectWork& w, cudaStream_t st,
                                 int kf) {
  switch (d) {
    case 16:
      launch_select_fmt<16>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st);
      break;
    case 32:
      launch_select_fmt<32>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st);
      break;
    case 64:
      launch_select_fmt<64>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st);
      break;
    case 128:
      launch_select_fmt<128>(kf, q, s, tiles, tile_begin, n_tiles, c1, c2, p, w, st);
      break;
    default:
      return;  // launch_infllm_select admits infllm_head_dim_supported only
  }
}

}  // namespace sala::cuda
