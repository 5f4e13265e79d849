// InfLLM-v2 stage 2 (SPEC §9.6) of prompt chunks on Hopper's wgmma. The mma.sync kernel
// (cuda_infllm_attn.cu) gives each row one warp of 16 query heads (mma's m16), so a K/V tile
// in shared memory serves one row per MMA and its instruction count per computed tile bounds
// it (≈ 9 % of the FLOP floor at 128K). Here a warpgroup computes 4 rows × 16 heads = wgmma's
// m64 on every tile that all its 4 rows selected (the forced local window, and the blocks
// neighbouring rows share); any other tile is computed by the warps of the rows that selected
// it, alone, by mma.sync on their own sub-partitions' tensor cores (warp_tile). A warpgroup
// computing every tile any of its rows selected, masking the others' keys (a tile a row skips
// costs that row nothing in its numbers: probabilities 0, rescale by 1), computed ≈ 2.3x
// (32K) to 3x (512K) the tiles its rows need on the random 9B, whose rows share few top-k
// blocks.
//
// One block per (tile of ≤ 8 rows of one unsplit sparse call, KV head): warpgroup 0 copies
// the union of the 8 rows' selected 64-key tiles (ascending) into a ring of K/V slots (5; 4
// with an FP8 cache) in 128-byte-swizzled halves of 64 columns (wgmma's canonical layout)
// and hands them over by mbarrier: by TMA where a page holds whole 64-key tiles (one thread,
// 4 bulk loads per tile), else by cp.async with a proxy fence before the hand-over;
// warpgroups 1 and 2 (rows 0-3, 4-7) each compute S = Q·Kᵀ (m64 n64, Q and K from shared
// memory), the masked online softmax in registers (log2 units, fp32), and O += P·V with P
// from registers as hi + lo bf16 terms (the probabilities are not rounded to bf16: golden
// README §4) and V as an MN-major operand.
// A row's numbers depend on its own selection, the tile order (ascending) and, per tile, the
// path that computed it (wgmma where the 3 rows beside it in its warpgroup selected it too):
// those rows come from the call's row tiling, so a row's numbers never depend on the other
// sequences of its step. FP8 caches: TMA lands the codes in a staging buffer and the producer
// warpgroup converts them into the ring (its first version, converting codes the producers
// had loaded themselves, measured slower than the mma.sync kernel: 2,129 vs 2,030 ms at 128K).
// H200 (session 25, 128K prefill): 1,143 vs the mma.sync kernel's 1,514 ms (FP8 KV 1,937 vs
// 2,064). Measured slower or no better: S of the next tile issued before P·V of the current
// one (1,249 vs 1,166 ms, branch s2pipe); a ring of 5 slots, 1,120 vs 1,123 ms then, gained
// 3-4 % once the warps computed tiles alone (session 29: 991 vs 1,033, 841 vs 868 ms). Session
// 28 (128K prefill, one command each; docs/PERF_LOG.md): warp_tile for tiles of ≤ 1 / ≤ 2 of
// the warpgroup's rows 1,130 / 1,096 ms (all wgmma: 1,168); with its loads ahead of its MMAs
// ≤ 2 / ≤ 3 / ≤ 4 rows 1,041 / 1,036 / 1,087 ms (session 29, leaner consumers: ≤ 3 / ≤ 4
// rows 868 / 898 ms). Probes (math off: 377 ms; loads off: 994 ms)
// say the consumers bound it: their tensor work is ≈ 30 % of their time (docs/PERF.md).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_infllm_attn_sm90_ring.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {

using namespace stage2;
using namespace stage2_sm90;

