// Dense causal attention of long prefill calls on the tensor cores (sparse layers below
// dense_len, SPEC §9): FlashAttention-2 style, one block per (128 query rows of one
// sequence, query head), four warps of 32 rows: two m16 row groups per warp share every K
// and V fragment, and Q fragments are read from shared memory per tile (FlashAttention-2's
// layout; Q in registers for 32 rows would not fit). S = Q Kᵀ with bf16 mma.sync (exact bf16
// inputs, fp32 accumulation); online softmax in fp32 registers, in log2 units (the SFU's
// ex2, as stage 2); P·V with P split into two bf16 terms (hi + lo, ~16 significant bits) so
// the probabilities are not rounded to bf16 (golden README §4: softmax probabilities are not
// rounded). Keys and values come from the paged cache (written by append_kv before this
// kernel). mma.sync m16n8k16 is sm_80+.
// FP8 KV caches (KF): K and V tiles are loaded as codes and stored to shared memory as their
// exact bf16 values (unscaled); the K scale is part of tau, the V scale multiplies the output.
//
// Data movement: the next 32-key tile is copied by cp.async while the current one is
// multiplied (two K/V buffers; FP8: two code staging buffers, converted to one bf16 tile per
// step); B fragments come from ldmatrix (K) / ldmatrix.trans (V); tiles wholly below a
// warp's rows skip the causal mask; the row tiles with the most keys start first.
// A 4K prompt's 8 dense calls (H100, one command, session 41), against 64-row blocks of
// 16-row warps with expf: 16.9 -> 10.4 ms bf16, 15.4 -> 10.5 ms FP8 KV; of that, 2.0 ms
// (bf16) is the 32-row warps and 4.5 ms the exp2 softmax (64-key tiles: 0.8 ms faster than
// 32 without exp2, not measured with it). Then lazy rescaling (a running maximum moves only by
// more than 2^8) and the scale inside exp2's FMA: 10.5 -> 9.6 ms bf16, 10.5 -> 9.9-10.1 ms FP8
// KV (H100, one command, session 42). 254-255 registers (4-24 B of spills), 2 blocks per SM.
#include "backend/cuda/cuda_infllm_attn.cuh"  // stage2::fast_exp2, kLog2e
#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {

constexpr int kRows = 128, kKeys = 32, kD = 128, kLd = kD + 8;  // smem row stride (halves)
constexpr int kThreads = 128;  // four warps of 32 rows (two m16 row groups)
constexpr int kTile = kKeys * kLd;  // one K or V tile in shared memory (halves)
constexpr int kNt = kKeys / 8, kKs = kKeys / 16;  // n-tiles of S, k-steps of P V
constexpr int kQTile = kRows * kLd;  // the block's Q rows in shared memory (halves)
constexpr int kCodeTile = kKeys * kD;  // one K or V tile of FP8 codes (bytes)
constexpr float kStale = 8.f;  // log2 units a running maximum may lag (terms <= 2^8)

// Dynamic shared memory: Q, then bf16 caches two K/V buffers; FP8 caches one bf16 K/V tile
// and two code staging buffers per K and V.
constexpr size_t flash_smem_bytes(int kf) {
  return kQTile * sizeof(bf16) +
         (kf == kKvAct ? 4 * kTile * sizeof(bf16) : 2 * kTile * sizeof(bf16) + 4 * kCodeTile);
}

// cp.async of tile `p0`'s keys [p0, p0 + kKeys) ∩ [0, kend) into K/V destinations dk / dv
// (row j at j * ld elements), zeros past kend. bf16: 16 chunks of 8 dims per key and tensor;
// codes: 8 chunks of 16 codes.
template <int KF>
__device__ __forceinline__ void issue_tile(const KvElem<KF>* kc, const KvElem<KF>* vc,
                                           const CacheGeom& G, const int32_t* pages, int g,
                                           int64_t p0, int64_t kend, KvElem<KF>* dk,
                                           KvElem<KF>* dv, int ld) {
  constexpr int kPer = 16 / int(sizeof(KvElem<KF>));  // elements per 16-byte chunk
  constexpr int kChunks = kD / kPer;                  // chunks per key row
  for (int e = threadIdx.x; e < kKeys * kChunks; e += kThreads) {
    const int j = e / kChunks, c = e % kChunks;
    const bool in = p0 + j < kend;
    const int64_t off = in ? token_off(G, pages, p0 + j) + int64_t(g) * kD + c * kPer : 0;
    cp_async16(dk + j * ld + c * kPer, kc + off, in ? 16 : 0);
    cp_async16(dv + j * ld + c * kPer, vc + off, in ? 16 : 0);
  }
  cp_async_commit();
}

