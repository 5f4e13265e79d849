// InfLLM-v2 stage 2 on the tensor cores (SPEC §9.6): attention of each sparse row over the
// keys of its selected blocks (causal: keys p ≤ t). One block per (tile of ≤ 8 rows of one
// sequence, KV head, split); consumer warp w owns row w's 16 query heads as the 16 rows of
// mma m16n8k16. The block walks the union of its rows' selected blocks in 64-key tiles
// (ascending), each K/V tile loaded once into a ring of kSlots shared-memory slots by four
// producer warps (cp.async; rows unpadded with the 16-byte chunks XOR-swizzled by row, so
// ldmatrix is conflict-free). Slots are handed over by mbarriers (full: the tile landed;
// empty: every consumer is done with it), not by block-wide barriers: with the rows'
// selections unrelated, a row needs only ≈ 1 in 4 tiles of the union, and each consumer runs
// through the tiles it skips while slower ones still compute, up to kSlots tiles apart
// (one __syncthreads per tile would make every tile cost what its slowest row spends on it).
// A warp computes only on the tiles its own row selected, masking keys of unselected blocks
// (blocks smaller than 64 keys) and keys after the row. fp32 scores and online softmax in
// log2 units; P·V with P split in two bf16 terms (hi + lo) as the dense prefill kernel, so
// the probabilities are not rounded to bf16 (golden README §4). Rows of split calls
// (decode and verify rows, DevSeq::split_row) divide the union into P.splits parts of
// consecutive tiles, whose partials (acc, m, l) merge in combine_kernel. A tile of one such
// row (decode rows; verify rows in steps of <= 16 rows, which must compute a decode row's
// bits): a block computes P.spb of its parts, one per consumer warp, with the parts' tiles
// interleaved in the ring (tile j of each of its parts, then tile j + 1), so its warps compute
// at once. The parts, and so the numbers, do not depend on spb: the launcher picks it from the
// step's row count only to fill the GPU (a decode row with one warp per block and one block
// per SM left most SMs waiting on memory latency at batch 64). A tile of several rows of a
// split call (verify calls of wide steps, StepDev::shared_tiles; spb 1): block z computes part
// z of the tile's union for each of its rows, every K/V tile loaded once for them (a row's
// parts then follow the tile's union, not its own list).
// Dense rows of short calls (decode below dense_len) run here too, as rows that selected
// every block up to their own (SparseAttnParams::dense_below), on the tensor cores rather
// than the scalar attention_kernel.
// FP8 KV caches (KF): the producers load 16 codes per 16-byte chunk (the next tile's while
// they convert this one) and store their exact bf16 values, so the consumers' code is the
// bf16 one; the K scale is part of P.tau, the V scale multiplies O once at the end
// (SparseAttnParams::kv_fmt, v_scale).
#include "backend/cuda/cuda_infllm_attn.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {

using namespace stage2;

constexpr int kW = kSparseTileRows;  // consumer warps, one per row
constexpr int kProducers = 4;        // warps kW .. kW + 3 load the K and V tiles
constexpr int kThreads = (kW + kProducers) * 32;
constexpr int kSlots = 4;  // ring of K/V tiles in shared memory (32 KB each at d = 128)

// Element offset of (row j, column x) in a smem tile of rows of D bf16: 16-byte chunk c of
// row j is stored at chunk c ^ (j mod min(D/8, 8)).
template <int D>
__device__ __forceinline__ int swz(int j, int x) {
  constexpr int CH = D / 8, M = (CH < 8 ? CH : 8) - 1;
  return j * D + (((x >> 3) ^ (j & M)) << 3) + (x & 7);
}

