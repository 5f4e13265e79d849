// Dense causal attention of long prefill calls on the tensor cores (sparse layers below
// dense_len, SPEC §9): FlashAttention-2 style, one block per (64 query rows of one
// sequence, query head), four warps of 16 rows. S = Q Kᵀ with bf16 mma.sync (exact bf16
// inputs, fp32 accumulation); online softmax in fp32 registers; P·V with P split into two
// bf16 terms (hi + lo, ~16 significant bits) so the probabilities are not rounded to bf16
// (golden README §4: softmax probabilities are not rounded). Keys and values come from the
// paged cache (written by append_kv before this kernel). mma.sync m16n8k16 is sm_80+.
// FP8 KV caches (KF): K and V tiles are loaded as codes and stored to shared memory as their
// exact bf16 values (unscaled); the K scale is part of tau, the V scale multiplies the output.
//
// Data movement (session 40): the next 64-key tile is copied by cp.async while the current
// one is multiplied (two K/V buffers; FP8: two code staging buffers, converted to one bf16
// tile per step), and the B fragments come from ldmatrix (K) / ldmatrix.trans (V) instead of
// 32- and 16-bit shared loads; tiles wholly below a warp's rows skip the causal mask. The
// same fragments in the same MMA order as before: the same bits. A 4K prompt's 8 dense calls
// (H100, one command, session 40): 20.8 -> 16.4 ms bf16, 23.5 -> 14.9 ms FP8 KV (the
// synchronous tile loads before it, 185-190 registers; now 218-224, 2 blocks per SM).
#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {

constexpr int kRows = 64, kKeys = 64, kD = 128, kLd = kD + 8;  // smem row stride (halves)
constexpr int kThreads = 128;
constexpr int kTile = kKeys * kLd;  // one K or V tile in shared memory (halves)
constexpr int kCodeTile = kKeys * kD;  // one K or V tile of FP8 codes (bytes)

// Dynamic shared memory: bf16 caches two K/V buffers; FP8 caches one bf16 K/V tile and two
// code staging buffers per K and V.
constexpr size_t flash_smem_bytes(int kf) {
  return kf == kKvAct ? 4 * kTile * sizeof(bf16) : 2 * kTile * sizeof(bf16) + 4 * kCodeTile;
}

