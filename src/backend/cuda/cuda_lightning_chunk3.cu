// Lightning layers, long calls, fp32 mode: the chunk-parallel (3-phase) form of simple GLA
// (SPEC §8) for CudaBackend::lightning_attention (cuda_lightning.cu dispatches; bf16 mode runs
// cuda_lightning_seq_tc.cu). The kernels keep the storage type T of q, k, v, o as a template
// parameter; only float is instantiated.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/gla.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {

namespace {

constexpr int kChunk = kGlaChunk;  // the HF / CpuBackend chunk
constexpr int kDecayStride = kGlaDecayStride;  // decay[h][n] = exp(n g), n = 0..64

// ---- chunk-parallel form (3 phases), used for every long call ------------------------------
// The state recurrence over chunks of 64 is linear, so it splits into
//   1. per chunk c (all chunks at once):  ΔS_c = Σ_j λ^(C-1-j) k_jᵀ v_j        (d x d, fp32)
//   2. a scan over chunks, parallel over the d² state entries of each head:
//        S_before(c) = state entering chunk c,  S_before(c+1) = λ^C S_before(c) + ΔS_c
//   3. per chunk c (all chunks at once):
//        o_i = scale λ^(i+1) q_i S_before(c) + Σ_{j<=i} scale (q_i·k_j) λ^(i-j) v_j
// Phase 1 writes ΔS_c into a workspace of (window chunks x seqs x nh) states, phase 2
// replaces each by S_before(c) in place and leaves the final state in the slot, phase 3 reads
// it. The host walks the chunks in windows that fit the workspace (one window for a 4K
// prompt). fp32 throughout; register tiles of 256 threads as (tr, tc) = 16 x 16.
template <int D>
struct Chunk3 {
  static constexpr int RX = D / 16;                     // state rows per thread (phase 1)
  static constexpr int CW = D / 16;                     // value columns per thread
  static constexpr bool V4 = D >= 64;                   // columns as float4 groups
  __device__ static int col(int tc, int i) { return V4 ? 4 * tc + 64 * (i / 4) + i % 4 : tc + 16 * i; }
  static constexpr int kP1Floats = 2 * kChunk * D;     // K~ [64][D], V [64][D]
  // Qt [D][64], R [D][64] (Kt, then half of S: D/2 x D), V [64][D], At [64][64], decay
  static constexpr int kP3Floats = 3 * kChunk * D + kChunk * kChunk + 68;
};

// 8 consecutive floats (32 bytes, 16-byte aligned) as they are (fp32 mode).
__device__ __forceinline__ void load8(const float* p, float (&f)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

template <int N>
__device__ __forceinline__ void lds(const float* p, float* dst, bool vec) {
  if (vec) {
#pragma unroll
    for (int q = 0; q < N / 4; ++q) {
      const float4 t = *reinterpret_cast<const float4*>(p + 4 * q);
      dst[4 * q] = t.x, dst[4 * q + 1] = t.y, dst[4 * q + 2] = t.z, dst[4 * q + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int q = 0; q < N; ++q) dst[q] = p[q];
  }
}

// Phase 1.                                                  grid: (nh, n_seqs, window), block 256
template <typename T, int D>
__global__ void __launch_bounds__(256) gla_chunk_state_kernel(
    const T* __restrict__ k, const T* __restrict__ v, int64_t stride,
    const DevSeq* __restrict__ seqs, const int32_t* __restrict__ list, const float* __restrict__ decay_g,
    float* __restrict__ ws, int c_begin) {
  using L = Chunk3<D>;
  extern __shared__ float sm[];
  float* Ks = sm;                // [64][D], k_j λ^(C-1-j)
  float* Vs = Ks + kChunk * D;   // [64][D]
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
    float kf[8], vf[8];
    if (j < C) {
      const int64_t off = (row0 + j) * stride + int64_t(h) * D + x8;
      load8(k + off, kf);
      load8(v + off, vf);
      const float f = decay[C - 1 - j];
#pragma unroll
      for (int q = 0; q < 8; ++q) kf[q] *= f;
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) kf[q] = vf[q] = 0.f;
    }
#pragma unroll
    for (int q = 0; q < 8; ++q) Ks[j * D + x8 + q] = kf[q], Vs[j * D + x8 + q] = vf[q];
  }
  __syncthreads();
  const int tr = tid / 16, tc = tid % 16;
  float acc[L::RX][L::CW];
#pragma unroll
  for (int a = 0; a < L::RX; ++a)
#pragma unroll
    for (int i = 0; i < L::CW; ++i) acc[a][i] = 0.f;
  for (int j = 0; j < C; ++j) {
    float kx[L::RX], vy[L::CW];
    lds<L::RX>(Ks + j * D + L::RX * tr, kx, L::RX % 4 == 0);
    if constexpr (L::V4) {
#pragma unroll
      for (int b = 0; b < L::CW / 4; ++b) lds<4>(Vs + j * D + 4 * tc + 64 * b, vy + 4 * b, true);
    } else {
#pragma unroll
      for (int i = 0; i < L::CW; ++i) vy[i] = Vs[j * D + tc + 16 * i];
    }
#pragma unroll
    for (int a = 0; a < L::RX; ++a)
#pragma unroll
      for (int i = 0; i < L::CW; ++i) acc[a][i] = fmaf(kx[a], vy[i], acc[a][i]);
  }
  float* W = ws + ((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * nh + h) * D * D;
#pragma unroll
  for (int a = 0; a < L::RX; ++a)
#pragma unroll
    for (int i = 0; i < L::CW; ++i) W[(L::RX * tr + a) * D + L::col(tc, i)] = acc[a][i];
}

// Phase 2.                                     grid: (ceil(D*D / 256), nh, n_seqs), block 256
template <int D>
__global__ void __launch_bounds__(256) gla_chunk_scan_kernel(
    const DevSeq* __restrict__ seqs, const int32_t* __restrict__ list, float* __restrict__ states,
    int64_t slot_stride, int64_t layer_off, const float* __restrict__ decay_g, float* __restrict__ ws,
    int c_begin, int window) {
  const int e = blockIdx.x * 256 + threadIdx.x;
  if (e >= D * D) return;
  const int h = blockIdx.y, nh = gridDim.y;
  const DevSeq s = seqs[list[blockIdx.z]];
  const int nc = (s.num_tokens + kChunk - 1) / kChunk;
  if (c_begin >= nc) return;
  float* Sg = states + int64_t(s.state_slot) * slot_stride + layer_off + int64_t(h) * D * D;
  float S = (s.past_len == 0 && c_begin == 0) ? 0.f : Sg[e];
  const int cend = min(nc, c_begin + window);
  const float* decay = decay_g + h * kDecayStride;
  const int64_t cstride = int64_t(gridDim.z) * nh * D * D;
  float* p = ws + (int64_t(blockIdx.z) * nh + h) * D * D + e;
  // Batches of 8 loads in flight (the state chain itself is cheap).
  for (int c8 = c_begin; c8 < cend; c8 += 8) {
    float dS[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) dS[u] = c8 + u < cend ? p[u * cstride] : 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int c = c8 + u;
      if (c >= cend) break;
      p[u * cstride] = S;
      S = decay[min(kChunk, s.num_tokens - c * kChunk)] * S + dS[u];
    }
    p += 8 * cstride;
  }
  Sg[e] = S;
}

// Phase 3.                                                  grid: (nh, n_seqs, window), block 256
template <typename T, int D>
__global__ void __launch_bounds__(256) gla_chunk_out_kernel(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, int64_t stride,
    const DevSeq* __restrict__ seqs, const int32_t* __restrict__ list, const float* __restrict__ decay_g,
    const float* __restrict__ ws, int c_begin, float scale, T* __restrict__ out, int64_t ostride) {
  using L = Chunk3<D>;
  extern __shared__ float sm[];
  float* Qt = sm;                    // [D][64]
  float* R = Qt + D * kChunk;        // Kt [D][64], then S rows [D/2][D]
  float* Vs = R + D * kChunk;        // [64][D]
  float* At = Vs + kChunk * D;       // [64 j][64 i]
  float* decay = At + kChunk * kChunk;
  const int h = blockIdx.x, nh = gridDim.x;
  const DevSeq s = seqs[list[blockIdx.y]];
  const int c = c_begin + int(blockIdx.z);
  if (c * kChunk >= s.num_tokens) return;
  const int C = min(kChunk, s.num_tokens - c * kChunk);
  const int64_t row0 = int64_t(s.token_begin) + int64_t(c) * kChunk;
  const int tid = threadIdx.x, tr = tid / 16, tc = tid % 16;
  if (tid < kDecayStride) decay[tid] = decay_g[h * kDecayStride + tid];
  // q, k transposed (lanes along tokens: conflict-free stores), v as is.
  for (int e = tid; e < kChunk * (D / 8); e += 256) {
    const int i = e % kChunk, x8 = (e / kChunk) * 8;
    float qf[8], kf[8];
    if (i < C) {
      const int64_t off = (row0 + i) * stride + int64_t(h) * D + x8;
      load8(q + off, qf);
      load8(k + off, kf);
    } else {
#pragma unroll
      for (int t = 0; t < 8; ++t) qf[t] = kf[t] = 0.f;
    }
#pragma unroll
    for (int t = 0; t < 8; ++t) Qt[(x8 + t) * kChunk + i] = qf[t], R[(x8 + t) * kChunk + i] = kf[t];
  }
  for (int e = tid; e < kChunk * (D / 8); e += 256) {
    const int j = e / (D / 8), x8 = (e % (D / 8)) * 8;
    float vf[8];
    if (j < C) {
      load8(v + (row0 + j) * stride + int64_t(h) * D + x8, vf);
    } else {
#pragma unroll
      for (int t = 0; t < 8; ++t) vf[t] = 0.f;
    }
#pragma unroll
    for (int t = 0; t < 8; ++t) Vs[j * D + x8 + t] = vf[t];
  }
  __syncthreads();
  // A[i][j] = scale (q_i·k_j) λ^(i-j) for j <= i < C, else 0; stored as At[j][i].
  {
    float a[4][4];
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) a[ii][jj] = 0.f;
    for (int x = 0; x < D; ++x) {
      const float4 qa = *reinterpret_cast<const float4*>(Qt + x * kChunk + 4 * tr);
      const float4 ka = *reinterpret_cast<const float4*>(R + x * kChunk + 4 * tc);
      const float qv[4] = {qa.x, qa.y, qa.z, qa.w}, kv[4] = {ka.x, ka.y, ka.z, ka.w};
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) a[ii][jj] = fmaf(qv[ii], kv[jj], a[ii][jj]);
    }
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int i = 4 * tr + ii, j = 4 * tc + jj;
        At[j * kChunk + i] = (j <= i && i < C) ? scale * a[ii][jj] * decay[i - j] : 0.f;
      }
  }
  float o[4][L::CW];