template <int KF>
__global__ void __launch_bounds__(kThreads) flash_prefill_kernel(
    const bf16* __restrict__ q, FlashSeq fs, const int32_t* __restrict__ page_table,
    const KvElem<KF>* __restrict__ kc, const KvElem<KF>* __restrict__ vc, CacheGeom G, int GH,
    int nh, float tau, float v_scale, bf16* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr bool kCodes = KF != kKvAct;
  bf16* const Qs = reinterpret_cast<bf16*>(smem);
  bf16* const tiles = Qs + kQTile;  // bf16: K0 V0 K1 V1; codes: K V
  uint8_t* const codes = reinterpret_cast<uint8_t*>(tiles + 2 * kTile);  // codes: K0 V0 K1 V1
  auto kbuf = [&](int b) { return tiles + (kCodes ? 0 : 2 * b * kTile); };
  auto vbuf = [&](int b) { return tiles + (kCodes ? kTile : (2 * b + 1) * kTile); };
  // The last row tiles see the most keys: they start first, so the short ones fill the tail.
  const int tile = int(gridDim.x) - 1 - int(blockIdx.x), h = blockIdx.y, g = h / GH;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int r0 = tile * kRows;                 // first row of the tile within the call
  const int nrows = min(kRows, fs.num_tokens - r0);
  const int32_t* pages = page_table + fs.page_begin;
  const int64_t qstride = int64_t(nh) * kD;
  const int64_t kend = fs.past_len + r0 + nrows;  // keys [0, kend) are visible to some row
  const int ntile = int((kend + kKeys - 1) / kKeys);
  auto issue = [&](int i) {
    const int b = i & 1;
    if constexpr (kCodes)
      issue_tile<KF>(kc, vc, G, pages, g, int64_t(i) * kKeys, kend, codes + 2 * b * kCodeTile,
                     codes + (2 * b + 1) * kCodeTile, kD);
    else
      issue_tile<KF>(kc, vc, G, pages, g, int64_t(i) * kKeys, kend, kbuf(b), vbuf(b), kLd);
  };
  issue(0);
  // Q tile -> smem (rows past the call: zeros); the loop's first barrier publishes it.
  for (int e = tid; e < kRows * (kD / 8); e += kThreads) {
    const int r = e / (kD / 8), c = e % (kD / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < nrows)
      v = *reinterpret_cast<const uint4*>(q + (int64_t(fs.token_begin) + r0 + r) * qstride +
                                          int64_t(h) * kD + c * 8);
    *reinterpret_cast<uint4*>(&Qs[r * kLd + c * 8]) = v;
  }
  // This warp's rows: wr + 16 gi + qr and + 8 for row group gi (two groups of 16).
  const int wr = warp * 32, qr = lane / 4, qc = (lane % 4) * 2;
  float o[2][16][4];
#pragma unroll
  for (int gi = 0; gi < 2; ++gi)
#pragma unroll
    for (int n = 0; n < 16; ++n) o[gi][n][0] = o[gi][n][1] = o[gi][n][2] = o[gi][n][3] = 0.f;
  float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
  float l[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  const int64_t warp_first = fs.past_len + r0 + wr;  // the warp's first row
  // Scores in log2 units (as stage 2): 2^(s·tau·log2e − m) by the SFU, tau·log2e > 0.
  const float sc = tau * stage2::kLog2e;
  // ldmatrix lane offsets (halves): Q (A, non-transposed), matrix m = lane / 8: rows
  // 8 (m % 2) + lane % 8, dims 8 (m / 2); K, non-transposed, matrix m of a pair of k-steps:
  // key lane % 8 of the n-tile, dims 16 (m / 2) + 8 (m % 2); V, transposed, matrix m of a
  // pair of n-tiles: key 8 (m % 2) + lane % 8 of the k-step, dims 8 (m / 2).
  const int lm = lane / 8, lr = lane % 8;
  const uint32_t qs_base =
      smem_addr(Qs) + uint32_t(((wr + 8 * (lm % 2) + lr) * kLd + 8 * (lm / 2)) * sizeof(bf16));
  const uint32_t k_lane = uint32_t((lr * kLd + 16 * (lm / 2) + 8 * (lm % 2)) * sizeof(bf16));
  const uint32_t v_lane = uint32_t(((8 * (lm % 2) + lr) * kLd + 8 * (lm / 2)) * sizeof(bf16));
  for (int i = 0; i < ntile; ++i) {
    const int64_t p0 = int64_t(i) * kKeys;
    cp_async_wait<0>();
    __syncthreads();  // tile i landed for every thread; tile i - 1 consumed by every warp
    if constexpr (kCodes) {  // tile i's codes -> the bf16 tile (exact values)
      const uint8_t* ck = codes + 2 * (i & 1) * kCodeTile;
      for (int e = tid; e < kKeys * (kD / 8); e += kThreads) {
        const int j = e / (kD / 8), c = e % (kD / 8);
        const uint2 a = *reinterpret_cast<const uint2*>(ck + j * kD + c * 8);
        const uint2 b = *reinterpret_cast<const uint2*>(ck + kCodeTile + j * kD + c * 8);
        *reinterpret_cast<uint4*>(&kbuf(0)[j * kLd + c * 8]) = kv_codes8_bf16<KF>(a);
        *reinterpret_cast<uint4*>(&vbuf(0)[j * kLd + c * 8]) = kv_codes8_bf16<KF>(b);
      }
      __syncthreads();
    }
    if (i + 1 < ntile) issue(i + 1);  // into the buffers of tile i - 1
    if (p0 > warp_first + 31) continue;  // every key of the tile is after this warp's rows
    const uint32_t ks_base = smem_addr(kbuf(kCodes ? 0 : i & 1)) + k_lane;
    const uint32_t vs_base = smem_addr(vbuf(kCodes ? 0 : i & 1)) + v_lane;
    // S = Q Kᵀ: 32 x kKeys per warp (two row groups), kNt n-tiles of 8 keys; Q fragments come
    // from shared memory a pair of k-steps at a time (k-steps in the same order per row).
    float s[2][kNt][4];
#pragma unroll
    for (int gi = 0; gi < 2; ++gi)
#pragma unroll
      for (int n = 0; n < kNt; ++n) s[gi][n][0] = s[gi][n][1] = s[gi][n][2] = s[gi][n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < 8; ks += 2) {
      uint32_t qa[2][2][4];  // [row group][k-step ks, ks + 1]
#pragma unroll
      for (int gi = 0; gi < 2; ++gi)
#pragma unroll
        for (int kx = 0; kx < 2; ++kx)
          ldsm_x4(qa[gi][kx], qs_base + uint32_t((gi * 16 * kLd + (ks + kx) * 16) * sizeof(bf16)));
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        uint32_t b[4];  // b0, b1 of k-steps ks and ks + 1
        ldsm_x4(b, ks_base + uint32_t((n * 8 * kLd + ks * 16) * sizeof(bf16)));
#pragma unroll
        for (int gi = 0; gi < 2; ++gi) {
          mma16816(s[gi][n], qa[gi][0], b[0], b[1]);
          mma16816(s[gi][n], qa[gi][1], b[2], b[3]);
        }
      }
    }
    // Tiles wholly at or below the warp's first row need no mask.
    const bool full = p0 + kKeys - 1 <= warp_first;
    // scale, causal mask, online softmax per row (rows qr and qr + 8 of each group; a quad
    // shares a row)
    float c[2][2];
    bool moved = false;  // some row of this thread moved its maximum
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
      // key p0 + j is visible to row t iff j <= t - p0 (rows are within 2^31 of a tile
      // they compute)
      const int d0 = int(warp_first + 16 * gi + qr - p0), d1 = d0 + 8;
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < kNt; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = n * 8 + qc + (e & 1);
          const float v = full || j <= (e < 2 ? d0 : d1) ? s[gi][n][e] : -INFINITY;
          s[gi][n][e] = v;  // unscaled: sc > 0 multiplies inside exp2's FMA below
          if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
        }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      mx0 *= sc, mx1 *= sc;
      // The running maximum moves only where a score passes it by more than kStale (log2
      // units; FlashAttention-4's lazy rescaling): then the terms stay below 2^kStale, exact
      // in fp32 and split into hi + lo as any other, and most tiles skip O's rescaling.
      // Every row (padded ones too: t >= 0) sees key 0 in tile 0, which no warp skips, so
      // the maxima are finite from the first tile on (-inf - -inf never occurs): 2^(-inf) = 0
      // for the first correction and for masked keys, no guards.
      const float mn0 = mx0 - m[gi][0] > kStale ? mx0 : m[gi][0];
      const float mn1 = mx1 - m[gi][1] > kStale ? mx1 : m[gi][1];
      moved |= mn0 != m[gi][0] || mn1 != m[gi][1];
      c[gi][0] = stage2::fast_exp2(m[gi][0] - mn0);
      c[gi][1] = stage2::fast_exp2(m[gi][1] - mn1);
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int n = 0; n < kNt; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float mn = e < 2 ? mn0 : mn1;
          const float pv = stage2::fast_exp2(fmaf(s[gi][n][e], sc, -mn));
          s[gi][n][e] = pv;
          if (e < 2) sum0 += pv; else sum1 += pv;
        }
      sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
      sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
      sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
      sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
      l[gi][0] = l[gi][0] * c[gi][0] + sum0;
      l[gi][1] = l[gi][1] * c[gi][1] + sum1;
      m[gi][0] = mn0;
      m[gi][1] = mn1;
    }
    // c = 1 exactly in the rows that kept their maximum
    if (__any_sync(0xffffffffu, moved))