template <int D, int KF>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_attn_kernel(const bf16* q, StepRows R, const int2* __restrict__ tiles,
                       const KvElem<KF>* kc, const KvElem<KF>* vc, const int32_t* sel,
                       const int32_t* sel_cnt, SparseAttnParams P, bf16* __restrict__ out,
                       float* __restrict__ part, float* __restrict__ ml) {
  // launch_pdl. What this block reads before pdl_wait() is the step's metadata (tiles, rows,
  // sequences, pages: copied by the host before the step's first kernel) and K/V codes of keys
  // before the sequence's past_len (written by earlier steps); q, the selections and this
  // step's keys come from kernels of this step, read after it, as is every write. So q, kc,
  // vc, sel and sel_cnt carry no __restrict__: restrict loads may be moved above the wait
  // (docs/ARCHITECTURE.md, PDL).
  pdl_trigger();
  constexpr int kBuf = kKT * D;  // elements of one K (or V) tile
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);                     // [kSlots][kKT][D]
  bf16* Vs = Ks + kSlots * kBuf;                                    // [kSlots][kKT][D]
  bf16* Qs = Vs + kSlots * kBuf;                                    // [kW][16][D]
  uint32_t* wbits = reinterpret_cast<uint32_t*>(Qs + kW * 16 * D);  // [kW][nb_words]
  uint32_t* ubits = wbits + kW * P.nb_words;                        // [nkt_words]
  int32_t* list = reinterpret_cast<int32_t*>(ubits + P.nkt_words);  // [list_cap]
  __shared__ uint64_t full[kSlots], empty[kSlots];

  const int2 tile = tiles[blockIdx.x];
  const int si = R.row_seq[tile.x];
  const DevSeq s = R.seqs[si];
  const bool dense = !s.sparse;  // a dense row: every block up to its own (SPEC §9.1)
  if (dense && s.num_tokens >= P.dense_below) return;
  // Only rows of split calls (DevSeq::split_row) split (see launch_attention). A tile of one
  // such row: parts split0 .. split0 + ncons - 1 here, one per consumer warp (decode). A tile
  // of several (StepDev::shared_tiles, P.spb == 1): part blockIdx.z for each of its rows,
  // consumer warp = row. Other calls: one part, consumer warp = row.
  const bool split_call = s.split_row >= 0;
  if (P.sm90_prefill_rows && !dense && !split_call) return;  // sparse_attn_sm90_kernel's
  const bool decode = split_call && tile.y == 1;  // parts per consumer warp
  const int g = blockIdx.y, nsplit = split_call ? P.splits : 1;
  const int split0 = decode ? int(blockIdx.z) * P.spb : int(blockIdx.z);
  if (split0 >= nsplit) return;
  const int ncons = decode ? min(P.spb, nsplit - split0) : tile.y;  // consumer warps
  const CacheGeom& G = P.g;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int qr = lane / 4, qc = (lane % 4) * 2;
  const bool active = warp < ncons;  // a consumer warp with a row (decode: with a part)
  const int bs_log2 = (G.bs & (G.bs - 1)) == 0 ? __ffs(G.bs) - 1 : -1;
  const int64_t row = tile.x + (active && !decode ? warp : 0);
  const long long t = s.past_len + (row - s.token_begin), L = s.past_len + s.num_tokens;
  const int32_t* pages = R.page_table + s.page_begin;
  const uint32_t* mybits = wbits + (warp < kW ? warp : 0) * P.nb_words;

  // 1. The rows' selections as bitmaps, and the union of their key tiles. A dense row's union
  // follows from the metadata alone: built while the kernels before this one finish. A sparse
  // row's selections are this step's top-k output.
  if (!dense) pdl_wait();
  if (tid < kSlots) {
    mbar_init(&full[tid], kProducers * 32);  // one cp.async arrival per producer thread
    mbar_init(&empty[tid], ncons);           // one arrival per consumer warp
  }
  const int n_list = tile_union<kThreads>(wbits, P.nb_words, kW, ubits, list, L, G, g, sel,
                                          sel_cnt, P.total_topk,
                                          UnionRow{active ? warp : -1, dense, row, t});
  // Ring entries (j, w) in the order j = 0, 1, ..., w = 0 .. nw − 1 within each j: tile j of
  // part split0 + w, list index first + w·per + j (split calls: parts of per consecutive
  // tiles; other calls: one part, the whole list). Entries past the list take no slot; q
  // counts those that do. (j, w) advance without a division: the loop runs once per tile.
  const int per = split_call ? (n_list + nsplit - 1) / nsplit : n_list;
  const int nw = decode ? ncons : 1, first = split_call ? split0 * per : 0;

  // 2a. Producers: the q-th entry with a tile goes to slot q mod kSlots once every consumer
  // has released the tile that held the slot before. Producer warp p copies half p / 2 of
  // the tile's 64 key rows of K (p even) or V (p odd); lane l always copies the same 16-byte
  // chunk of its rows (bf16: chunk l mod D/8 of the values; FP8: of the codes), so a row is
  // one contiguous run per warp instruction and the loop is a fixed, unrolled count (a
  // per-element copy costs many instructions per tile, and the consumers wait on it).
  if (warp >= kW) {
    constexpr int kHalf = kKT / 2;
    const int pw = warp - kW;
    const KvElem<KF>* src = (pw & 1) ? vc : kc;
    bf16* dst0 = (pw & 1) ? Vs : Ks;
    const bool one_page = G.page_size % kKT == 0;  // a tile's keys are consecutive rows of one page
    if constexpr (KF == kKvAct) {
      pdl_wait();  // (only the FP8 path below requests a tile before the wait)
      constexpr int CH = D / 8, kStep = 32 / CH;
      const int j0 = (pw >> 1) * kHalf + lane / CH, c = lane % CH;
      for (int j = 0, w = 0, q = 0; j < per; w + 1 < nw ? ++w : (w = 0, ++j)) {
        const int i = first + w * per + j;
        if (i >= n_list) continue;
        const int slot = q % kSlots;
        if (q >= kSlots) mbar_wait(&empty[slot], uint32_t(q / kSlots - 1) & 1u);
        bf16* dst = dst0 + slot * kBuf;
        const long long p0 = 1LL * list[i] * kKT;  // < L: the union holds only tiles with keys ≤ t
        const bf16* s0 = src + token_off(G, pages, p0) + int64_t(g) * D + c * 8;
#pragma unroll
        for (int k = 0; k < kHalf / kStep; ++k) {
          const int j = j0 + k * kStep;
          const bool ok = p0 + j < L;
          const bf16* sp = !ok        ? s0
                           : one_page ? s0 + j * G.row
                                      : src + token_off(G, pages, p0 + j) + int64_t(g) * D + c * 8;
          cp_async16(dst + swz<D>(j, c * 8), sp, ok ? 16 : 0);
        }
        mbar_arrive_cp_async(&full[slot]);
        ++q;
      }
      cp_async_wait_all();
    } else {
      // FP8: lane l loads 16 codes (chunk c = l mod D/16) of rows j0, j0 + kStep, ... into
      // registers, converts them to their exact bf16 values (unscaled) and stores them; the
      // arrival releases the stores. The next tile's codes are loaded before this tile waits
      // for its slot and converts, so their memory latency passes under that work (one
      // dependent DRAM round trip per tile otherwise: a decode part's tiles come in turn).
      // The same values land in the same places as 8-code loads would put them.
      constexpr int CH = D / 16, kStep = 32 / CH, kN = kHalf / kStep;
      const int j0 = (pw >> 1) * kHalf + lane / CH, c = lane % CH;
      int jj = 0, ww = 0;  // the ring order's next entry (j, w), as the bf16 loop walks it
      auto next_entry = [&]() {
        while (jj < per) {
          const int i = first + ww * per + jj;
          ww + 1 < nw ? ++ww : (ww = 0, ++jj);
          if (i < n_list) return i;
        }
        return -1;
      };
      auto load_tile = [&](int i, uint4 (&cw)[kN]) {
        const long long p0 = 1LL * list[i] * kKT;  // < L: the union holds only tiles with keys ≤ t
        const KvElem<KF>* s0 = src + token_off(G, pages, p0) + int64_t(g) * D + c * 16;
#pragma unroll
        for (int k = 0; k < kN; ++k) {
          const int j = j0 + k * kStep;
          const bool ok = p0 + j < L;
          const KvElem<KF>* sp = !ok        ? s0
                                 : one_page ? s0 + j * G.row
                                            : src + token_off(G, pages, p0 + j) + int64_t(g) * D +
                                                  c * 16;
          cw[k] = ok ? *reinterpret_cast<const uint4*>(sp) : make_uint4(0u, 0u, 0u, 0u);
        }
      };
      uint4 cur[kN], nxt[kN];
      int i = next_entry();
      // The first tile's codes are requested before the wait when every key of it predates
      // the step, so their DRAM latency passes under the kernels before this one. Plain
      // loads: no __restrict__, so none moves above the wait (volatile asm loads made B=64
      // 4.5 % slower: H100, session 52), and cached in L1, so no line fetched early may hold
      // a byte that a kernel of this step writes: only where pages are whole 128-byte lines
      // (a page's 64-key tiles are then whole lines too: rows of >= 16 bytes).
      const bool line_pages = int64_t(G.page_size) * G.row * int64_t(sizeof(*src)) % 128 == 0;
      const bool early = line_pages && i >= 0 && (1LL * list[i] + 1) * kKT <= s.past_len;
      if (early) load_tile(i, nxt);
      pdl_wait();
      if (i >= 0 && !early) load_tile(i, nxt);
      for (int q = 0; i >= 0; ++q) {
#pragma unroll
        for (int k = 0; k < kN; ++k) cur[k] = nxt[k];
        const int i2 = next_entry();
        if (i2 >= 0) load_tile(i2, nxt);
        const int slot = q % kSlots;
        if (q >= kSlots) mbar_wait(&empty[slot], uint32_t(q / kSlots - 1) & 1u);
        bf16* dst = dst0 + slot * kBuf;
#pragma unroll
        for (int k = 0; k < kN; ++k) {
          const int j = j0 + k * kStep;
          *reinterpret_cast<uint4*>(dst + swz<D>(j, c * 16)) =
              kv_codes8_bf16<KF>(make_uint2(cur[k].x, cur[k].y));
          *reinterpret_cast<uint4*>(dst + swz<D>(j, c * 16 + 8)) =
              kv_codes8_bf16<KF>(make_uint2(cur[k].z, cur[k].w));
        }
        mbar_arrive(&full[slot]);
        i = i2;
      }
    }
    return;
  }
  if (!active) return;

  // 2b. Consumers: online softmax over the tiles. This warp's 16 query rows (heads
  // 16 g .. 16 g + 15 of its row) in shared memory, re-read as A fragments by ldmatrix: with
  // 12 warps a block, 3 share a register file quarter, so a thread gets ≤ 168 registers,
  // and O (64), S (32) and the fragments need them.
  bf16* Qw = Qs + warp * 16 * D;
  pdl_wait();  // q, and every write below
  {
    const bf16* base = q + row * int64_t(P.nh) * D + int64_t(g) * 16 * D;
    for (int e = lane; e < 16 * D / 8; e += 32) {
      const int r = e / (D / 8), c = e % (D / 8);
      *reinterpret_cast<uint4*>(Qw + swz<D>(r, c * 8)) =
          *reinterpret_cast<const uint4*>(base + r * D + c * 8);
    }
    __syncwarp();
  }
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float sc = P.tau * kLog2e;
  const int mi = lane / 8, ri = lane % 8;
  // Shared-memory addresses of this lane's ldmatrix rows (swz: 16-byte chunk c of row j at
  // chunk c ^ (j & SW)); every row a lane addresses has j & 7 = ri (the Q rows: lane & 7), so
  // chunk 2·ks + h (or n + h) lands at (2·ks) ^ x (n ^ x) with the lane constant x = h ^ (ri & SW).
  constexpr int SW = (D / 8 < 8 ? D / 8 : 8) - 1;
  const uint32_t full_a = smem_addr(full), empty_a = smem_addr(empty);
  const uint32_t q_lane = smem_addr(Qw) + ((lane & 7) + ((lane >> 3) & 1) * 8) * D * 2;
  const uint32_t q_x = (lane >> 4) ^ (ri & SW);
  const uint32_t k_lane = smem_addr(Ks) + ((mi >> 1) * 8 + ri) * D * 2, k_x = (mi & 1) ^ (ri & SW);
  const uint32_t v_lane = smem_addr(Vs) + ((mi & 1) * 8 + ri) * D * 2, v_x = (mi >> 1) ^ (ri & SW);

  for (int j = 0, w = 0, q = 0; j < per; w + 1 < nw ? ++w : (w = 0, ++j)) {
    const int i = first + w * per + j;
    if (i >= n_list) continue;
    const int slot = q % kSlots;
    const uint64_t keys =
        !decode || w == warp ? tile_keys(mybits, list[i], G.bs, bs_log2, int(t)) : 0ull;
    // Every consumer waits for the tile, needed or not, so that its release of this slot
    // can never count towards the slot's previous use.
    mbar_wait_at(full_a + 8 * slot, uint32_t(q / kSlots) & 1u);
    if (keys) {
      const uint32_t Kb = k_lane + slot * kBuf * 2, Vb = v_lane + slot * kBuf * 2;
      // Two halves of 32 keys, each its own online-softmax update (S of a half is 16 fp32
      // registers: with all 64 keys at once the 168 registers spill).
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        const uint32_t hkeys = uint32_t(keys >> (32 * half));
        if (!hkeys) continue;
        // S = Q Kᵀ over the 32 keys: K fragments by ldmatrix (keys are the n dimension).
        float sv[4][4];
#pragma unroll
        for (int n = 0; n < 4; ++n) sv[n][0] = sv[n][1] = sv[n][2] = sv[n][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          uint32_t qa[4];
          ldsm_x4(qa, q_lane + (((2 * ks) ^ q_x) << 4));
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            uint32_t kb[4];
            ldsm_x4(kb, Kb + (32 * half + np * 16) * D * 2 + (((2 * ks) ^ k_x) << 4));
            mma16816(sv[2 * np], qa, kb[0], kb[1]);
            mma16816(sv[2 * np + 1], qa, kb[2], kb[3]);
          }
        }
        // mask: keys after the row, keys of blocks the row did not select
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const bool ok = (hkeys >> (n * 8 + qc + e)) & 1u;
            sv[n][e] = ok ? sv[n][e] * sc : -INFINITY;
            sv[n][e + 2] = ok ? sv[n][e + 2] * sc : -INFINITY;
            mx0 = fmaxf(mx0, sv[n][e]);
            mx1 = fmaxf(mx1, sv[n][e + 2]);
          }
        quad_max2(mx0, mx1);
        // The half holds a selected key ≤ t (hkeys != 0), so both maxima are finite.
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float c0 = fast_exp2(m0 - mn0), c1 = fast_exp2(m1 - mn1);  // 0 on the first update
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          sv[n][0] = fast_exp2(sv[n][0] - mn0), sv[n][1] = fast_exp2(sv[n][1] - mn0);
          sv[n][2] = fast_exp2(sv[n][2] - mn1), sv[n][3] = fast_exp2(sv[n][3] - mn1);
          sum0 += sv[n][0] + sv[n][1];
          sum1 += sv[n][2] + sv[n][3];
        }
        quad_sum2(sum0, sum1);
        l0 = l0 * c0 + sum0, l1 = l1 * c1 + sum1;
        m0 = mn0, m1 = mn1;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) o[n][0] *= c0, o[n][1] *= c0, o[n][2] *= c1, o[n][3] *= c1;
          // O += P V, P = hi + lo; V fragments by ldmatrix.trans (keys are the k dimension).
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const float* sa = sv[2 * kk];
          const float* sb = sv[2 * kk + 1];
          const uint32_t ph[4] = {pack_bf16(sa[0], sa[1]), pack_bf16(sa[2], sa[3]),
                                  pack_bf16(sb[0], sb[1]), pack_bf16(sb[2], sb[3])};
          const uint32_t pl[4] = {pack_bf16(sa[0] - rb(sa[0]), sa[1] - rb(sa[1])),
                                  pack_bf16(sa[2] - rb(sa[2]), sa[3] - rb(sa[3])),
                                  pack_bf16(sb[0] - rb(sb[0]), sb[1] - rb(sb[1])),
                                  pack_bf16(sb[2] - rb(sb[2]), sb[3] - rb(sb[3]))};
          const uint32_t vrow = Vb + (32 * half + kk * 16) * D * 2;
