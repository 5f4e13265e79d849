// InfLLM-v2 stage 2 on the tensor cores (SPEC §9.6): attention of each sparse row over the
// keys of its selected blocks (causal: keys p ≤ t). One block per (tile of ≤ 8 rows of one
// sequence, KV head, split); warp w owns row w's 16 query heads as the 16 rows of
// mma m16n8k16. The block walks the union of its rows' selected blocks in 64-key tiles
// (ascending), loading each K/V tile once into shared memory (cp.async, two stages, one
// barrier per tile; rows unpadded with the 16-byte chunks XOR-swizzled by row, so fragment
// loads are conflict-free); the query fragments come from shared memory too, so a thread
// needs ≤ 128 registers and two blocks share an SM;
// a warp computes only on the tiles its own row selected, masking keys of unselected
// blocks (blocks smaller than 64 keys) and keys after the row. fp32 scores and online
// softmax in log2 units; P·V with P split in two bf16 terms (hi + lo) as the dense prefill
// kernel, so the probabilities are not rounded to bf16 (golden README §4; measured: the
// single-term bf16 P was not faster here, this kernel waits on loads, not on MMAs). With
// splits (decode) the union is divided among grid.z blocks and the partials (acc, m, l)
// merge in combine_kernel.
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_mma.cuh"