#ifdef SALA_SM90A_DEVICE
// Ties wgmma accumulators to this point of the program: the compiler sees them written here,
// so it reads them only after the wgmma.wait before it (it knows nothing of async wgmma).
__device__ __forceinline__ void fence_operands(float (&r)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// The masked online-softmax update of one tile for this thread's rows lane/4 (h = 0) and
// lane/4 + 8 (h = 1) of its warp: sv[4j + 2h + e] = S of key 8j + qc + e; keys: the row's
// attended keys of the tile (bit k). Rescales O, updates (m, l) in log2 units and returns P
// as the A fragments of P·V's 4 k-steps (keys 16kk ..): registers r = 0..3 hold (row +
// 8·(r & 1), keys 16kk + 8·(r >> 1) + qc, + 1) = sv[4(2kk + (r >> 1)) + 2(r & 1)], as
// hi + lo bf16 terms.
__device__ __forceinline__ void softmax_step(float (&sv)[32], uint64_t keys, float sc, int qc,
                                             float& m0, float& m1, float& l0, float& l1,
                                             float (&o0)[32], float (&o1)[32],
                                             uint32_t (&ph)[4][4], uint32_t (&pl)[4][4]) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
  if (keys == ~0ull) {  // every key of the tile (uniform over the warp): no mask
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sv[4 * j + e] *= sc, sv[4 * j + 2 + e] *= sc;
        mx0 = fmaxf(mx0, sv[4 * j + e]);
        mx1 = fmaxf(mx1, sv[4 * j + 2 + e]);
      }
  } else {
    const uint64_t kq = keys >> qc;  // bit 8j + e: key 8j + qc + e (constant shifts below)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = (kq >> (8 * j + e)) & 1u;
        sv[4 * j + e] = ok ? sv[4 * j + e] * sc : -INFINITY;
        sv[4 * j + 2 + e] = ok ? sv[4 * j + 2 + e] * sc : -INFINITY;
        mx0 = fmaxf(mx0, sv[4 * j + e]);
        mx1 = fmaxf(mx1, sv[4 * j + 2 + e]);
      }
  }
  quad_max2(mx0, mx1);
  // A row with no key so far and none here keeps m = −inf: its exponents are taken against 0
  // (p = 0, O and l stay 0). A row with none here: c = 1, p = 0, nothing changes.
  const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
  const float b0 = mn0 == -INFINITY ? 0.f : mn0, b1 = mn1 == -INFINITY ? 0.f : mn1;
  const float c0 = fast_exp2(m0 - b0), c1 = fast_exp2(m1 - b1);
  float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sv[4 * j] = fast_exp2(sv[4 * j] - b0), sv[4 * j + 1] = fast_exp2(sv[4 * j + 1] - b0);
    sv[4 * j + 2] = fast_exp2(sv[4 * j + 2] - b1), sv[4 * j + 3] = fast_exp2(sv[4 * j + 3] - b1);
    sum0 += sv[4 * j] + sv[4 * j + 1];
    sum1 += sv[4 * j + 2] + sv[4 * j + 3];
  }
  quad_sum2(sum0, sum1);
  l0 = l0 * c0 + sum0, l1 = l1 * c1 + sum1;
  m0 = mn0, m1 = mn1;
  // The running maxima rarely rise after a row's first tiles: when no row of the warp's did
  // (every c is 1, so the product would not change O), the 64 multiplications are skipped.
  if (__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f)) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {  // o[2j], o[2j + 1]: row h = j & 1
      o0[2 * j] *= (j & 1) ? c1 : c0, o0[2 * j + 1] *= (j & 1) ? c1 : c0;
      o1[2 * j] *= (j & 1) ? c1 : c0, o1[2 * j + 1] *= (j & 1) ? c1 : c0;
    }
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float a = sv[4 * (2 * kk + (r >> 1)) + 2 * (r & 1)];
      const float b = sv[4 * (2 * kk + (r >> 1)) + 2 * (r & 1) + 1];
      ph[kk][r] = pack_bf16(a, b);
      pl[kk][r] = pack_bf16(a - rb(a), b - rb(b));
    }
}

// A tile that kWarpTileUsers or fewer rows of a warpgroup selected (3: all but the tiles that
// all 4 rows selected, such as the forced local window's) is computed by each of those rows'
// warps alone with mma.sync (m16 = its row's 16 heads) on the same ring slot:
// a wgmma would compute all 4 rows on the tensor cores of all 4 SM sub-partitions, while
// each warp's mma.sync runs on its own sub-partition's, beside the other rows' warps. Warp w's
// wgmma accumulator rows (16w ..) are an m16n8 C fragment per 8 columns, so the same o0 / o1,
// softmax_step and P fragments serve both paths.
constexpr int kWarpTileUsers = 3;