#pragma unroll
          for (int n = 0; n < D / 8; n += 2) {
            uint32_t bv[4];
            ldsm_x4_trans(bv, vrow + ((n ^ v_x) << 4));
            mma16816(o[n], ph, bv[0], bv[1]);
            mma16816(o[n], pl, bv[0], bv[1]);
            mma16816(o[n + 1], ph, bv[2], bv[3]);
            mma16816(o[n + 1], pl, bv[2], bv[3]);
          }
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive_at(empty_a + 8 * slot);
    ++q;
  }

  // 3. Output rows qr and qr + 8 (heads 16 g + qr, + 8).
  const int h0 = g * 16 + qr, h1 = h0 + 8;
  if constexpr (KF != kKvAct) {  // FP8: O was summed over the V code values
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      o[n][0] *= P.v_scale, o[n][1] *= P.v_scale, o[n][2] *= P.v_scale, o[n][3] *= P.v_scale;
  }
  if (nsplit == 1) {
    const float i0f = 1.f / l0, i1f = 1.f / l1;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(out + (row * P.nh + h0) * D + n * 8 + qc) =
          pack_bf16(o[n][0] * i0f, o[n][1] * i0f);
      *reinterpret_cast<uint32_t*>(out + (row * P.nh + h1) * D + n * 8 + qc) =
          pack_bf16(o[n][2] * i1f, o[n][3] * i1f);
    }
    return;
  }
  const int split = decode ? split0 + warp : split0;
  const int64_t srow = s.split_row + (row - s.token_begin);  // the row's partials slot
  const int64_t it0 = (srow * P.nh + h0) * nsplit + split;
  const int64_t it1 = (srow * P.nh + h1) * nsplit + split;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    *reinterpret_cast<float2*>(part + it0 * D + n * 8 + qc) = make_float2(o[n][0], o[n][1]);
    *reinterpret_cast<float2*>(part + it1 * D + n * 8 + qc) = make_float2(o[n][2], o[n][3]);
  }
  if (lane % 4 == 0) {  // combine_kernel works in natural-log units
    ml[2 * it0] = m0 == -INFINITY ? -INFINITY : m0 * kLn2, ml[2 * it0 + 1] = l0;
    ml[2 * it1] = m1 == -INFINITY ? -INFINITY : m1 * kLn2, ml[2 * it1 + 1] = l1;
  }
}