#pragma unroll
      for (int gi = 0; gi < 2; ++gi)
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          o[gi][n][0] *= c[gi][0], o[gi][n][1] *= c[gi][0];
          o[gi][n][2] *= c[gi][1], o[gi][n][3] *= c[gi][1];
        }
    // O += P V, P = hi + lo (two bf16 terms); kKs k-steps of 16 keys, 16 n-tiles of 8 dims.
#pragma unroll
    for (int kk = 0; kk < kKs; ++kk) {
      uint32_t ph[2][4], pl[2][4];
#pragma unroll
      for (int gi = 0; gi < 2; ++gi) {
        const float* sa = s[gi][2 * kk];
        const float* sb = s[gi][2 * kk + 1];
        const float pv[8] = {sa[0], sa[1], sa[2], sa[3], sb[0], sb[1], sb[2], sb[3]};
        float lo[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) lo[e] = pv[e] - __bfloat162float(__float2bfloat16_rn(pv[e]));
        ph[gi][0] = pack_bf16(pv[0], pv[1]), ph[gi][1] = pack_bf16(pv[2], pv[3]);
        ph[gi][2] = pack_bf16(pv[4], pv[5]), ph[gi][3] = pack_bf16(pv[6], pv[7]);
        pl[gi][0] = pack_bf16(lo[0], lo[1]), pl[gi][1] = pack_bf16(lo[2], lo[3]);
        pl[gi][2] = pack_bf16(lo[4], lo[5]), pl[gi][3] = pack_bf16(lo[6], lo[7]);
      }
#pragma unroll
      for (int n = 0; n < 16; n += 2) {
        uint32_t b[4];  // b0, b1 of n-tiles n and n + 1
        ldsm_x4_trans(b, vs_base + uint32_t((kk * 16 * kLd + n * 8) * sizeof(bf16)));
#pragma unroll
        for (int gi = 0; gi < 2; ++gi) {
          mma16816(o[gi][n], ph[gi], b[0], b[1]);
          mma16816(o[gi][n], pl[gi], b[0], b[1]);
          mma16816(o[gi][n + 1], ph[gi], b[2], b[3]);
          mma16816(o[gi][n + 1], pl[gi], b[2], b[3]);
        }
      }
    }
  }
  // out = O / l, bf16 (FP8: O was summed over the V code values)