#pragma unroll
  for (int ii = 0; ii < 4; ++ii)
#pragma unroll
    for (int t = 0; t < L::CW; ++t) o[ii][t] = 0.f;
  // Inter-chunk part q_i S_before(c), with S streamed through R in two halves of rows.
  const float* Sg = ws + ((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * nh + h) * D * D;
  for (int half = 0; half < 2; ++half) {
    __syncthreads();
    const float4* src = reinterpret_cast<const float4*>(Sg + half * (D / 2) * D);
    for (int e = tid; e < D * D / 8; e += 256) reinterpret_cast<float4*>(R)[e] = src[e];
    __syncthreads();
    for (int xl = 0; xl < D / 2; ++xl) {
      const float4 qa = *reinterpret_cast<const float4*>(Qt + (half * (D / 2) + xl) * kChunk + 4 * tr);
      const float qv[4] = {qa.x, qa.y, qa.z, qa.w};
      float sv[L::CW];
      if constexpr (L::V4) {
#pragma unroll
        for (int b = 0; b < L::CW / 4; ++b) lds<4>(R + xl * D + 4 * tc + 64 * b, sv + 4 * b, true);
      } else {
#pragma unroll
        for (int t = 0; t < L::CW; ++t) sv[t] = R[xl * D + tc + 16 * t];
      }
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int t = 0; t < L::CW; ++t) o[ii][t] = fmaf(qv[ii], sv[t], o[ii][t]);
    }
  }
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    const float f = scale * decay[4 * tr + ii + 1];
#pragma unroll
    for (int t = 0; t < L::CW; ++t) o[ii][t] *= f;
  }
  // Intra-chunk part Σ_{j<=i} A[i][j] v_j.
  const int jend = min(C, 4 * tr + 4);
  for (int j = 0; j < jend; ++j) {
    const float4 aa = *reinterpret_cast<const float4*>(At + j * kChunk + 4 * tr);
    const float av[4] = {aa.x, aa.y, aa.z, aa.w};
    float vy[L::CW];
    if constexpr (L::V4) {
#pragma unroll
      for (int b = 0; b < L::CW / 4; ++b) lds<4>(Vs + j * D + 4 * tc + 64 * b, vy + 4 * b, true);
    } else {
#pragma unroll
      for (int t = 0; t < L::CW; ++t) vy[t] = Vs[j * D + tc + 16 * t];
    }
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int t = 0; t < L::CW; ++t) o[ii][t] = fmaf(av[ii], vy[t], o[ii][t]);
  }
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    const int i = 4 * tr + ii;
    if (i >= C) break;
