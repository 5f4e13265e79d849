// Lightning layers, long calls (>= 64 tokens), bf16 mode: the chunked simple GLA (SPEC §8) as
// one pass over the call's chunks of 64 per (sequence, head, 32 value columns), on the tensor
// cores (mma.sync m16n8k16 bf16 -> fp32; fragment layouts: cuda_mma.cuh). Per chunk c of C
// tokens, with the state S entering it (fp32 [D rows x][D columns c]):
//   o_i = scale λ^(i+1) q_i S + Σ_{j<=i} P[i][j] v_j,   P[i][j] = scale (q_i·k_j) λ^(i-j)
//   S  <- λ^C S + Σ_j k_jᵀ (λ^(C-1-j) v_j)
// The state never leaves the registers between chunks: each warp keeps Sᵀ for 16 value columns
// and a group of state rows as the C fragments of an m16 (columns) x n XW (rows) MMA tile, which
// are the A fragments of its part of oᵀ = Sᵀ qᵀ (as flash attention reuses P) and the
// accumulator of the update. The 3-phase form this replaces (phase 1 per chunk, a scan over
// chunks, phase 3 per chunk) wrote and read every chunk's fp32 state through a workspace
// (≈ 256 MB per 2,048-token call of the 9B model's 32 heads).
//
// Numerics (as the 3-phase tensor-core kernels): q, k, v are exact bf16 MMA inputs; the fp32
// operands (Sᵀ, the masked decayed scores P, the decayed values λ^n v_j) are split into three
// bf16 terms x = hi + lo + lo2 (exact for every normal fp32 x away from the underflow
// threshold, CudaLightningTc.SplitEmulation), one MMA per term, smallest first, so every
// product is exact and only the order of the fp32 sums differs from the CPU's fmaf chains.
//
// Block (d 128): 8 warps = 2 groups of 16 value columns x 4 groups of 32 state rows, 4 blocks
// per head. Per chunk: P = scale QKᵀ λ^(i-j) (causal) in 10 units of 16 x 16 over the warps and
// the decayed V's fragments, both through shared memory in kNT terms; each warp's part of oᵀ
// (its state rows' inter-chunk part, a share of the intra-chunk units) summed in shared
// memory; then the state update. Q, K and the block's V columns of the next chunk load by
// cp.async meanwhile. Chunks of 64 are aligned at the call's first token, as CpuBackend and
// HF do. No GPU at hand: scripts/gla_tc_sim/run.sh runs this kernel on the host (emulated
// mma / ldmatrix) against a double reference.
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_smem_optin.h"
#include "backend/gla.h"