// S = Q·Kᵀ for warp w's 16 query rows (Q rows 16w .. of q_a) and the 64 keys of k_a (both
// [2][64][64] 128-byte-swizzled halves), then softmax_step, then O += P·V from v_a: 64 + 128
// mma.sync m16n8k16 (P as hi + lo terms, as the wgmma path), 72 ldmatrix.
__device__ __forceinline__ void warp_tile(uint32_t q_a, uint32_t k_a, uint32_t v_a, int w,
                                          int lane, uint64_t keys, float sc, int qc, float& m0,
                                          float& m1, float& l0, float& l1, float (&o0)[32],
                                          float (&o1)[32]) {
  float sv[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) sv[i] = 0.f;
  // ldmatrix row addresses: lane l gives row (l & 15) of Q's 16 rows / key (l & 7) + 8·(l >> 4)
  // of a 16-key pair, at 16-byte chunk 2ks + (l >> 4) / 2ks + ((l >> 3) & 1). sw_off of such a
  // chunk is (ks >> 2) · 8 KB + row · 128 + ((2·(ks & 3)) ^ x) · 16 with x = the lane's chunk
  // bit ^ (row & 7) (row & 7 = l & 7 for the keys): 4 per-lane offsets per operand, so that
  // each ldmatrix takes a register and a constant offset.
  const int qr = 16 * w + (lane & 15), kr = (lane & 7) + ((lane >> 4) << 3);
  const uint32_t xq = uint32_t((lane >> 4) ^ (qr & 7));
  const uint32_t xk = uint32_t(((lane >> 3) & 1) ^ (lane & 7));
  uint32_t qa[4], ka[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    qa[k] = q_a + qr * 128 + (((2u * k) ^ xq) << 4);
    ka[k] = k_a + kr * 128 + (((2u * k) ^ xk) << 4);
  }
  // Each k-step's fragments are loaded before its MMAs, and no MMA follows one on the same
  // accumulator: with 2 consumer warps per scheduler, an MMA waiting on a load or on the MMA
  // before it stalls the sub-partition's tensor core.
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a[4], b[4][4];
    ldsm_x4(a, qa[ks & 3] + (ks >> 2) * kHalfBytes);
#pragma unroll
    for (int np = 0; np < 4; ++np) ldsm_x4(b[np], ka[ks & 3] + (ks >> 2) * kHalfBytes + np * 2048);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      mma16816(&sv[8 * np], a, b[np][0], b[np][1]);
      mma16816(&sv[8 * np + 4], a, b[np][2], b[np][3]);
    }
  }
  uint32_t ph[4][4], pl[4][4];
  softmax_step(sv, keys, sc, qc, m0, m1, l0, l1, o0, o1, ph, pl);
  // V (keys x d) by ldmatrix.trans: lane l gives key 16kk + (l & 7) + 8·((l >> 3) & 1) at
  // chunk 2p + (l >> 4): b[p][0], b[p][1] are n-block 2p's B fragment, b[p][2], b[p][3] n-block
  // 2p + 1's. Per k-step and half of d: 4 loads, 8 MMAs with P's hi terms, 8 with its lo terms.
  const int vr = (lane & 7) + (((lane >> 3) & 1) << 3);
  const uint32_t xv = uint32_t((lane >> 4) ^ (lane & 7));
  uint32_t va[4];  // chunk 2p + (l >> 4) of key vr: the same offsets as above
#pragma unroll
  for (int p = 0; p < 4; ++p) va[p] = v_a + vr * 128 + (((2u * p) ^ xv) << 4);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float* o = hf == 0 ? o0 : o1;
      uint32_t b[4][4];
#pragma unroll
      for (int p = 0; p < 4; ++p) ldsm_x4_trans(b[p], va[p] + hf * kHalfBytes + kk * 2048);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        mma16816(&o[8 * p], ph[kk], b[p][0], b[p][1]);
        mma16816(&o[8 * p + 4], ph[kk], b[p][2], b[p][3]);
      }
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        mma16816(&o[8 * p], pl[kk], b[p][0], b[p][1]);
        mma16816(&o[8 * p + 4], pl[kk], b[p][2], b[p][3]);
      }
    }
}
#endif