#pragma unroll
    for (int t = 0; t < L::CW; ++t)
      out[(row0 + i) * ostride + int64_t(h) * D + L::col(tc, t)] = cvt<T>(o[ii][t]);
  }
}

}  // namespace

template <int D>
void launch_gla_chunk3(const GlaArgs<float>& a, const int32_t* long_list, int n_long, cudaStream_t st) {
  using T = float;
  using L = Chunk3<D>;
  static SmemOptIn state_optin, out_optin;  // per device
  state_optin.raise(gla_chunk_state_kernel<T, D>, size_t(L::kP1Floats) * 4);
  out_optin.raise(gla_chunk_out_kernel<T, D>, size_t(L::kP3Floats) * 4);
  const int64_t per_state = int64_t(a.nh) * D * D;
  const int group = int(std::max<int64_t>(1, std::min<int64_t>(n_long, a.ws_floats / per_state)));
  const int window = int(std::max<int64_t>(1, std::min<int64_t>(a.max_chunks, a.ws_floats / (per_state * group))));
  for (int g0 = 0; g0 < n_long; g0 += group) {
    const int cnt = std::min(group, n_long - g0);
    const int32_t* list = long_list + g0;
    for (int c0 = 0; c0 < a.max_chunks; c0 += window) {
      const unsigned w = unsigned(std::min(window, a.max_chunks - c0));
      gla_chunk_state_kernel<T, D><<<dim3(unsigned(a.nh), unsigned(cnt), w), 256, L::kP1Floats * 4, st>>>(
          a.k, a.v, a.stride, a.seqs, list, a.decay, a.ws, c0);
      CUDA_CHECK_LAUNCH();
      gla_chunk_scan_kernel<D><<<dim3(unsigned((D * D + 255) / 256), unsigned(a.nh), unsigned(cnt)), 256, 0,
                                 st>>>(a.seqs, list, a.states, a.slot_stride, a.layer_off, a.decay, a.ws,
                                       c0, int(w));
      CUDA_CHECK_LAUNCH();
      gla_chunk_out_kernel<T, D><<<dim3(unsigned(a.nh), unsigned(cnt), w), 256, L::kP3Floats * 4, st>>>(
          a.q, a.k, a.v, a.stride, a.seqs, list, a.decay, a.ws, c0, a.scale, a.out, a.ostride);
      CUDA_CHECK_LAUNCH();
    }
  }
}


#define SALA_GLA_CHUNK3(D) \
  template void launch_gla_chunk3<D>(const GlaArgs<float>&, const int32_t*, int, cudaStream_t);
SALA_GLA_CHUNK3(16)
SALA_GLA_CHUNK3(32)
SALA_GLA_CHUNK3(64)
SALA_GLA_CHUNK3(128)
#undef SALA_GLA_CHUNK3

}  // namespace sala::cuda