// cp.async of tile `p0`'s keys [p0, p0 + 64) ∩ [0, kend) into K/V destinations dk / dv (row j
// at j * ld elements), zeros past kend. bf16: 16 chunks of 8 dims per key and tensor; codes:
// 8 chunks of 16 codes.
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
  bf16* const tiles = reinterpret_cast<bf16*>(smem);  // bf16: K0 V0 K1 V1; codes: K V
  uint8_t* const codes = smem + 2 * kTile * sizeof(bf16);  // codes: K0 V0 K1 V1 staging
  auto kbuf = [&](int b) { return tiles + (kCodes ? 0 : 2 * b * kTile); };
  auto vbuf = [&](int b) { return tiles + (kCodes ? kTile : (2 * b + 1) * kTile); };
  const int tile = blockIdx.x, h = blockIdx.y, g = h / GH;
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
  // Q tile -> smem (rows past the call: zeros), staged where tile 1 will go (bf16) or in the
  // bf16 tile that tile 0's codes are converted into (codes).
  bf16* const Qs = kCodes ? kbuf(0) : kbuf(1);
  for (int e = tid; e < kRows * (kD / 8); e += kThreads) {
    const int r = e / (kD / 8), c = e % (kD / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < nrows)
      v = *reinterpret_cast<const uint4*>(q + (int64_t(fs.token_begin) + r0 + r) * qstride + int64_t(h) * kD + c * 8);
    *reinterpret_cast<uint4*>(&Qs[r * kLd + c * 8]) = v;
  }
  __syncthreads();
  // This warp's Q fragments: rows wr..wr+15, 8 k-steps.
  const int wr = warp * 16, qr = lane / 4, qc = (lane % 4) * 2;
  uint32_t qa[8][4];
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const int k0 = ks * 16 + qc;
    qa[ks][0] = *reinterpret_cast<const uint32_t*>(&Qs[(wr + qr) * kLd + k0]);
    qa[ks][1] = *reinterpret_cast<const uint32_t*>(&Qs[(wr + qr + 8) * kLd + k0]);
    qa[ks][2] = *reinterpret_cast<const uint32_t*>(&Qs[(wr + qr) * kLd + k0 + 8]);
    qa[ks][3] = *reinterpret_cast<const uint32_t*>(&Qs[(wr + qr + 8) * kLd + k0 + 8]);
  }
  float o[16][4];
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  // Absolute positions of this thread's two rows.
  const int64_t t0 = fs.past_len + r0 + wr + qr, t1 = t0 + 8;
  const int64_t warp_first = fs.past_len + r0 + wr;  // the warp's first row
  // ldmatrix lane offsets (halves): K, non-transposed, matrix m = lane / 8 of a pair of
  // k-steps: key lane % 8 of the n-tile, dims 16 (m / 2) + 8 (m % 2); V, transposed, matrix m
  // of a pair of n-tiles: key 8 (m % 2) + lane % 8 of the k-step, dims 8 (m / 2).
  const int lm = lane / 8, lr = lane % 8;
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
    if (p0 > fs.past_len + r0 + wr + 15) continue;  // every key of the tile is after this warp's rows
    const uint32_t ks_base = smem_addr(kbuf(kCodes ? 0 : i & 1)) + k_lane;
    const uint32_t vs_base = smem_addr(vbuf(kCodes ? 0 : i & 1)) + v_lane;
    // S = Q Kᵀ: 16 x 64 per warp, 8 n-tiles of 8 keys.
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < 8; ks += 2) {
        uint32_t b[4];  // b0, b1 of k-steps ks and ks + 1
        ldsm_x4(b, ks_base + uint32_t((n * 8 * kLd + ks * 16) * sizeof(bf16)));
        mma16816(s[n], qa[ks], b[0], b[1]);
        mma16816(s[n], qa[ks + 1], b[2], b[3]);
      }
    }
    // Tiles wholly at or below the warp's first row need no mask.
    const bool full = p0 + kKeys - 1 <= warp_first;
    // scale, causal mask, online softmax (rows qr and qr+8 of the warp; a quad shares a row)
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t kp = p0 + n * 8 + qc + (e & 1);
        const int64_t tr = e < 2 ? t0 : t1;
        const float v = full || kp <= tr ? tau * s[n][e] : -INFINITY;
        s[n][e] = v;
        if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // rows with no visible key yet keep m = -inf (only possible for padded rows)
    const float c0 = mn0 == -INFINITY ? 1.f : (m0 == -INFINITY ? 0.f : expf(m0 - mn0));
    const float c1 = mn1 == -INFINITY ? 1.f : (m1 == -INFINITY ? 0.f : expf(m1 - mn1));
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float mn = e < 2 ? mn0 : mn1;
        const float pv = s[n][e] == -INFINITY ? 0.f : expf(s[n][e] - mn);
        s[n][e] = pv;
        if (e < 2) sum0 += pv; else sum1 += pv;
      }
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
    l0 = l0 * c0 + sum0;
    l1 = l1 * c1 + sum1;
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      o[n][0] *= c0, o[n][1] *= c0;
      o[n][2] *= c1, o[n][3] *= c1;
    }
    // O += P V, P = hi + lo (two bf16 terms); 4 k-steps of 16 keys, 16 n-tiles of 8 dims.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t ph[4], pl[4];
      const float* sa = s[2 * kk];
      const float* sb = s[2 * kk + 1];
      const float pv[8] = {sa[0], sa[1], sa[2], sa[3], sb[0], sb[1], sb[2], sb[3]};
      float lo[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) lo[i] = pv[i] - __bfloat162float(__float2bfloat16_rn(pv[i]));
      ph[0] = pack_bf16(pv[0], pv[1]), ph[1] = pack_bf16(pv[2], pv[3]);
      ph[2] = pack_bf16(pv[4], pv[5]), ph[3] = pack_bf16(pv[6], pv[7]);
      pl[0] = pack_bf16(lo[0], lo[1]), pl[1] = pack_bf16(lo[2], lo[3]);
      pl[2] = pack_bf16(lo[4], lo[5]), pl[3] = pack_bf16(lo[6], lo[7]);
#pragma unroll
      for (int n = 0; n < 16; n += 2) {
        uint32_t b[4];  // b0, b1 of n-tiles n and n + 1
        ldsm_x4_trans(b, vs_base + uint32_t((kk * 16 * kLd + n * 8) * sizeof(bf16)));
        mma16816(o[n], ph, b[0], b[1]);
        mma16816(o[n], pl, b[0], b[1]);
        mma16816(o[n + 1], ph, b[2], b[3]);
        mma16816(o[n + 1], pl, b[2], b[3]);
      }
    }
  }
  // out = O / l, bf16 (FP8: O was summed over the V code values)
  float i0 = 1.f / l0, i1 = 1.f / l1;
  if constexpr (KF != kKvAct) i0 *= v_scale, i1 *= v_scale;
  const int ra = wr + qr, rb_ = ra + 8;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const int col = n * 8 + qc;
    if (ra < nrows) {
      bf16* dst = out + (int64_t(fs.token_begin) + r0 + ra) * qstride + int64_t(h) * kD + col;
      dst[0] = f2b(o[n][0] * i0);
      dst[1] = f2b(o[n][1] * i0);
    }
    if (rb_ < nrows) {
      bf16* dst = out + (int64_t(fs.token_begin) + r0 + rb_) * qstride + int64_t(h) * kD + col;
      dst[0] = f2b(o[n][2] * i1);
      dst[1] = f2b(o[n][3] * i1);
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