// kTma: the producers load by TMA over km / vm (bf16: produce_tma; FP8 caches, KF:
// produce_tma_fp8); else produce's cp.async over kc / vc (bf16 only).
template <int KF, bool kTma>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_attn_sm90_kernel(const bf16* __restrict__ q, StepRows R, const int2* __restrict__ tiles,
                            const bf16* __restrict__ kc, const bf16* __restrict__ vc,
                            const __grid_constant__ CUtensorMap km,
                            const __grid_constant__ CUtensorMap vm,
                            const int32_t* __restrict__ sel, const int32_t* __restrict__ sel_cnt,
                            SparseAttnParams P, bf16* __restrict__ out) {
  static_assert(KF == kKvAct || kTma, "FP8 caches are loaded by TMA only");
#ifdef SALA_SM90A_DEVICE
  pdl_begin();  // launch_pdl: before any read or write
  constexpr int kSlots = kSlotsOf<KF>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // The swizzle is of address bits: the ring and Q start 1024-byte aligned.
  unsigned char* ring = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* qs = ring + kSlots * kSlotBytes;                         // [kGroups][64][128]
  unsigned char* staging = qs + kGroups * kQBytes;  // FP8: [kStages][K codes | V codes]
  constexpr int kStaging = KF == kKvAct ? 0 : kStages * kStageBytes;
  uint32_t* rbits = reinterpret_cast<uint32_t*>(staging + kStaging);      // [kRows][nb_words]
  uint32_t* ubits = rbits + kRows * P.nb_words;                           // [nkt_words]
  int32_t* list = reinterpret_cast<int32_t*>(ubits + P.nkt_words);       // [list_cap]
  uint8_t* need = reinterpret_cast<uint8_t*>(list + P.list_cap);  // [list_cap]: rows' bits
  __shared__ uint64_t full[kSlots], empty[kSlots], staged[kStages];

  const int2 tile = tiles[blockIdx.x];
  const DevSeq s = R.seqs[R.row_seq[tile.x]];
  if (!s.sparse || s.split_row >= 0) return;  // the mma.sync kernel's rows
  const CacheGeom& G = P.g;
  const int g = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int slot_row = warp - 4;  // consumer warps 4 .. 11: rows 0 .. 7 of the tile
  const bool active = slot_row >= 0 && slot_row < tile.y;
  const int64_t row = tile.x + (active ? slot_row : 0);
  const long long t = s.past_len + (row - s.token_begin), L = s.past_len + s.num_tokens;
  if (tid < kSlots) {
    // bf16 TMA: one arrival with the tile's bytes; else one per producer thread.
    mbar_init(&full[tid], kTma && KF == kKvAct ? 1 : 128);
    mbar_init(&empty[tid], kRows);  // one per consumer warp
    if (tid < kStages) mbar_init(&staged[tid], 1);
    // The barriers' init visible to the async proxy (TMA's complete_tx) too.
    if constexpr (kTma) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  const int n_list =
      tile_union<kThreads>(rbits, P.nb_words, kRows, ubits, list, L, G, g, sel, sel_cnt,
                           P.total_topk, UnionRow{active ? slot_row : -1, false, row, t});
  const int bs_log2 = (G.bs & (G.bs - 1)) == 0 ? __ffs(G.bs) - 1 : -1;
  {
    // Bit r of need[i]: row r attends a key of the list's tile i (the mask its warp computes).
    const long long t0 = s.past_len + (tile.x - s.token_begin);
    for (int i = tid; i < n_list; i += kThreads) {
      uint32_t m = 0;
      for (int r = 0; r < tile.y; ++r)
        if (tile_keys(rbits + r * P.nb_words, list[i], G.bs, bs_log2, int(t0 + r))) m |= 1u << r;
      need[i] = uint8_t(m);
    }
  }
  __syncthreads();

  if (warp < 4) {
    if constexpr (KF != kKvAct) {
      produce_tma_fp8<KF>(list, n_list, ring, staging, full, empty, staged, &km, &vm,
                          R.page_table + s.page_begin, G.page_size, g);
      return;
    } else if constexpr (kTma) {
      if (tid == 0)
        produce_tma(list, n_list, ring, full, empty, &km, &vm, R.page_table + s.page_begin,
                    G.page_size, g);
      return;
    }
    produce(list, n_list, ring, full, empty, kc, vc, G, R.page_table + s.page_begin, g, L);
    return;
  }

  // Consumers: warpgroup cg = rows 4cg .. 4cg + 3; its warp w = row 4cg + w, whose 16 heads
  // are the warpgroup's m rows 16w .. 16w + 15.
  const int cg = slot_row / kGroupRows;
  unsigned char* Qg = qs + cg * kQBytes;
  for (int e = tid - 128 * (cg + 1); e < 64 * 16; e += 128) {
    const int m = e >> 4, c = e & 15, r = cg * kGroupRows + (m >> 4);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < tile.y)
      v = *reinterpret_cast<const uint4*>(
          q + ((int64_t(tile.x) + r) * P.nh + g * 16 + (m & 15)) * kD + c * 8);
    *reinterpret_cast<uint4*>(Qg + sw_off(m, c)) = v;
  }
  fence_proxy_async_smem();
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cg) : "memory");  // this warpgroup's Q stored

  float o0[32], o1[32];  // O, columns 0-63 and 64-127
