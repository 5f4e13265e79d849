// Lightning layers, long calls, bf16 mode: phases 1 and 3 of the chunk-parallel simple GLA
// (cuda_lightning_chunk3.cu, SPEC §8) on the tensor cores, mma.sync m16n8k16 bf16 -> fp32
// (fragment layouts: cuda_mma.cuh). Phase 2 (the scan over chunks) and the workspace layout
// (per chunk, per (seq, head): an fp32 [D x][D c] state, row-major) are those of chunk3.cu.
//
// q, k, v are bf16 values: exact as MMA inputs. The fp32 operands (k_j λ^(C-1-j), the state
// S_before(c), the masked decayed scores P) are split into three bf16 terms
//   x = hi + lo + lo2,  hi = bf16(x), lo = bf16(x - hi), lo2 = bf16(x - hi - lo)
// (both subtractions are exact in fp32). 8 + 8 + 8 significant bits (plus the signs of the
// residuals) cover fp32's 24, so the sum of the terms is x exactly for every normal x that
// is not within 2^16 of the fp32 underflow threshold; every bf16 x bf16 product is exact in
// fp32, so each product of fp32 operand and bf16 value is exact and only the order of the
// fp32 sums (the tensor core's accumulation instead of a serial fmaf chain) differs from the
// CUDA-core kernels. CudaLightningTc.SplitEmulation (host only) checks that the 3-term split
// reconstructs 10^7 random fp32 values over |x| in [2^-100, 2^100] exactly and emulates a
// chunk: 3 terms stay within ~3x of the fmaf chain's error (both ~1e-7 relative); 2 terms
// would leave up to 2^-17 relative (~64 fp32 ulps) in the state, which persists across calls.
// One MMA per term, smallest term first. Fragments of tiles whose rows run along the k
// dimension come by ldmatrix.trans. No GPU at hand: scripts/gla_tc_sim/run.sh runs this file's
// kernels on the host (emulated mma / ldmatrix) against a double reference.
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/gla.h"

