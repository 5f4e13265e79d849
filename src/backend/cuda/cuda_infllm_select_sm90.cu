// InfLLM-v2 stage 1's level-1 scores (SPEC §9.4–9.5) of prompt chunks on Hopper's wgmma. The
// mma.sync kernel (cuda_infllm_select.cu) gives each row one warp: a warp multiplies the whole
// 64-entry tile by its row's 16 query heads (m16 n8 per MMA, the tile's fragments loaded by
// every warp again), so its instruction count per entry tile, not the tensor cores or the
// SFU, bounds it (ncu at the end of a 128K prefill: IPC 0.61, tensor pipe 15 %, XU 27 %).
// Here one warpgroup multiplies the tile once by all 8 rows × 16 heads of its row tile: S =
// C·Qᵀ as wgmma m64 (entries) × n128 (row r, head h at column 16r + h) × k = d, C and Q both
// K-major in 128-byte-swizzled shared memory; 8 wgmma per entry tile instead of 8 warps × 96
// mma.sync and ldmatrix.
//
// The epilogue keeps the mma.sync kernel's arithmetic: a thread holds, for 2 entries and each
// of the 8 rows, the heads 2t, 2t + 1, 2t + 8, 2t + 9 (t = lane % 4), so a score is
// ((e(2t) + e(2t + 8)) + (e(2t + 1) + e(2t + 9))) per lane, summed over the quad as (t0 +
// t1) + (t2 + t3), with e(h) = exp2f(s·τ·log2e − lnorm_h): the same operations in the same
// order. Only S's fp32 accumulation order inside a k-step may differ from mma.sync's, so a
// bf16 score can flip by one ulp (tests/ops count the selections equal to the CPU's).
// Rows of split calls (decode and verify rows) stay on the mma.sync kernel, which skips the
// rows this one takes (its skip_unsplit).
// H200 (session 26; ncu, last 2048-row chunk of a 128K prompt, bf16): 587 vs the mma.sync
// kernel's 708 µs; stage 1 of a 128K / 512K prefill 297 / 4,071 vs 321 / 4,520 ms. Still far
// from its bounds (≈ 170 µs of MMA, ≈ 145 µs of MUFU ex2 at that chunk): 2.2 warp instructions
// issued per cycle, ≈ 1,140 per warp per entry tile (≈ 540 of them the exponentials, ≈ 320
// the tile's loads), with one warpgroup per block and the MMA, the exponentials and the pool
// of a tile run one after the other. The loads since walk consecutive entries (EntryRun):
// lse + score + top-k at that chunk 743 vs 833 µs, stage 1 at 512K 3,537 vs 3,977 ms.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_infllm_select.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_tma_sm90.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {

using namespace stage1;

constexpr int kD = 128;                  // head_dim
constexpr int kRows = kSparseTileRows;   // rows per tile: n = 8 rows × 16 heads = 128
constexpr int kET = kEntryTile;          // entries per tile (m64)
constexpr int kThreads = 128;            // one warpgroup
constexpr int kMinBlocks = 3;            // per SM: 64 KB of shared memory, <= 168 registers
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kCHalf = kET * 64 * 2;     // [64 entries][64 dims] bf16: 8 KB
constexpr int kCTile = 2 * kCHalf;       // an entry tile, d = 128
constexpr int kQHalf = 128 * 64 * 2;     // [128 columns][64 dims]: 16 KB
constexpr int kQBytes = 2 * kQHalf;
constexpr size_t kSmem = 2 * kCTile + kQBytes + size_t(kRows) * kET * 4 + 1024;

// Byte offset of 16-byte chunk c (of 16) of row j in a [2][rows][64] bf16 operand whose
// halves are `half` bytes: 128-byte rows, the chunk XOR-swizzled by j mod 8 (the 128-byte
// swizzle on a 1024-byte-aligned base).
__device__ __forceinline__ int sw_off(int j, int c, int half) {
  return (c >> 3) * half + j * 128 + (((c & 7) ^ (j & 7)) << 4);
}

#ifdef SALA_SM90A_DEVICE
// Entries [j0, j0 + kET) of a compressed cache (KV head g) into an entry tile; entries at or
// past jend are zeros. bf16 by cp.async (the caller waits and fences them for wgmma); FP8
// codes by plain loads converted to their exact bf16 values (unscaled: the K scale is in
// SelectParams::tau).
template <int KF>
__device__ __forceinline__ void load_entries(unsigned char* dst, const KvElem<KF>* cache,
                                             const EntryPages& P, int j0, int jend, int g) {
  constexpr int kIt = kET * 16 / kThreads;  // 16-byte chunks per thread: 8 entries
  static_assert(kThreads / 16 * kIt == kET);
  // Thread t: chunk t % 16 of the 8 consecutive entries from 8 (t / 16); a warp copies two
  // 256-byte entries per instruction.
  const int c = threadIdx.x % 16;
  copy_entry_run<KF, kIt>([&](int j) { return dst + sw_off(j, c, kCHalf); }, cache + g * kD, P,
                          j0, threadIdx.x / 16 * kIt, c, jend);
}

template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
#endif