#pragma unroll
  for (int gi = 0; gi < 2; ++gi) {
    float i0 = 1.f / l[gi][0], i1 = 1.f / l[gi][1];
    if constexpr (KF != kKvAct) i0 *= v_scale, i1 *= v_scale;
    const int ra = wr + 16 * gi + qr, rb_ = ra + 8;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      const int col = n * 8 + qc;
      if (ra < nrows) {
        bf16* dst = out + (int64_t(fs.token_begin) + r0 + ra) * qstride + int64_t(h) * kD + col;
        dst[0] = f2b(o[gi][n][0] * i0);
        dst[1] = f2b(o[gi][n][1] * i0);
      }
      if (rb_ < nrows) {
        bf16* dst = out + (int64_t(fs.token_begin) + r0 + rb_) * qstride + int64_t(h) * kD + col;
        dst[0] = f2b(o[gi][n][2] * i1);
        dst[1] = f2b(o[gi][n][3] * i1);
      }
    }
  }
}

}  // namespace

bool flash_prefill_supported(int d) { return d == kD; }

void launch_flash_prefill(const bf16* q, const FlashSeq& s, const int32_t* page_table,
                          const void* kc, const void* vc, const CacheGeom& g, int GH, int nh,
                          float tau, bf16* out, cudaStream_t st, int kf, float v_scale) {
  if (s.num_tokens <= 0) return;
  const dim3 grid(unsigned((s.num_tokens + kRows - 1) / kRows), unsigned(nh));
  auto go = [&]<int KF>(SmemOptIn& optin) {
    const size_t smem = flash_smem_bytes(KF);
    optin.raise(flash_prefill_kernel<KF>, smem);
    flash_prefill_kernel<KF><<<grid, kThreads, smem, st>>>(
        q, s, page_table, static_cast<const KvElem<KF>*>(kc), static_cast<const KvElem<KF>*>(vc),
        g, GH, nh, tau, v_scale, out);
  };
  static SmemOptIn e4m3, e5m2, act;  // per device
  if (kf == kKvE4m3)
    go.template operator()<kKvE4m3>(e4m3);
  else if (kf == kKvE5m2)
    go.template operator()<kKvE5m2>(e5m2);
  else
    go.template operator()<kKvAct>(act);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