namespace sala::cuda {

namespace {

constexpr int kChunk = kGlaChunk;              // 64 tokens
constexpr int kDecayStride = kGlaDecayStride;  // decay[h][n] = exp(n g) = λ^n, n = 0..64
constexpr int kNT = 3;                          // bf16 terms per fp32 operand

// Block: a head's CB value columns (16 per column group) x its D state rows (XW per warp):
// warp (cg, xq) keeps Sᵀ[16 columns][XW rows]. Shared-memory tiles are bf16 [rows][cols + 8]:
// the padding puts the 8 rows that one ldmatrix phase reads in distinct banks (row strides of
// 68, 20 and 36 words); the fp32 partial outputs have rows of CB + 4 floats (36 words).
template <int D>
struct SeqTc {
  static constexpr int XW = D < 32 ? D : 32;  // state rows per warp
  static constexpr int XS = D / XW;           // warps along the state rows
  static constexpr int CG = D >= 32 ? 2 : 1;  // column groups of 16 per block
  static constexpr int NW = CG * XS;          // warps per block
  static constexpr int CB = 16 * CG;          // value columns per block
  static constexpr int LX = D + 8;            // Q, K tiles [64][LX]
  static constexpr int LV = CB + 8;           // V tile [64][LV]
  static constexpr int LP = kChunk + 8;       // P terms [64 i][LP]
  static constexpr int LR = CB + 4;           // partial outputs [XS][64 i][LR], fp32
  static constexpr int kStage = 2 * kChunk * LX + kChunk * LV;  // halves: Q, K, V of a chunk
  // the decayed V's A fragments [CG][4 k-steps][kNT][32 lanes] as uint4
  static constexpr int kVaBytes = CG * 4 * kNT * 32 * 16;
  static constexpr int kBytes = (2 * kStage + kNT * kChunk * LP) * 2 + XS * kChunk * LR * 4 + kVaBytes;
};

extern __shared__ __align__(16) unsigned char seq_smem[];

// Two fp32 values as kNT packed bf16 pairs, x = hi + lo + lo2 per value (term u of both in
// out[u * step]); a pair per conversion instruction.
__device__ __forceinline__ uint32_t bits(__nv_bfloat162 t) { return *reinterpret_cast<uint32_t*>(&t); }
__device__ __forceinline__ void split_pair(float lo, float hi, uint32_t* out, int step) {
  const __nv_bfloat162 t0 = __floats2bfloat162_rn(lo, hi);
  const float2 f0 = __bfloat1622float2(t0);
  const float r0 = lo - f0.x, r1 = hi - f0.y;
  const __nv_bfloat162 t1 = __floats2bfloat162_rn(r0, r1);
  const float2 f1 = __bfloat1622float2(t1);
  out[0] = bits(t0), out[step] = bits(t1), out[2 * step] = bits(__floats2bfloat162_rn(r0 - f1.x, r1 - f1.y));
}

__device__ __forceinline__ float2 unpack_bf16(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// Lane address of ldmatrix.x4 (not transposed) for B fragments of two n-tiles from a
// row-major tile t[n][k] (B[k][n] = t[n][k]): r0, r1 = b0, b1 of rows n0 .. n0+7, r2, r3 of
// n0+8 .. n0+15, k0 .. k0+15.
__device__ __forceinline__ const bf16* ldsm_bn_addr(const bf16* t, int ld, int n0, int k0, int mi, int ri) {
  return t + (n0 + (mi >> 1) * 8 + ri) * ld + k0 + (mi & 1) * 8;
}

// The 10 (m-tile, key-tile pair) units of P's causal 64 x 64: unit u -> m-tile mt, pair n2 <= mt.
__device__ __forceinline__ void p_unit(int u, int& mt, int& n2) {
  mt = u < 1 ? 0 : u < 3 ? 1 : u < 6 ? 2 : 3;
  n2 = u - mt * (mt + 1) / 2;
}

//                                grid: (D / CB blocks per head, nh, n seqs of list), block 32 NW
template <int D>
__global__ void __launch_bounds__(SeqTc<D>::NW * 32) gla_seq_tc_kernel(
    const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, int64_t stride,
    const DevSeq* __restrict__ seqs, const int32_t* __restrict__ list, float* __restrict__ states,
    int64_t slot_stride, int64_t layer_off, const float* __restrict__ decay_g, float scale,
    bf16* __restrict__ out, int64_t ostride) {
  using L = SeqTc<D>;
  constexpr int LX = L::LX, LV = L::LV, LP = L::LP, LR = L::LR, XW = L::XW, NTH = L::NW * 32;
  bf16* const stage0 = reinterpret_cast<bf16*>(seq_smem);  // 2 x {Q [64][LX], K [64][LX], V [64][LV]}
  bf16* const Ps = stage0 + 2 * L::kStage;                  // [kNT][64 i][LP]
  float* const Red = reinterpret_cast<float*>(Ps + kNT * kChunk * LP);  // [XS][64 i][LR]
  uint4* const Va = reinterpret_cast<uint4*>(Red + L::XS * kChunk * LR);  // [CG][4][kNT][32]
  __shared__ float decay[kDecayStride];
  const int h = blockIdx.y;
  const DevSeq s = seqs[list[blockIdx.z]];
  const int col0 = int(blockIdx.x) * L::CB;  // the block's first value column in the head
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int cg = warp % L::CG, xq = warp / L::CG;  // the warp's column group and state rows
  const int qr = lane / 4, qc = (lane % 4) * 2, mi = lane / 8, ri = lane % 8;
  const int nc = (s.num_tokens + kChunk - 1) / kChunk;
  for (int e = tid; e < kDecayStride; e += NTH) decay[e] = decay_g[h * kDecayStride + e];

  // Q, K rows (all D) and the block's V columns of chunk c; rows past the call are zeros.
  const auto load_chunk = [&](int c, bf16* st) {
    const int C = min(kChunk, s.num_tokens - c * kChunk);
    const int64_t row0 = int64_t(s.token_begin) + int64_t(c) * kChunk;
    for (int e = tid; e < kChunk * (D / 8); e += NTH) {
      const int i = e / (D / 8), x8 = (e % (D / 8)) * 8;
      const int64_t off = (row0 + (i < C ? i : 0)) * stride + int64_t(h) * D + x8;
      cp_async16(st + i * LX + x8, q + off, i < C ? 16 : 0);
      cp_async16(st + (kChunk + i) * LX + x8, k + off, i < C ? 16 : 0);
    }
    bf16* Vs = st + 2 * kChunk * LX;
    for (int e = tid; e < kChunk * (L::CB / 8); e += NTH) {
      const int j = e / (L::CB / 8), c8 = (e % (L::CB / 8)) * 8;
      const int64_t off = (row0 + (j < C ? j : 0)) * stride + int64_t(h) * D + col0 + c8;
      cp_async16(Vs + j * LV + c8, v + off, j < C ? 16 : 0);
    }
    cp_async_commit();
  };
  load_chunk(0, stage0);

  // Sᵀ of the warp's 16 value columns cw .. cw+15 and state rows x0 .. x0+XW-1: S[n] is the C
  // fragment of rows x0+8n .. +7: S[n][0..1] = S[x0+8n+qc, +1][cw+qr], S[n][2..3] = column +8.
  const int cw = col0 + 16 * cg, x0 = XW * xq;
  const float* const Sg = states + int64_t(s.state_slot) * slot_stride + layer_off + int64_t(h) * D * D;
  float S[XW / 8][4];
#pragma unroll
  for (int n = 0; n < XW / 8; ++n) {
    const float* p = Sg + (x0 + 8 * n + qc) * D + cw + qr;
    const bool carry = s.past_len > 0;
    S[n][0] = carry ? p[0] : 0.f, S[n][1] = carry ? p[D] : 0.f;
    S[n][2] = carry ? p[8] : 0.f, S[n][3] = carry ? p[D + 8] : 0.f;
  }

  for (int c = 0; c < nc; ++c) {
    if (c + 1 < nc) {
      load_chunk(c + 1, stage0 + ((c + 1) & 1) * L::kStage);  // its buffer's reads ended at c-1
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* Qs = stage0 + (c & 1) * L::kStage;
    const bf16* Ks = Qs + kChunk * LX;
    const bf16* Vs = Ks + kChunk * LX;
    const int C = min(kChunk, s.num_tokens - c * kChunk);

    // P in units of 16 tokens x 16 keys (keys up to the unit's last row), kNT terms to Ps
    // (zeros where j > i or i >= C).
    for (int u = warp; u < 10; u += L::NW) {
      int mt, n2;
      p_unit(u, mt, n2);
      float p[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a[4], b[4];  // A = Q rows 16 mt .., B[x][j] = K[j][x], x = 16 ks ..
        ldmatrix_x4(a, Qs + (16 * mt + (mi & 1) * 8 + ri) * LX + 16 * ks + (mi >> 1) * 8);
        ldmatrix_x4(b, ldsm_bn_addr(Ks, LX, 16 * n2, 16 * ks, mi, ri));
        mma16816(p[0], a, b[0], b[1]);
        mma16816(p[1], a, b[2], b[3]);
      }
      const int i0 = 16 * mt + qr, i1 = i0 + 8;
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int n = 2 * n2 + h2;
        float f[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e < 2 ? i0 : i1, j = 8 * n + qc + (e & 1);
          f[e] = (j <= i && i < C) ? scale * p[h2][e] * decay[i - j] : 0.f;  // as chunk3
        }
        uint32_t w0[kNT], w1[kNT];
        split_pair(f[0], f[1], w0, 1);
        split_pair(f[2], f[3], w1, 1);
#pragma unroll
        for (int t = 0; t < kNT; ++t) {
          *reinterpret_cast<uint32_t*>(Ps + (t * kChunk + i0) * LP + 8 * n + qc) = w0[t];
          *reinterpret_cast<uint32_t*>(Ps + (t * kChunk + i1) * LP + 8 * n + qc) = w1[t];
        }
      }
    }
    // A fragments of Vᵀ (M = the group's 16 columns, K = tokens j), 4 k-steps of 16 tokens.
    uint32_t vf[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      ldmatrix_x4_trans(vf[kk], Vs + (16 * kk + ri + (mi >> 1) * 8) * LV + 16 * cg + (mi & 1) * 8);
    // The state update's A operand, the decayed Vᵀ (λ^(C-1-j) v_j) in kNT terms: k-step kk by
    // the group's warp xq ≡ kk (mod XS), for all of the group through Va.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (kk % L::XS != xq || 16 * kk >= C) continue;
      uint32_t va[kNT][4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int j = 16 * kk + qc + (r >= 2 ? 8 : 0);
        const float2 x = unpack_bf16(vf[kk][r]);
        const float f0 = j < C ? decay[C - 1 - j] : 0.f, f1 = j + 1 < C ? decay[C - 2 - j] : 0.f;
        split_pair(x.x * f0, x.y * f1, &va[0][r], 4);
      }
#pragma unroll
      for (int t = 0; t < kNT; ++t)
        Va[((cg * 4 + kk) * kNT + t) * 32 + lane] = make_uint4(va[t][0], va[t][1], va[t][2], va[t][3]);
    }
    __syncthreads();  // Ps and Va complete

    // oᵀ (M = 16 columns, N = 64 tokens), this warp's part: the inter-chunk part over its
    // state rows, Sᵀ qᵀ with A = Sᵀ split from registers, scaled by scale λ^(i+1) ...
    float o[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < XW / 16; ++ks) {
      uint32_t sa[kNT][4];
      split_pair(S[2 * ks][0], S[2 * ks][1], &sa[0][0], 4);
      split_pair(S[2 * ks][2], S[2 * ks][3], &sa[0][1], 4);
      split_pair(S[2 * ks + 1][0], S[2 * ks + 1][1], &sa[0][2], 4);
      split_pair(S[2 * ks + 1][2], S[2 * ks + 1][3], &sa[0][3], 4);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        uint32_t b[4];  // B[x][i] = Q[i][x]
        ldmatrix_x4(b, ldsm_bn_addr(Qs, LX, 16 * m, x0 + 16 * ks, mi, ri));
#pragma unroll
        for (int t = kNT - 1; t >= 0; --t) {
          mma16816(o[2 * m], sa[t], b[0], b[1]);
          mma16816(o[2 * m + 1], sa[t], b[2], b[3]);
        }
      }
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float f0 = scale * decay[8 * n + qc + 1], f1 = scale * decay[8 * n + qc + 2];
      o[n][0] *= f0, o[n][1] *= f1, o[n][2] *= f0, o[n][3] *= f1;
    }
    // ... and units of the intra-chunk part Vᵀ Pᵀ: token n-tiles 2m, 2m+1 x keys 16 kk .. +15
    // (kk <= m), unit m (m + 1) / 2 + kk for the warp xq ≡ it (mod XS).
#pragma unroll
    for (int m = 0; m < 4; ++m) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kk > m) break;
        if ((m * (m + 1) / 2 + kk) % L::XS != xq) continue;
        uint32_t b[kNT][4];  // B[j][i] = P[i][j]
#pragma unroll
        for (int t = 0; t < kNT; ++t) ldmatrix_x4(b[t], ldsm_bn_addr(Ps + t * kChunk * LP, LP, 16 * m, 16 * kk, mi, ri));
#pragma unroll
        for (int t = kNT - 1; t >= 0; --t) {
          mma16816(o[2 * m], vf[kk], b[t][0], b[t][1]);
          mma16816(o[2 * m + 1], vf[kk], b[t][2], b[t][3]);
        }
      }
    }
    // The warp's part of oᵀ to Red[xq][i][column].
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      float* d = Red + (xq * kChunk + 8 * n + qc) * LR + 16 * cg + qr;
      d[0] = o[n][0], d[LR] = o[n][1], d[8] = o[n][2], d[LR + 8] = o[n][3];
    }

    // The state update: Sᵀ = λ^C Sᵀ + (λ^(C-1-j) v_j)ᵀ K, A = the decayed Vᵀ in kNT terms.
    const float lc = decay[C];