namespace sala::cuda {

namespace {

constexpr int kChunk = kGlaChunk;              // 64 tokens
constexpr int kDecayStride = kGlaDecayStride;  // decay[h][n] = exp(n g), n = 0..64
constexpr int kNT = 3;                          // bf16 terms per fp32 operand

// Shared-memory tiles are bf16 [rows][D + 8]: the 8 halves of padding put the 8 rows that a
// fragment load touches at once in different banks (row stride ≡ 4 or 8 words mod 32).
template <int D>
struct Tc {
  static constexpr int LX = D + 8;
  static constexpr int XR = D < 64 ? D : 64;  // state rows per part in phase 3
  static constexpr int kTile = kChunk * LX;   // halves of one [64][LX] tile
  static constexpr int kSPart = kNT * XR * LX;
  static constexpr int kP1Bytes = (kNT + 1) * kTile * 2;  // K~ terms, V
  // Q, V, then K (QKᵀ) or the terms of a part of S
  static constexpr int kP3Bytes = (2 * kTile + (kSPart > kTile ? kSPart : kTile)) * 2;
};

extern __shared__ __align__(16) unsigned char tc_smem[];

__device__ __forceinline__ void split3(float x, bf16 (&t)[kNT]) {
  t[0] = __float2bfloat16_rn(x);
  const float r = x - __bfloat162float(t[0]);
  t[1] = __float2bfloat16_rn(r);
  t[2] = __float2bfloat16_rn(r - __bfloat162float(t[1]));
}

// 4 bf16 as 8 bytes (one term of 4 split values).
__device__ __forceinline__ uint2 pack4(bf16 a, bf16 b, bf16 c, bf16 d) {
  return make_uint2(pack_raw(a, b), pack_raw(c, d));
}

// Fragments from row-major [k][LX] bf16 tiles whose rows run along the MMA's k dimension, by
// ldmatrix.trans (lane l gives the address of row l % 8 of matrix l / 8; mi = l / 8, ri = l % 8):
//   B of two n-tiles: b0, b1 of columns n0 .. n0+7, then of n0+8 .. n0+15 (as cuda_infllm_attn.cu)
//   A[m][k] = t[k][m] (the tile holds Aᵀ): a0..a3 of rows m0 .. m0+15, k0 .. k0+15
// Rows are 16-byte aligned (LX·2 ≡ 0 mod 16) and the 8 rows of a matrix hit distinct banks.
__device__ __forceinline__ void ldsm_b2(uint32_t (&r)[4], const bf16* t, int LX, int k0, int n0, int mi, int ri) {
  ldmatrix_x4_trans(r, t + (k0 + ri + (mi & 1) * 8) * LX + n0 + (mi >> 1) * 8);
}
__device__ __forceinline__ void ldsm_at(uint32_t (&r)[4], const bf16* t, int LX, int k0, int m0, int mi, int ri) {
  ldmatrix_x4_trans(r, t + (k0 + ri + (mi >> 1) * 8) * LX + m0 + (mi & 1) * 8);
}

// Phase 1: ΔS_c[x][c] = Σ_j K~[j][x] V[j][c], K~[j] = k_j λ^(C-1-j); M = x, N = c, K = j.
// Warp w: m-tile w / WPM (16 state rows), NPW (even) n-tiles of 8 columns.
//                                                           grid: (nh, n_seqs, window), block 256
template <int D>
__global__ void __launch_bounds__(256) gla_chunk_state_tc_kernel(
    const bf16* __restrict__ k, const bf16* __restrict__ v, int64_t stride,
    const DevSeq* __restrict__ seqs, const int32_t* __restrict__ list, const float* __restrict__ decay_g,
    float* __restrict__ ws, int c_begin) {
  using L = Tc<D>;
  constexpr int LX = L::LX;
  bf16* Kt = reinterpret_cast<bf16*>(tc_smem);  // [kNT][64 j][LX]: terms of K~
  bf16* Vs = Kt + kNT * L::kTile;               // [64 j][LX]
  const int h = blockIdx.x, nh = gridDim.x;
  const DevSeq s = seqs[list[blockIdx.y]];
  const int c = c_begin + int(blockIdx.z);
  if (c * kChunk >= s.num_tokens) return;
  const int C = min(kChunk, s.num_tokens - c * kChunk);
  const int64_t row0 = int64_t(s.token_begin) + int64_t(c) * kChunk;
  const float* decay = decay_g + h * kDecayStride;
  const int tid = threadIdx.x;
  for (int e = tid; e < kChunk * (D / 8); e += 256) {
    const int j = e / (D / 8), x8 = (e % (D / 8)) * 8;
    uint4 kr = make_uint4(0, 0, 0, 0), vr = kr;
    float f = 0.f;
    if (j < C) {
      const int64_t off = (row0 + j) * stride + int64_t(h) * D + x8;
      kr = *reinterpret_cast<const uint4*>(k + off);
      vr = *reinterpret_cast<const uint4*>(v + off);
      f = decay[C - 1 - j];
    }
    *reinterpret_cast<uint4*>(Vs + j * LX + x8) = vr;
    const bf16* kb = reinterpret_cast<const bf16*>(&kr);
    bf16 t[8][kNT];
#pragma unroll
    for (int q = 0; q < 8; ++q) split3(__bfloat162float(kb[q]) * f, t[q]);  // as chunk3: k·λ^n
#pragma unroll
    for (int u = 0; u < kNT; ++u) {
      uint4 w;
      w.x = pack_raw(t[0][u], t[1][u]), w.y = pack_raw(t[2][u], t[3][u]);
      w.z = pack_raw(t[4][u], t[5][u]), w.w = pack_raw(t[6][u], t[7][u]);
      *reinterpret_cast<uint4*>(Kt + u * L::kTile + j * LX + x8) = w;
    }
  }
  __syncthreads();
  constexpr int MT = D / 16, NTL = D / 8, WPM = 8 / MT;
  constexpr int NPW = NTL / WPM > 2 ? NTL / WPM : 2;  // d 16: 1 warp, d 32: 4 warps
  const int warp = tid / 32, lane = tid % 32, qr = lane / 4, qc = (lane % 4) * 2;
  const int mt = warp / WPM, nb = (warp % WPM) * NPW;
  if (nb >= NTL) return;
  float acc[NPW][4];
#pragma unroll
  for (int n = 0; n < NPW; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  const int x0 = 16 * mt + qr, mi = lane / 8, ri = lane % 8;
#pragma unroll
  for (int ks = 0; ks < kChunk / 16; ++ks) {
    if (16 * ks >= C) break;  // rows past C are zeros
    uint32_t a[kNT][4];  // A[x][j] = K~[j][x]
#pragma unroll
    for (int u = 0; u < kNT; ++u) ldsm_at(a[u], Kt + u * L::kTile, LX, 16 * ks, 16 * mt, mi, ri);
#pragma unroll
    for (int n = 0; n < NPW; n += 2) {
      uint32_t b[4];
      ldsm_b2(b, Vs, LX, 16 * ks, 8 * (nb + n), mi, ri);
#pragma unroll
      for (int u = kNT - 1; u >= 0; --u) {
        mma16816(acc[n], a[u], b[0], b[1]);
        mma16816(acc[n + 1], a[u], b[2], b[3]);
      }
    }
  }
  float* W = ws + ((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * nh + h) * D * D;
#pragma unroll
  for (int n = 0; n < NPW; ++n) {
    const int cn = 8 * (nb + n) + qc;
    *reinterpret_cast<float2*>(W + x0 * D + cn) = make_float2(acc[n][0], acc[n][1]);
    *reinterpret_cast<float2*>(W + (x0 + 8) * D + cn) = make_float2(acc[n][2], acc[n][3]);
  }
}

// Phase 3: o_i = scale λ^(i+1) q_i S_before(c) + Σ_{j<=i} P[i][j] v_j,
// P[i][j] = scale (q_i·k_j) λ^(i-j) (j <= i < C, else 0). Warp w: rows 16 (w % 4) .. +15 (the
// m-tile), value columns (w / 4) D/2 .. +D/2; both warps of an m-tile compute its 16 x 64
// strip of Q Kᵀ (the C fragments of that MMA are the A fragments of P V, as in cuda_flash.cu).
//                                                           grid: (nh, n_seqs, window), block 256
template <int D>
__global__ void __launch_bounds__(256) gla_chunk_out_tc_kernel(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, int64_t stride,
    const DevSeq* __restrict__ seqs, const int32_t* __restrict__ list, const float* __restrict__ decay_g,
    const float* __restrict__ ws, int c_begin, float scale, bf16* __restrict__ out, int64_t ostride) {
  using L = Tc<D>;
  // NO: n-tiles of 8 in D/2 columns, loaded in pairs (d 16: the second pair member is padding
  // columns D .. D+7 of the tiles, loaded and not used)
  constexpr int LX = L::LX, XR = L::XR, NO = D / 16;
  bf16* Qs = reinterpret_cast<bf16*>(tc_smem);  // [64 i][LX]
  bf16* Vs = Qs + L::kTile;                      // [64 j][LX]
  bf16* R = Vs + L::kTile;                       // K [64 j][LX], then terms of S [kNT][XR][LX]
  __shared__ float decay[kDecayStride];
  const int h = blockIdx.x, nh = gridDim.x;
  const DevSeq s = seqs[list[blockIdx.y]];
  const int c = c_begin + int(blockIdx.z);
  if (c * kChunk >= s.num_tokens) return;
  const int C = min(kChunk, s.num_tokens - c * kChunk);
  const int64_t row0 = int64_t(s.token_begin) + int64_t(c) * kChunk;
  const int tid = threadIdx.x;
  if (tid < kDecayStride) decay[tid] = decay_g[h * kDecayStride + tid];
  for (int e = tid; e < kChunk * (D / 8); e += 256) {
    const int i = e / (D / 8), x8 = (e % (D / 8)) * 8;
    uint4 qv = make_uint4(0, 0, 0, 0), kv = qv, vv = qv;
    if (i < C) {
      const int64_t off = (row0 + i) * stride + int64_t(h) * D + x8;
      qv = *reinterpret_cast<const uint4*>(q + off);
      kv = *reinterpret_cast<const uint4*>(k + off);
      vv = *reinterpret_cast<const uint4*>(v + off);
    }
    *reinterpret_cast<uint4*>(Qs + i * LX + x8) = qv;
    *reinterpret_cast<uint4*>(R + i * LX + x8) = kv;
    *reinterpret_cast<uint4*>(Vs + i * LX + x8) = vv;
  }
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32, qr = lane / 4, qc = (lane % 4) * 2;
  const int mt = warp % 4, cb = (warp / 4) * (D / 2);
  const int i0 = 16 * mt + qr, i1 = i0 + 8, mi = lane / 8, ri = lane % 8;
  uint32_t qa[D / 16][4];  // A fragments of Q, k-steps of 16 along x
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int x0 = 16 * ks + qc;
    qa[ks][0] = *reinterpret_cast<const uint32_t*>(Qs + i0 * LX + x0);
    qa[ks][1] = *reinterpret_cast<const uint32_t*>(Qs + i1 * LX + x0);
    qa[ks][2] = *reinterpret_cast<const uint32_t*>(Qs + i0 * LX + x0 + 8);
    qa[ks][3] = *reinterpret_cast<const uint32_t*>(Qs + i1 * LX + x0 + 8);
  }
  // P: 16 x 64, n-tiles of 8 keys; keys past the m-tile's last row are masked (not computed).
  const int nmax = 2 * mt + 2;
  float p[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    p[n][0] = p[n][1] = p[n][2] = p[n][3] = 0.f;
    if (n < nmax) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const bf16* kp = R + (8 * n + qr) * LX + 16 * ks + qc;  // B[x][j] = K[j][x]
        mma16816(p[n], qa[ks], *reinterpret_cast<const uint32_t*>(kp),
                 *reinterpret_cast<const uint32_t*>(kp + 8));
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e < 2 ? i0 : i1, j = 8 * n + qc + (e & 1);
      p[n][e] = (j <= i && i < C) ? scale * p[n][e] * decay[i - j] : 0.f;  // as chunk3
    }
  }
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  // Inter-chunk part q_i S_before(c): S in parts of XR rows, each split into kNT terms in R.
  const float* Sg = ws + ((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * nh + h) * D * D;
#pragma unroll  // qa indexed by part: compile-time
  for (int part = 0; part < D / XR; ++part) {
    __syncthreads();  // K (part 0) or the previous part consumed
    for (int e = tid; e < XR * (D / 4); e += 256) {
      const int xl = e / (D / 4), c4 = (e % (D / 4)) * 4;
      const float4 f = *reinterpret_cast<const float4*>(Sg + int64_t(part * XR + xl) * D + c4);
      bf16 t0[kNT], t1[kNT], t2[kNT], t3[kNT];
      split3(f.x, t0), split3(f.y, t1), split3(f.z, t2), split3(f.w, t3);
#pragma unroll
      for (int u = 0; u < kNT; ++u)
        *reinterpret_cast<uint2*>(R + u * XR * LX + xl * LX + c4) = pack4(t0[u], t1[u], t2[u], t3[u]);
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < XR / 16; ++ks) {
#pragma unroll
      for (int n = 0; n < NO; n += 2) {
        uint32_t b[kNT][4];  // B[x][c] = S[x][c]
#pragma unroll
        for (int u = 0; u < kNT; ++u) ldsm_b2(b[u], R + u * XR * LX, LX, 16 * ks, cb + 8 * n, mi, ri);
#pragma unroll
        for (int u = kNT - 1; u >= 0; --u) {
          mma16816(o[n], qa[part * (XR / 16) + ks], b[u][0], b[u][1]);
          if (n + 1 < NO) mma16816(o[n + 1], qa[part * (XR / 16) + ks], b[u][2], b[u][3]);
        }
      }
    }
  }
  const float f0 = scale * decay[i0 + 1], f1 = scale * decay[i1 + 1];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] *= f0, o[n][1] *= f0, o[n][2] *= f1, o[n][3] *= f1;
  // Intra-chunk part P V, P in kNT terms; k-steps of 16 keys up to the m-tile's last row.
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if (kk > mt) break;
    const float* pa = p[2 * kk];
    const float* pb = p[2 * kk + 1];
    const float pv[8] = {pa[0], pa[1], pa[2], pa[3], pb[0], pb[1], pb[2], pb[3]};
    bf16 t[8][kNT];
#pragma unroll
    for (int e = 0; e < 8; ++e) split3(pv[e], t[e]);
    uint32_t af[kNT][4];
#pragma unroll
    for (int u = 0; u < kNT; ++u) {
      af[u][0] = pack_raw(t[0][u], t[1][u]), af[u][1] = pack_raw(t[2][u], t[3][u]);
      af[u][2] = pack_raw(t[4][u], t[5][u]), af[u][3] = pack_raw(t[6][u], t[7][u]);
    }
#pragma unroll
    for (int n = 0; n < NO; n += 2) {
      uint32_t b[4];
      ldsm_b2(b, Vs, LX, 16 * kk, cb + 8 * n, mi, ri);
#pragma unroll
      for (int u = kNT - 1; u >= 0; --u) {
        mma16816(o[n], af[u], b[0], b[1]);
        if (n + 1 < NO) mma16816(o[n + 1], af[u], b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    const int cn = cb + 8 * n + qc;
    if (i0 < C) {
      bf16* dst = out + (row0 + i0) * ostride + int64_t(h) * D + cn;
      dst[0] = f2b(o[n][0]);
      dst[1] = f2b(o[n][1]);
    }
    if (i1 < C) {
      bf16* dst = out + (row0 + i1) * ostride + int64_t(h) * D + cn;
      dst[0] = f2b(o[n][2]);
      dst[1] = f2b(o[n][3]);
    }
  }
}

}  // namespace

template <int D>
void launch_gla_state_tc(const GlaArgs<bf16>& a, const int32_t* list, unsigned n, unsigned window,
                         int c_begin, cudaStream_t st) {
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(gla_chunk_state_tc_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    Tc<D>::kP1Bytes));
    attr_set = true;
  }
  gla_chunk_state_tc_kernel<D><<<dim3(unsigned(a.nh), n, window), 256, Tc<D>::kP1Bytes, st>>>(
      a.k, a.v, a.stride, a.seqs, list, a.decay, a.ws, c_begin);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_gla_out_tc(const GlaArgs<bf16>& a, const int32_t* list, unsigned n, unsigned window,
                       int c_begin, cudaStream_t st) {
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(gla_chunk_out_tc_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    Tc<D>::kP3Bytes));
    attr_set = true;
  }
  gla_chunk_out_tc_kernel<D><<<dim3(unsigned(a.nh), n, window), 256, Tc<D>::kP3Bytes, st>>>(
      a.q, a.k, a.v, a.stride, a.seqs, list, a.decay, a.ws, c_begin, a.scale, a.out, a.ostride);
  CUDA_CHECK_LAUNCH();
}

#define SALA_GLA_TC(D)                                                                             \
  template void launch_gla_state_tc<D>(const GlaArgs<bf16>&, const int32_t*, unsigned, unsigned, int, \
                                       cudaStream_t);                                              \
  template void launch_gla_out_tc<D>(const GlaArgs<bf16>&, const int32_t*, unsigned, unsigned, int,   \
                                     cudaStream_t);
SALA_GLA_TC(16)
SALA_GLA_TC(32)
SALA_GLA_TC(64)
SALA_GLA_TC(128)
#undef SALA_GLA_TC

}  // namespace sala::cuda