#pragma unroll
  for (int i = 0; i < 32; ++i) o0[i] = o1[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows lane/4 and lane/4 + 8
  const float sc = P.tau * kLog2e;
  const int qc = (lane % 4) * 2;
  const uint32_t* mybits = rbits + slot_row * P.nb_words;
  const uint32_t ring_a = smem_addr(ring), q_a = smem_addr(Qg);
  const int w = slot_row % kGroupRows;

  // Every entry of the list, in order: waited for; computed by the warpgroup (wgmma) if more
  // than kWarpTileUsers of its rows attend a key of it, else by those rows' warps (mma.sync);
  // released.
  for (int i = 0; i < n_list; ++i) {
    const int slot = i % kSlots;
    mbar_wait(&full[slot], uint32_t(i / kSlots) & 1u);
    const uint32_t users = (uint32_t(need[i]) >> (kGroupRows * cg)) & 0xFu;
    const uint32_t k_a = ring_a + slot * kSlotBytes, v_a = k_a + kTileBytes;
    if (__popc(users) <= kWarpTileUsers) {  // uniform over the warp
      if ((users >> w) & 1u)
        warp_tile(q_a, k_a, v_a, w, lane, tile_keys(mybits, list[i], G.bs, bs_log2, int(t)), sc,
                  qc, m0, m1, l0, l1, o0, o1);
    } else {  // uniform over the warpgroup
      float sv[32];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
        const uint32_t off = (ks >> 2) * kHalfBytes + (ks & 3) * 32;
        wgmma_m64n64k16(sv, smem_desc_sw128(q_a + off), smem_desc_sw128(k_a + off), ks > 0);
      }
      wgmma_commit();
      wgmma_wait_all();
      fence_operands(sv);
      const uint64_t keys = active ? tile_keys(mybits, list[i], G.bs, bs_log2, int(t)) : 0ull;
      uint32_t ph[4][4], pl[4][4];
      softmax_step(sv, keys, sc, qc, m0, m1, l0, l1, o0, o1, ph, pl);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t vk = v_a + kk * 2048;  // keys 16kk ..: two 8-row groups of 1 KB
        wgmma_m64n64k16_rs_mn(o0, ph[kk], smem_desc_sw128_mn64(vk));
        wgmma_m64n64k16_rs_mn(o0, pl[kk], smem_desc_sw128_mn64(vk));
        wgmma_m64n64k16_rs_mn(o1, ph[kk], smem_desc_sw128_mn64(vk + kHalfBytes));
        wgmma_m64n64k16_rs_mn(o1, pl[kk], smem_desc_sw128_mn64(vk + kHalfBytes));
      }
      wgmma_commit();
      wgmma_wait_all();
      fence_operands(o0);
      fence_operands(o1);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
  }
  if (!active) return;

  // Rows lane/4 and lane/4 + 8 of this warp: heads 16g + lane/4 (+ 8) of its row.
  // FP8 caches (and their bf16 shadow): O was summed over V's code values; bf16 caches: 1.
  const float vs = P.v_scale;
  const float i0 = vs / l0, i1 = vs / l1;
  bf16* o_h0 = out + (row * P.nh + g * 16 + lane / 4) * kD + qc;
  bf16* o_h1 = o_h0 + 8 * kD;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    *reinterpret_cast<uint32_t*>(o_h0 + 8 * j) = pack_bf16(o0[4 * j] * i0, o0[4 * j + 1] * i0);
    *reinterpret_cast<uint32_t*>(o_h1 + 8 * j) = pack_bf16(o0[4 * j + 2] * i1, o0[4 * j + 3] * i1);
    *reinterpret_cast<uint32_t*>(o_h0 + 64 + 8 * j) =
        pack_bf16(o1[4 * j] * i0, o1[4 * j + 1] * i0);
    *reinterpret_cast<uint32_t*>(o_h1 + 64 + 8 * j) =
        pack_bf16(o1[4 * j + 2] * i1, o1[4 * j + 3] * i1);
  }