// grid: (tiles, kvh, pparts), block: kThreads. The rows of unsplit sparse calls only (the
// mma.sync kernel's skip_unsplit); pparts: parts of the entry tiles, which change no number.
template <int KF>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    select_score_sm90_kernel(const bf16* __restrict__ q, StepRows R, const int2* __restrict__ tiles,
                             int tile_begin, const KvElem<KF>* __restrict__ c1, SelectParams P,
                             int pparts, const float2* __restrict__ ml, bf16* __restrict__ bscore,
                             float* __restrict__ edge) {
#ifdef SALA_SM90A_DEVICE
  pdl_begin();  // launch_pdl: before any read or write
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* ctile = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // [2]
  unsigned char* qs = ctile + 2 * kCTile;
  float* es = reinterpret_cast<float*>(qs + kQBytes);  // [kRows][kET] entry scores
  __shared__ int row_cnt1[kRows];                      // entries a row sees (0: none scored)

  const int2 tile = tiles[tile_begin + blockIdx.x];
  TileRow tr;
  if (!tile_row(R, tile, 0, tr) || tr.s.split_row >= 0) return;  // the mma.sync kernel's rows
  const int g = blockIdx.y, z = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, t = lane % 4;
  const CacheGeom& G = P.g;
  const int n1 = int(num_entries(tr.L, G.k1, G.s1));
  const long long n2 = num_entries(tr.L, G.k2, G.s2);
  const long long t_last = tr.s.past_len + (tile.x + tile.y - 1 - tr.s.token_begin);
  const int cmax = int(visible_count(t_last, n1, tr.s.num_tokens, G.k1, G.s1, tr.first));
  if (tid < kRows) {
    // A row scores its visible entries only if it sees a level-2 entry (else every score is
    // 0, as in the mma.sync kernel); inactive rows score none.
    const long long tr_t = tr.t + tid;
    const bool on = tid < tile.y &&
                    visible_count(tr_t, n2, tr.s.num_tokens, G.k2, G.s2, tr.first) > 0;
    row_cnt1[tid] =
        on ? int(visible_count(tr_t, n1, tr.s.num_tokens, G.k1, G.s1, tr.first)) : 0;
  }
  // lnorm of row r's heads 2t, 2t + 1, 2t + 8, 2t + 9: the row's one level-2 part (unsplit
  // rows), m + log2 l, as the mma.sync kernel's row_lnorm gives it.
  float ln[kRows][4];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int head = g * 16 + 2 * t + (k & 1) + 8 * (k >> 1);
      const int64_t lrow = int64_t(blockIdx.x) * kRows + r;
      const float2 v = r < tile.y ? ml[(lrow * P.nh + head) * P.lse_splits]
                                  : make_float2(0.f, 1.f);
      ln[r][k] = v.x == -INFINITY ? 0.f : v.x + log2f(v.y);
    }
  // Q as the B operand: column n = 16 r + h holds q[row r, head 16 g + h] (zeros past the
  // tile's rows).
  for (int e = tid; e < 128 * 16; e += kThreads) {
    const int n = e >> 4, c = e & 15, r = n >> 4;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < tile.y)
      v = *reinterpret_cast<const uint4*>(
          q + ((int64_t(tile.x) + r) * P.nh + g * 16 + (n & 15)) * kD + c * 8);
    *reinterpret_cast<uint4*>(qs + sw_off(n, c, kQHalf)) = v;
  }

  const float sc = P.tau * kLog2e;
  const int rp = G.bs / G.s1, nbt = kET / rp;  // pool ratio, blocks per entry tile
  const int nb = int((tr.L + G.bs - 1) / G.bs);
  const int ntile = (n1 + kET - 1) / kET;
  const int per = (ntile + pparts - 1) / pparts, i0 = z * per, i1 = min(ntile, i0 + per);
  const EntryPages EP(tr.pages, G, G.s1);
  const uint32_t c_a = smem_addr(ctile), q_a = smem_addr(qs);
  const int t0 = t & 1, t1 = t >> 1;
  auto need = [&](int i) { return i * kET < cmax; };  // some row of the tile sees it
  if (i0 < i1 && need(i0)) load_entries<KF>(ctile, c1, EP, i0 * kET, cmax, g);
  cp_async_commit();
  for (int i = i0; i < i1; ++i) {
    if (i + 1 < i1 && need(i + 1))
      load_entries<KF>(ctile + ((i + 1 - i0) & 1) * kCTile, c1, EP, (i + 1) * kET, cmax, g);
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async_smem();  // this thread's tile (and Q) stores, for wgmma's reads
    __syncthreads();
    const int jbase = i * kET;
    if (need(i)) {
      float acc[64];
      const uint32_t ct = c_a + ((i - i0) & 1) * kCTile;
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks)
        wgmma_m64n128k16(acc, smem_desc_sw128(ct + (ks >> 2) * kCHalf + (ks & 3) * 32),
                         smem_desc_sw128(q_a + (ks >> 2) * kQHalf + (ks & 3) * 32), ks > 0);
      wgmma_commit();
      wgmma_wait_all();
      fence_operands(acc);
      // v[2r + h]: row r's 16-head partial of entry 16·warp + lane/4 + 8h (acc[4j + 2h + e]:
      // column 8j + 2t + e = row j / 2, head 8·(j & 1) + 2t + e).
      float v[2 * kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float* lo = acc + 4 * (2 * r) + 2 * h;      // heads 2t, 2t + 1
          const float* hi = acc + 4 * (2 * r + 1) + 2 * h;  // heads 2t + 8, 2t + 9
          const float a0 = exp2f(lo[0] * sc - ln[r][0]) + exp2f(hi[0] * sc - ln[r][2]);
          const float a1 = exp2f(lo[1] * sc - ln[r][1]) + exp2f(hi[1] * sc - ln[r][3]);
          v[2 * r + h] = a0 + a1;
        }
      // Reduce-scatter over the quad: xor 1 keeps the entry half h = t0, xor 2 the rows of
      // parity t1; each sum adds a lane's own part first. Lane (qr, t) ends with entry
      // 16·warp + qr + 8·t0 of rows 2k + t1.
      float w[kRows], u[kRows / 2];
#pragma unroll
      for (int k = 0; k < kRows; ++k)
        w[k] = (t0 ? v[2 * k + 1] : v[2 * k]) +
               __shfl_xor_sync(0xffffffffu, t0 ? v[2 * k] : v[2 * k + 1], 1);
#pragma unroll
      for (int k = 0; k < kRows / 2; ++k)
        u[k] = (t1 ? w[2 * k + 1] : w[2 * k]) +
               __shfl_xor_sync(0xffffffffu, t1 ? w[2 * k] : w[2 * k + 1], 2);
      const int e = 16 * warp + lane / 4 + 8 * t0;
#pragma unroll
      for (int k = 0; k < kRows / 2; ++k) {
        const int r = 2 * k + t1;
        es[r * kET + e] = e < row_cnt1[r] - jbase && !isnan(u[k]) ? rb(u[k]) : 0.f;
      }
    } else {
      for (int x = tid; x < kRows * kET; x += kThreads) es[x] = 0.f;
    }
    __syncthreads();
    // SPEC §9.5's pool per row and block of the tile, and the tile's edge entry.
    for (int x = tid; x < tile.y * nbt; x += kThreads) {
      const int r = x / nbt, k = x % nbt, b = i * nbt + k;
      if (b >= nb || b * rp >= n1) continue;  // no entry of its own: the top-k kernel decides
      const int64_t lrow = int64_t(blockIdx.x) * kRows + r;
      const float* er = es + r * kET;
      float mx = -INFINITY;
      const int e1 = min(k * rp + rp, min(kET, n1 - jbase));
      for (int e = max(k * rp - 1, 0); e < e1; ++e) mx = fmaxf(mx, er[e]);
      bscore[(lrow * G.kvh + g) * P.nb_stride + b] = f2b(mx);
    }
    if (tid < tile.y) {
      const int64_t lrow = int64_t(blockIdx.x) * kRows + tid;
      edge[(lrow * G.kvh + g) * P.et_stride + i] =
          jbase + kET - 1 < n1 ? es[tid * kET + kET - 1] : -INFINITY;
    }
    __syncthreads();  // es, and the tile buffer the next iteration refills
  }