template <int D, int KF>
void launch_d(const bf16* q, const StepRows& s, const int2* tiles, int n_tiles, const void* kc,
              const void* vc, const int32_t* sel, const int32_t* sel_cnt, const SparseAttnParams& p,
              bf16* out, float* part, float* ml, cudaStream_t st) {
  const size_t smem = sparse_attn_smem_bytes(D, p);
  // The kernel's static shared memory counts against the opt-in limit too: ask for what
  // this launch needs, not the device maximum.
  static SmemOptIn optin;  // per device
  optin.raise(sparse_attn_kernel<D, KF>, smem);
  const unsigned gz = unsigned((p.splits + p.spb - 1) / p.spb);
  launch_pdl(sparse_attn_kernel<D, KF>, dim3(unsigned(n_tiles), unsigned(p.g.kvh), gz),
             kThreads, smem, st, q, s, tiles, static_cast<const KvElem<KF>*>(kc),
             static_cast<const KvElem<KF>*>(vc), sel, sel_cnt, p, out, part, ml);
  CUDA_CHECK_LAUNCH();
}

template <int KF>
auto launcher(int d) {
  return d == 16    ? launch_d<16, KF>
         : d == 32  ? launch_d<32, KF>
         : d == 64  ? launch_d<64, KF>
         : d == 128 ? launch_d<128, KF>
                    : nullptr;  // infllm_head_dim_supported() is checked at start
}

}  // namespace

size_t sparse_attn_smem_bytes(int d, const SparseAttnParams& p) {
  return (size_t(kSlots) * 2 * kKT + size_t(kW) * 16) * d * 2 +
         (size_t(kW) * p.nb_words + p.nkt_words + p.list_cap) * 4;
}

void launch_sparse_attention(int d, const bf16* q, const StepRows& s, const int2* tiles,
                             int n_tiles, const void* kc, const void* vc, const int32_t* sel,
                             const int32_t* sel_cnt, const SparseAttnParams& p, bf16* out,
                             float* part, float* ml, cudaStream_t st) {
  const auto launch = p.kv_fmt == kKvE4m3   ? launcher<kKvE4m3>(d)
                      : p.kv_fmt == kKvE5m2 ? launcher<kKvE5m2>(d)
                                            : launcher<kKvAct>(d);
  if (n_tiles > 0 && launch)
    launch(q, s, tiles, n_tiles, kc, vc, sel, sel_cnt, p, out, part, ml, st);
}

}  // namespace sala::cuda
