// Dense causal attention of long prefill calls on the tensor cores (sparse layers below
// dense_len, SPEC §9): FlashAttention-2 style, one block per (64 query rows of one
// sequence, query head), four warps of 16 rows. S = Q Kᵀ with bf16 mma.sync (exact bf16
// inputs, fp32 accumulation); online softmax in fp32 registers; P·V with P split into two
// bf16 terms (hi + lo, ~16 significant bits) so the probabilities are not rounded to bf16
// (golden README §4: softmax probabilities are not rounded). Keys and values come from the
// paged cache (written by append_kv before this kernel). mma.sync m16n8k16 is sm_80+.
// FP8 KV caches (KF): K and V tiles are loaded as codes and stored to shared memory as their
// exact bf16 values (unscaled); the K scale is part of tau, the V scale multiplies the output.
#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace sala::cuda {
namespace {

constexpr int kRows = 64, kKeys = 64, kD = 128, kLd = kD + 8;  // smem row stride (halves)
constexpr int kThreads = 128;

template <int KF>
__global__ void __launch_bounds__(kThreads) flash_prefill_kernel(
    const bf16* __restrict__ q, FlashSeq fs, const int32_t* __restrict__ page_table,
    const KvElem<KF>* __restrict__ kc, const KvElem<KF>* __restrict__ vc, CacheGeom G, int GH,
    int nh, float tau, float v_scale, bf16* __restrict__ out) {
  __shared__ __align__(16) bf16 Ks[kKeys * kLd];  // also stages the Q tile (kRows == kKeys)
  bf16* Qs = Ks;
  __shared__ __align__(16) bf16 Vs[kKeys * kLd];
  const int tile = blockIdx.x, h = blockIdx.y, g = h / GH;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int r0 = tile * kRows;                 // first row of the tile within the call
  const int nrows = min(kRows, fs.num_tokens - r0);
  const int32_t* pages = page_table + fs.page_begin;
  const int64_t qstride = int64_t(nh) * kD;
  // Q tile -> smem (rows past the call: zeros)
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
  const int64_t kend = fs.past_len + r0 + nrows;  // keys [0, kend) are visible to some row
  for (int64_t p0 = 0; p0 < kend; p0 += kKeys) {
    __syncthreads();  // previous tile consumed
    for (int e = tid; e < kKeys * (kD / 8); e += kThreads) {
      const int j = e / (kD / 8), c = e % (kD / 8);
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (p0 + j < kend) {
        const int64_t off = token_off(G, pages, p0 + j) + int64_t(g) * kD + c * 8;
        kv = kv_load8_bf16<KF>(kc + off);
        vv = kv_load8_bf16<KF>(vc + off);
      }
      *reinterpret_cast<uint4*>(&Ks[j * kLd + c * 8]) = kv;
      *reinterpret_cast<uint4*>(&Vs[j * kLd + c * 8]) = vv;
    }
    __syncthreads();
    if (p0 > fs.past_len + r0 + wr + 15) continue;  // every key of the tile is after this warp's rows
    // S = Q Kᵀ: 16 x 64 per warp, 8 n-tiles of 8 keys.
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const bf16* kp = &Ks[(n * 8 + qr) * kLd + ks * 16 + qc];
        mma16816(s[n], qa[ks], *reinterpret_cast<const uint32_t*>(kp),
                 *reinterpret_cast<const uint32_t*>(kp + 8));
      }
    }
    // scale, causal mask, online softmax (rows qr and qr+8 of the warp; a quad shares a row)
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t kp = p0 + n * 8 + qc + (e & 1);
        const int64_t tr = e < 2 ? t0 : t1;
        const float v = kp <= tr ? tau * s[n][e] : -INFINITY;
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
      const int kr = kk * 16 + qc;
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        const int col = n * 8 + qr;
        const uint32_t b0 = pack_raw(Vs[kr * kLd + col], Vs[(kr + 1) * kLd + col]);
        const uint32_t b1 = pack_raw(Vs[(kr + 8) * kLd + col], Vs[(kr + 9) * kLd + col]);
        mma16816(o[n], ph, b0, b1);
        mma16816(o[n], pl, b0, b1);
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
  if (kf == kKvE4m3)
    flash_prefill_kernel<kKvE4m3><<<grid, kThreads, 0, st>>>(
        q, s, page_table, static_cast<const uint8_t*>(kc), static_cast<const uint8_t*>(vc), g, GH,
        nh, tau, v_scale, out);
  else if (kf == kKvE5m2)
    flash_prefill_kernel<kKvE5m2><<<grid, kThreads, 0, st>>>(
        q, s, page_table, static_cast<const uint8_t*>(kc), static_cast<const uint8_t*>(vc), g, GH,
        nh, tau, v_scale, out);
  else
    flash_prefill_kernel<kKvAct><<<grid, kThreads, 0, st>>>(
        q, s, page_table, static_cast<const bf16*>(kc), static_cast<const bf16*>(vc), g, GH, nh,
        tau, v_scale, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sala::cuda