#endif
}

}  // namespace

bool select_score_sm90_supported(int d) {
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    return major == 9;
  }();
  return sm90 && d == kD;
}

void launch_select_score_sm90(const bf16* q, const StepRows& s, const int2* tiles,
                              int tile_begin, int n_tiles, const void* c1, const SelectParams& p,
                              const SelectWork& w, int kf, cudaStream_t st) {
  if (n_tiles <= 0) return;
  if (!select_score_sm90_supported(kD)) {
    std::fprintf(stderr, "%s:%d: the wgmma stage-1 kernel needs sm_90 and d = %d\n", __FILE__,
                 __LINE__, kD);
    std::abort();
  }
  const int pparts = score_entry_parts(1LL * n_tiles * p.g.kvh, kMinBlocks);
  auto go = [&](auto kernel, auto cache, SmemOptIn& optin) {
    optin.raise(kernel, size_t(kSmem));
    launch_pdl(kernel, dim3(unsigned(n_tiles), unsigned(p.g.kvh), unsigned(pparts)), kThreads,
               kSmem, st, q, s, tiles, tile_begin, cache, p, pparts, w.ml, w.bscore, w.edge);
    CUDA_CHECK_LAUNCH();
  };
  static SmemOptIn set_bf16, set_e4m3, set_e5m2;  // per kernel and device
  if (kf == kKvE4m3)
    go(select_score_sm90_kernel<kKvE4m3>, static_cast<const KvElem<kKvE4m3>*>(c1), set_e4m3);
  else if (kf == kKvE5m2)
    go(select_score_sm90_kernel<kKvE5m2>, static_cast<const KvElem<kKvE5m2>*>(c1), set_e5m2);
  else
    go(select_score_sm90_kernel<kKvAct>, static_cast<const KvElem<kKvAct>*>(c1), set_bf16);
}

}  // namespace sala::cuda