namespace sala::cuda {
namespace {

constexpr int kW = kSparseTileRows;
constexpr int kThreads = kW * 32;
constexpr int kKT = 64;  // keys per tile
constexpr int kStages = 2;

// Element offset of (row j, column x) in a smem tile of rows of D bf16: 16-byte chunk c of
// row j is stored at chunk c ^ (j mod min(D/8, 8)).
template <int D>
__device__ __forceinline__ int swz(int j, int x) {
  constexpr int CH = D / 8, M = (CH < 8 ? CH : 8) - 1;
  return j * D + (((x >> 3) ^ (j & M)) << 3) + (x & 7);
}
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The keys of 64-key tile kt that a row attends: bit j set iff key kt·64 + j is in a block
// of the row's selection (bits) and at or before the row's position t. 32-bit arithmetic
// only: this runs per warp per tile.
__device__ __forceinline__ uint64_t tile_keys(const uint32_t* bits, int kt, int bs, int t) {
  const int k0 = kt * kKT;
  uint64_t m = 0;
  if (bs >= kKT) {
    const int b = k0 / bs;
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

template <int D>
__global__ void __launch_bounds__(kThreads, 2) sparse_attn_kernel(
    const bf16* __restrict__ q, StepRows R, const int2* __restrict__ tiles,
    const bf16* __restrict__ kc, const bf16* __restrict__ vc, const int32_t* __restrict__ sel,
    const int32_t* __restrict__ sel_cnt, SparseAttnParams P, bf16* __restrict__ out,
    float* __restrict__ part, float* __restrict__ ml) {
  constexpr int kBuf = kKT * D;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);                          // [kStages][kKT][D]
  bf16* Vs = Ks + kStages * kBuf;                                        // [kStages][kKT][D]
  bf16* Qs = Vs + kStages * kBuf;                                        // [kW][16][D]
  uint32_t* wbits = reinterpret_cast<uint32_t*>(Qs + kW * 16 * D);       // [kW][nb_words]
  uint32_t* ubits = wbits + kW * P.nb_words;                             // [nkt_words]
  int32_t* list = reinterpret_cast<int32_t*>(ubits + P.nkt_words);       // [list_cap]
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int n_list;

  const int2 tile = tiles[blockIdx.x];
  const int si = R.row_seq[tile.x];
  const DevSeq s = R.seqs[si];
  if (!s.sparse) return;
  // Only one-token calls (decode) split over grid.z (see launch_attention).
  const int g = blockIdx.y, split = blockIdx.z, nsplit = s.num_tokens == 1 ? int(gridDim.z) : 1;
  if (split >= nsplit) return;
  const CacheGeom& G = P.g;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int qr = lane / 4, qc = (lane % 4) * 2;
  const bool active = warp < tile.y;
  const int64_t row = tile.x + (active ? warp : 0);
  const long long t = s.past_len + (row - s.token_begin), L = s.past_len + s.num_tokens;
  const int32_t* pages = R.page_table + s.page_begin;
  uint32_t* mybits = wbits + warp * P.nb_words;

  // 1. The rows' selections as bitmaps, and the union of their key tiles.
  const int nkt = int((L + kKT - 1) / kKT), words = (nkt + 31) / 32;
  const int nbw = int(((L + G.bs - 1) / G.bs + 31) / 32);
  for (int i = tid; i < kW * P.nb_words; i += kThreads)
    if (i % P.nb_words < nbw) wbits[i] = 0;
  for (int i = tid; i < words; i += kThreads) ubits[i] = 0;
  __syncthreads();
  if (active) {
    const int cnt = sel_cnt[row * G.kvh + g];
    const int32_t* lst = sel + (row * G.kvh + g) * P.total_topk;
    for (int i = lane; i < cnt; i += 32) {
      const long long b = lst[i];
      atomicOr(&mybits[b >> 5], 1u << (b & 31));
      const long long kt1 = min((b * G.bs + G.bs - 1) / kKT, t / kKT);
      for (long long kt = b * G.bs / kKT; kt <= kt1; ++kt) atomicOr(&ubits[kt >> 5], 1u << (kt & 31));
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
  const int per = (n_list + nsplit - 1) / nsplit;
  const int i0 = min(n_list, split * per), i1 = min(n_list, i0 + per);

  // 2. Online softmax over the tiles.
  // This warp's 16 query rows (heads 16 g .. 16 g + 15 of its row) in shared memory; the
  // A fragments are re-read per tile by ldmatrix (registers go to O and S: two blocks of
  // 8 warps fit on an SM).
  bf16* Qw = Qs + warp * 16 * D;
  if (active) {
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

  auto load = [&](int i, int stage) {
    constexpr int CH = D / 8;
    const long long p0 = 1LL * list[i] * kKT;
    for (int e = tid; e < kKT * CH; e += kThreads) {
      const int j = e / CH, c = e % CH;
      const bool ok = p0 + j < L;
      const int64_t off = ok ? token_off(G, pages, p0 + j) + int64_t(g) * D + c * 8 : 0;
      cp_async16(Ks + stage * kBuf + swz<D>(j, c * 8), kc + off, ok ? 16 : 0);
      cp_async16(Vs + stage * kBuf + swz<D>(j, c * 8), vc + off, ok ? 16 : 0);
    }
  };
  // Tiles i0, i0 + 1 in flight before the loop; iteration i waits for tile i, then (after
  // the barrier that says every warp is done with tile i − 1) refills i − 1's stage with
  // tile i + 2.
  for (int k = 0; k < kStages - 1; ++k) {
    if (i0 + k < i1) load(i0 + k, k);
    cp_async_commit();
  }
  for (int i = i0; i < i1; ++i) {
    const int stage = (i - i0) % kStages;
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (i + kStages - 1 < i1) load(i + kStages - 1, (i + kStages - 1 - i0) % kStages);
    cp_async_commit();
    const int kt = list[i];
    const uint64_t keys = active ? tile_keys(mybits, kt, G.bs, int(t)) : 0ull;
    if (keys) {
      const bf16* Kb = Ks + stage * kBuf;
      const bf16* Vb = Vs + stage * kBuf;
      const int mi = lane / 8, ri = lane % 8;
      // Two halves of 32 keys, each its own online-softmax update: S of a half is 16 fp32
      // registers, so O (64), S and the fragments fit in 128 registers.
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        const uint32_t hkeys = uint32_t(keys >> (32 * half));
        if (!hkeys) continue;
        float sv[4][4];
#pragma unroll
        for (int n = 0; n < 4; ++n) sv[n][0] = sv[n][1] = sv[n][2] = sv[n][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          uint32_t qa[4];
          ldmatrix_x4(qa, Qw + swz<D>((lane & 7) + ((lane >> 3) & 1) * 8, ks * 16 + (lane >> 4) * 8));
#pragma unroll
          for (int n = 0; n < 4; ++n) {
            const int key = 32 * half + n * 8 + qr;
            mma16816(sv[n], qa, *reinterpret_cast<const uint32_t*>(Kb + swz<D>(key, ks * 16 + qc)),
                     *reinterpret_cast<const uint32_t*>(Kb + swz<D>(key, ks * 16 + 8 + qc)));
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
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        // The half holds a selected key ≤ t (hkeys != 0), so both maxima are finite.
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1);  // 0 on the first update
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          sv[n][0] = exp2f(sv[n][0] - mn0), sv[n][1] = exp2f(sv[n][1] - mn0);
          sv[n][2] = exp2f(sv[n][2] - mn1), sv[n][3] = exp2f(sv[n][3] - mn1);
          sum0 += sv[n][0] + sv[n][1];
          sum1 += sv[n][2] + sv[n][3];
        }
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
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
          const uint32_t pl[4] = {
              pack_bf16(sa[0] - rb(sa[0]), sa[1] - rb(sa[1])), pack_bf16(sa[2] - rb(sa[2]), sa[3] - rb(sa[3])),
              pack_bf16(sb[0] - rb(sb[0]), sb[1] - rb(sb[1])), pack_bf16(sb[2] - rb(sb[2]), sb[3] - rb(sb[3]))};
          const int key = 32 * half + kk * 16 + ri + (mi & 1) * 8;
#pragma unroll
          for (int n = 0; n < D / 8; n += 2) {
            uint32_t bv[4];
            ldmatrix_x4_trans(bv, Vb + swz<D>(key, (n + (mi >> 1)) * 8));
            mma16816(o[n], ph, bv[0], bv[1]);
            mma16816(o[n], pl, bv[0], bv[1]);
            mma16816(o[n + 1], ph, bv[2], bv[3]);
            mma16816(o[n + 1], pl, bv[2], bv[3]);
          }
        }
      }
    }
  }
  if (!active) return;

  // 3. Output rows qr and qr + 8 (heads 16 g + qr, + 8).
  const int h0 = g * 16 + qr, h1 = h0 + 8;
  if (nsplit == 1) {
    const float i0f = 1.f / l0, i1f = 1.f / l1;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      bf16* d0 = out + (row * P.nh + h0) * D + n * 8 + qc;
      bf16* d1 = out + (row * P.nh + h1) * D + n * 8 + qc;
      d0[0] = f2b(o[n][0] * i0f), d0[1] = f2b(o[n][1] * i0f);
      d1[0] = f2b(o[n][2] * i1f), d1[1] = f2b(o[n][3] * i1f);
    }
    return;
  }
  const int64_t it0 = (int64_t(si) * P.nh + h0) * nsplit + split;
  const int64_t it1 = (int64_t(si) * P.nh + h1) * nsplit + split;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    part[it0 * D + n * 8 + qc] = o[n][0], part[it0 * D + n * 8 + qc + 1] = o[n][1];
    part[it1 * D + n * 8 + qc] = o[n][2], part[it1 * D + n * 8 + qc + 1] = o[n][3];
  }
  if (lane % 4 == 0) {  // combine_kernel works in natural-log units
    ml[2 * it0] = m0 == -INFINITY ? -INFINITY : m0 * kLn2, ml[2 * it0 + 1] = l0;
    ml[2 * it1] = m1 == -INFINITY ? -INFINITY : m1 * kLn2, ml[2 * it1 + 1] = l1;
  }
}

template <int D>
void launch_d(const bf16* q, const StepRows& s, const int2* tiles, int n_tiles, const bf16* kc,
              const bf16* vc, const int32_t* sel, const int32_t* sel_cnt, const SparseAttnParams& p,
              int splits, bf16* out, float* part, float* ml, cudaStream_t st) {
  const size_t smem = sparse_attn_smem_bytes(D, p);
  // The kernel's static shared memory counts against the opt-in limit too: ask for what
  // this launch needs, not the device maximum.
  static size_t smem_set = 48 * 1024;
  if (smem > smem_set) {
    CUDA_CHECK(cudaFuncSetAttribute(sparse_attn_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    smem_set = smem;
  }
  sparse_attn_kernel<D><<<dim3(unsigned(n_tiles), unsigned(p.g.kvh), unsigned(splits)), kThreads, smem, st>>>(
      q, s, tiles, kc, vc, sel, sel_cnt, p, out, part, ml);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t sparse_attn_smem_bytes(int d, const SparseAttnParams& p) {
  return (size_t(kStages) * 2 * kKT + size_t(kW) * 16) * d * 2 +
         (size_t(kW) * p.nb_words + p.nkt_words + p.list_cap) * 4;
}

void launch_sparse_attention(int d, const bf16* q, const StepRows& s, const int2* tiles,
                             int n_tiles, const bf16* kc, const bf16* vc, const int32_t* sel,
                             const int32_t* sel_cnt, const SparseAttnParams& p, int splits,
                             bf16* out, float* part, float* ml, cudaStream_t st) {
  if (n_tiles <= 0) return;
  switch (d) {
    case 16: launch_d<16>(q, s, tiles, n_tiles, kc, vc, sel, sel_cnt, p, splits, out, part, ml, st); break;
    case 32: launch_d<32>(q, s, tiles, n_tiles, kc, vc, sel, sel_cnt, p, splits, out, part, ml, st); break;
    case 64: launch_d<64>(q, s, tiles, n_tiles, kc, vc, sel, sel_cnt, p, splits, out, part, ml, st); break;
    case 128: launch_d<128>(q, s, tiles, n_tiles, kc, vc, sel, sel_cnt, p, splits, out, part, ml, st); break;
    default: break;
  }
}

}  // namespace sala::cuda