#pragma unroll
    for (int n = 0; n < XW / 8; ++n) S[n][0] *= lc, S[n][1] *= lc, S[n][2] *= lc, S[n][3] *= lc;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (16 * kk >= C) break;  // rows past C are zeros
      uint32_t va[kNT][4];
#pragma unroll
      for (int t = 0; t < kNT; ++t) {
        const uint4 w = Va[((cg * 4 + kk) * kNT + t) * 32 + lane];
        va[t][0] = w.x, va[t][1] = w.y, va[t][2] = w.z, va[t][3] = w.w;
      }
#pragma unroll
      for (int nx = 0; nx < XW / 16; ++nx) {
        uint32_t b[4];  // B[j][x] = K[j][x]: state rows x0 + 16 nx .. +15
        ldmatrix_x4_trans(b, Ks + (16 * kk + ri + (mi & 1) * 8) * LX + x0 + 16 * nx + (mi >> 1) * 8);
#pragma unroll
        for (int t = kNT - 1; t >= 0; --t) {
          mma16816(S[2 * nx], va[t], b[0], b[1]);
          mma16816(S[2 * nx + 1], va[t], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // Red complete; Q, K, V of this chunk, Ps and Va no longer read
    // o = the sum of the warps' parts (state-row groups in order), rounded to bf16.
    const int64_t row0 = int64_t(s.token_begin) + int64_t(c) * kChunk;
    for (int e = tid; e < C * (L::CB / 8); e += NTH) {
      const int i = e / (L::CB / 8), c8 = (e % (L::CB / 8)) * 8;
      float acc[8];
#pragma unroll
      for (int t = 0; t < 8; ++t) acc[t] = 0.f;
#pragma unroll
      for (int g = 0; g < L::XS; ++g) {
        const float4* r = reinterpret_cast<const float4*>(Red + (g * kChunk + i) * LR + c8);
        const float4 r0 = r[0], r1 = r[1];
        acc[0] += r0.x, acc[1] += r0.y, acc[2] += r0.z, acc[3] += r0.w;
        acc[4] += r1.x, acc[5] += r1.y, acc[6] += r1.z, acc[7] += r1.w;
      }
      uint4 w;
      w.x = pack_bf16(acc[0], acc[1]), w.y = pack_bf16(acc[2], acc[3]);
      w.z = pack_bf16(acc[4], acc[5]), w.w = pack_bf16(acc[6], acc[7]);
      *reinterpret_cast<uint4*>(out + (row0 + i) * ostride + int64_t(h) * D + col0 + c8) = w;
    }
  }
  // The state after the call goes to s.state_dst_slot (another slot in speculative verify calls).
  float* const Sd = states + int64_t(s.state_dst_slot) * slot_stride + layer_off + int64_t(h) * D * D;
#pragma unroll
  for (int n = 0; n < XW / 8; ++n) {
    float* p = Sd + (x0 + 8 * n + qc) * D + cw + qr;
    p[0] = S[n][0], p[D] = S[n][1], p[8] = S[n][2], p[D + 8] = S[n][3];
  }
}

}  // namespace

template <int D>
void launch_gla_seq_tc(const GlaArgs<bf16>& a, const int32_t* list, int n, cudaStream_t st) {
  using L = SeqTc<D>;
  static SmemOptIn optin;  // per device
  optin.raise(gla_seq_tc_kernel<D>, size_t(L::kBytes));
  gla_seq_tc_kernel<D><<<dim3(unsigned(D / L::CB), unsigned(a.nh), unsigned(n)), L::NW * 32, L::kBytes, st>>>(
      a.q, a.k, a.v, a.stride, a.seqs, list, a.states, a.slot_stride, a.layer_off, a.decay, a.scale, a.out,
      a.ostride);
  CUDA_CHECK_LAUNCH();
}

#define SALA_GLA_SEQ_TC(D) \
  template void launch_gla_seq_tc<D>(const GlaArgs<bf16>&, const int32_t*, int, cudaStream_t);
SALA_GLA_SEQ_TC(16)
SALA_GLA_SEQ_TC(32)
SALA_GLA_SEQ_TC(64)
SALA_GLA_SEQ_TC(128)
#undef SALA_GLA_SEQ_TC

}  // namespace sala::cuda