#endif
}

}  // namespace

bool sparse_attn_sm90_supported(int d, int q_heads_per_kv_head) {
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    return major == 9;
  }();
  return sm90 && d == kD && q_heads_per_kv_head == 16;
}

size_t sparse_attn_sm90_smem_bytes(const SparseAttnParams& p) {
  const size_t staging = p.kv_fmt != kKvAct ? size_t(kStages) * kStageBytes : 0;
  const size_t bits = (size_t(kRows) * p.nb_words + size_t(p.nkt_words)) * 4;
  return fixed_smem(p.kv_fmt != kKvAct) + staging + bits + size_t(p.list_cap) * 5;  // list + need
}

bool make_sparse_attn_sm90_maps(const void* kc, const void* vc, int64_t tokens, int kvh,
                                int page_size, int kv_fmt, Sm90KvMaps* out) {
  static_assert(sizeof(CUtensorMap) == sizeof(out->k));
  if (!sparse_attn_sm90_supported(kD, 16) || !tma_encode_fn() || page_size % kKT != 0 ||
      tokens > (int64_t(1) << 31) - 1 || reinterpret_cast<uintptr_t>(kc) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(vc) % 16 != 0)
    return false;
  // Boxes of 64 tokens x 128 bytes: 64 bf16 columns (half a head), or a head's 128 codes.
  const int64_t cols = int64_t(kvh) * kD;
  const bool fp8 = kv_fmt != kKvAct;
  const auto dt = fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const int esize = fp8 ? 1 : 2, box = 128 / esize;
  const CUtensorMap k = make_tma_map_2d(kc, dt, tokens, cols, cols * esize, box, kKT);
  const CUtensorMap v = make_tma_map_2d(vc, dt, tokens, cols, cols * esize, box, kKT);
  std::memcpy(out->k, &k, sizeof(k));
  std::memcpy(out->v, &v, sizeof(v));
  return true;
}

void launch_sparse_attention_sm90(const bf16* q, const StepRows& s, const int2* tiles,
                                  int n_tiles, const void* kc, const void* vc,
                                  const Sm90KvMaps* maps, const int32_t* sel,
                                  const int32_t* sel_cnt, const SparseAttnParams& p, bf16* out,
                                  cudaStream_t st) {
  if (n_tiles <= 0) return;
  if (p.kv_fmt != kKvAct && !maps) {
    std::fprintf(stderr, "%s:%d: the wgmma stage-2 kernel reads FP8 caches by TMA only\n",
                 __FILE__, __LINE__);
    std::abort();
  }
  const size_t smem = sparse_attn_sm90_smem_bytes(p);
  CUtensorMap km{}, vm{};
  if (maps) {
    std::memcpy(&km, maps->k, sizeof(km));
    std::memcpy(&vm, maps->v, sizeof(vm));
  }
  auto go = [&](auto kernel, SmemOptIn& optin) {
    optin.raise(kernel, smem);
    launch_pdl(kernel, dim3(unsigned(n_tiles), unsigned(p.g.kvh)), kThreads, smem, st, q, s,
               tiles, static_cast<const bf16*>(kc), static_cast<const bf16*>(vc), km, vm, sel,
               sel_cnt, p, out);
    CUDA_CHECK_LAUNCH();
  };
  static SmemOptIn smem_tma, smem_cp, smem_e4m3, smem_e5m2;  // per kernel and device
  if (p.kv_fmt == kKvE4m3)
    go(sparse_attn_sm90_kernel<kKvE4m3, true>, smem_e4m3);
  else if (p.kv_fmt == kKvE5m2)
    go(sparse_attn_sm90_kernel<kKvE5m2, true>, smem_e5m2);
  else if (maps)
    go(sparse_attn_sm90_kernel<kKvAct, true>, smem_tma);
  else
    go(sparse_attn_sm90_kernel<kKvAct, false>, smem_cp);
}

}  // namespace sala::cuda
