// Lightning layers on the GPU: simple GLA with a scalar per-head decay (SPEC §8), fp32
// state slots [num_slots, n_lightning, nh, d, d] in device memory.
//   S_t = λ_h S_{t-1} + k_tᵀ v_t,   o_t = scale · q_t S_t,   o rounded to bf16.
// Every kernel is templated on the storage type T of q, k, v, o: bf16, or float in fp32 mode
// (loads exact, o not rounded); the state and all arithmetic are fp32 either way.
// Calls of < 64 tokens run the fused recurrent kernel (decode), longer calls the chunked
// tensor-core kernel of cuda_lightning_seq_tc.cu (bf16) or the chunk-parallel fp32 kernels of
// cuda_lightning_chunk3.cu (fp32 mode), or the serial chunked kernel here where those cannot
// run (chunks of 64 aligned at the call's first token), as CpuBackend and HF do. In steps of
// calls of < 64 tokens only, the recurrent kernel can also do the q/k norm + RoPE first
// (launch_gla_norm_rope: lightning_qk_attention in one kernel).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/gla.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {

namespace {

constexpr int kChunk = kGlaChunk;  // the HF / CpuBackend chunk
constexpr int kDecayStride = kGlaDecayStride;  // decay[h][n] = exp(n g), n = 0..64

// Recurrent form, one block per (head, sequence). Thread (rg, j) keeps rows
// [rg*D/4, (rg+1)*D/4) of state column j in registers.     grid: (nh, n_seqs), block: 4*D
// The call's rows go in groups of up to kGlaStageRows: a group's q (times scale), k and v
// rows are staged in shared memory first, then the recurrence runs over them with one block
// barrier per row, so the rows of a speculative verify call wait on one round of loads.
// kNormRope (launch_gla_norm_rope): the staging normalises and rotates each of the group's q
// and k heads in place (one warp per head, qk_norm_rope's code: head_norm_rope, or
// head_norm_rope_regs for D = 64 / 128, with rope_cos_sin at pos[row]), and the step takes
// the values stored: q, k, o and the state are those of qk_norm_rope then this kernel
// without kNormRope.
// The state comes from slot s.state_slot and goes to s.state_dst_slot (the same slot but in
// speculative verify calls, whose state before the call stays where it was). q, k and v have
// no __restrict__: the projection before this kernel writes them (ARCHITECTURE.md's PDL rule).
constexpr int kGlaStageRows = 8;

// One token's update of state element (i, j): S' = λ S + k_i v_j (its term of o: q_i S', summed
// by an FMA). Spelled out so that the recurrent kernel and the decode form round alike.
__device__ __forceinline__ float gla_state_step(float lam, float s, float ki, float vj) {
  return __fmaf_rn(lam, s, ki * vj);
}

template <typename T, int D, bool kNormRope>
__global__ void __launch_bounds__(4 * D) gla_recurrent_kernel(
    std::conditional_t<kNormRope, T, const T>* q, std::conditional_t<kNormRope, T, const T>* k,
    const T* v, int64_t stride, const DevSeq* __restrict__ seqs, const int32_t* __restrict__ list,
    float* __restrict__ states, int64_t slot_stride, int64_t layer_off,
    const float* __restrict__ decay, float scale, T* __restrict__ out, int64_t ostride,
    const GlaNormRope<T> nr) {
  pdl_begin();  // launch_pdl: before any read or write
  constexpr int RPT = D / 4, R = kGlaStageRows, kWarps = 4 * D / 32, half = D / 2;
  static_assert(!kNormRope || 4 * D >= 64, "kNormRope: a warp per head");
  __shared__ float qs[R][D], ks[R][D], vs[R][D], part[2][4][D];
  // kNormRope: cos / sin of each staged row's position; each warp's normalised head
  __shared__ float cs[kNormRope ? R : 1][kNormRope ? D : 1];
  __shared__ float buf[kNormRope && D != 64 && D != 128 ? kWarps : 1][D];  // head_norm_rope's
  const int h = blockIdx.x;
  const DevSeq s = seqs[list[blockIdx.y]];
  const int j = threadIdx.x % D, rg = threadIdx.x / D, warp = threadIdx.x / 32;
  const int64_t head = layer_off + int64_t(h) * D * D;
  const float* S = states + int64_t(s.state_slot) * slot_stride + head;
  const float lam = decay[h * kDecayStride + 1];
  float st[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r) st[r] = s.past_len == 0 ? 0.f : S[(rg * RPT + r) * D + j];
  for (int g0 = 0; g0 < s.num_tokens; g0 += R) {
    const int n = min(R, s.num_tokens - g0);
    const int64_t row0 = int64_t(s.token_begin + g0);
    // The group's loads go out first, into registers (n·D <= R·D elements over 4·D threads:
    // at most kPer each), so their latency overlaps the RoPE table and the norms.
    constexpr int kPer = (R + 3) / 4;
    float vr[kPer], qr[kPer], kr[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int e = threadIdx.x + u * 4 * D;
      if (e >= n * D) continue;
      const int64_t off = (row0 + e / D) * stride + int64_t(h) * D + e % D;
      vr[u] = ld(v[off]);
      if constexpr (!kNormRope) {
        qr[u] = ld(q[off]) * scale;
        kr[u] = ld(k[off]);
      }
    }
    if constexpr (kNormRope) {
      for (int e = threadIdx.x; e < n * half; e += blockDim.x) {  // rope_table per row
        const int r = e / half, i = e % half;
        rope_cos_sin(nr.pos[row0 + r], nr.inv_freq[i], cs[r][i], cs[r][half + i]);
      }
      __syncthreads();
      for (int task = warp; task < 2 * n; task += kWarps) {  // (row, q or k)
        const int r = task / 2;
        const bool is_q = task % 2 == 0;
        T* x = (is_q ? q : k) + (row0 + r) * stride + int64_t(h) * D;
        float* xs = is_q ? qs[r] : ks[r];
        auto store = [&](int i, float y) {
          const T o = cvt<T>(y);
          x[i] = o;
          xs[i] = is_q ? ld(o) * scale : ld(o);  // as the loads above
        };
        if constexpr (D == 64 || D == 128) {  // as qk_norm_rope_regs_kernel
          float w[D / 32], c[D / 64], s[D / 64];
          head_norm_rope_regs_load<T, D>(is_q ? nr.qn : nr.kn, cs[r], w, c, s);
          head_norm_rope_regs<T, D>(x, w, nr.eps, c, s, store);
        } else {
          head_norm_rope<T>(x, is_q ? nr.qn : nr.kn, D, nr.eps, cs[r], buf[warp], store);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int e = threadIdx.x + u * 4 * D;
      if (e >= n * D) continue;
      vs[e / D][e % D] = vr[u];
      if constexpr (!kNormRope) {
        qs[e / D][e % D] = qr[u];
        ks[e / D][e % D] = kr[u];
      }
    }
    __syncthreads();
    for (int t = 0; t < n; ++t) {
      // part alternates between two buffers: the barrier of row t + 1 orders row t's reads
      // before row t + 2's writes of the same buffer.
      float (*pt)[D] = part[t % 2];
      const float vj = vs[t][j];
      float acc = 0.f;
#pragma unroll
      for (int r = 0; r < RPT; ++r) {
        const int i = rg * RPT + r;
        st[r] = gla_state_step(lam, st[r], ks[t][i], vj);
        acc = __fmaf_rn(qs[t][i], st[r], acc);
      }
      pt[rg][j] = acc;
      __syncthreads();
      if (threadIdx.x < D)
        out[(row0 + t) * ostride + int64_t(h) * D + j] =
            cvt<T>(((pt[0][j] + pt[1][j]) + pt[2][j]) + pt[3][j]);
    }
    __syncthreads();  // the next group's staging overwrites qs, ks, vs
  }
  float* Sd = states + int64_t(s.state_dst_slot) * slot_stride + head;
#pragma unroll
  for (int r = 0; r < RPT; ++r) Sd[(rg * RPT + r) * D + j] = st[r];
}

// Decode form (GlaArgs::one_token: every call of the step has one token). The recurrent
// kernel's numbers for n = 1: thread (rg, j) updates rows [rg·D/4, (rg+1)·D/4) of state column
// c0 + j and sums their terms of o_j in that order; the four row groups' sums are added as
// there ((p0 + p1) + p2) + p3.     grid: (nh, n_seqs, D / VS), block: 4·VS (128 for D ≥ 32)
// Why a kernel of its own (H100 timelines, session 44: the recurrent kernel took 5.4 µs per
// layer at B = 1 and 19 µs at B = 8, with 82 registers x 512 threads: one block per SM, two
// waves at B = 8):
// - each thread loads its D/4 state values BEFORE pdl_wait, while the q/k/v projection still
//   runs (a block of 128 threads and 2.7 KB of shared memory fits beside a ring GEMV's CTA).
//   Safe: a state slot's layer is written only by this layer's lightning kernels of earlier
//   steps, LightningRunner::advance and copy_slot, all complete before this step's first
//   kernel (a memcpy of the step's metadata lies between), and never by a kernel of the step
//   before this one;
// - D / VS blocks per (head, sequence) spread each state over more SMs (B = 1: 128 blocks).
// q, k and v have no __restrict__: the projection before this kernel writes them while its
// state loads run, so no load of them may be moved (or served from a non-coherent cache) above
// pdl_wait.
// kNormRope: every block normalises and rotates the whole q and k head (the recurrent kernel's
// code); with D / VS > 1 blocks per head only the last of them to have read q and k (a ticket,
// nr.tickets) writes them back, so no block reads a value another one already rotated.
template <int D>
constexpr int kGlaOneVS = D < 32 ? D : 32;

template <typename T, int D, bool kNormRope>
__global__ void __launch_bounds__(4 * kGlaOneVS<D>) gla_one_token_kernel(
    std::conditional_t<kNormRope, T, const T>* q, std::conditional_t<kNormRope, T, const T>* k,
    const T* v, int64_t stride, const DevSeq* __restrict__ seqs,
    const int32_t* __restrict__ list, float* __restrict__ states, int64_t slot_stride,
    int64_t layer_off, const float* __restrict__ decay, float scale, T* __restrict__ out,
    int64_t ostride, const GlaNormRope<T> nr) {
  constexpr int VS = kGlaOneVS<D>, kThreads = 4 * VS, RPT = D / 4, kWarps = kThreads / 32;
  constexpr int Z = D / VS, half = D / 2;
  constexpr bool kTicket = kNormRope && Z > 1;
  static_assert(!kNormRope || kWarps >= 2, "kNormRope: a warp each for q and k");
  __shared__ float qs[D], ks[D], vs[VS], part[4][VS];
  __shared__ float qo[kTicket ? D : 1];  // the rotated q before the scale: its write-back
  __shared__ float cs[kNormRope ? D : 1];
  __shared__ float buf[kNormRope && D != 64 && D != 128 ? kWarps : 1][D];  // head_norm_rope's
  __shared__ unsigned ticket;
  pdl_trigger();
  const int h = blockIdx.x, c0 = blockIdx.z * VS;
  const DevSeq s = seqs[list[blockIdx.y]];  // step metadata: uploaded before the step
  const int j = threadIdx.x % VS, rg = threadIdx.x / VS, warp = threadIdx.x / 32;
  const int64_t head = layer_off + int64_t(h) * D * D;
  const float* S = states + int64_t(s.state_slot) * slot_stride + head + c0 + j;
  float st[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r) st[r] = s.past_len == 0 ? 0.f : S[(rg * RPT + r) * D];
  const float lam = decay[h * kDecayStride + 1];
  pdl_wait();  // q, k, v: the projection before this kernel
  const int64_t row = s.token_begin, hoff = row * stride + int64_t(h) * D;
  const float vr = threadIdx.x < VS ? ld(v[hoff + c0 + threadIdx.x]) : 0.f;
  if constexpr (kNormRope) {
    for (int i = threadIdx.x; i < half; i += kThreads)
      rope_cos_sin(nr.pos[row], nr.inv_freq[i], cs[i], cs[half + i]);
    __syncthreads();
    if (warp < 2) {
      const bool is_q = warp == 0;
      T* x = (is_q ? q : k) + hoff;
      float* xs = is_q ? qs : ks;
      auto store = [&](int i, float y) {
        const T o = cvt<T>(y);
        if constexpr (kTicket) {
          if (is_q) qo[i] = ld(o);
        } else {
          x[i] = o;  // the only block of this head: in place, as the recurrent kernel
        }
        xs[i] = is_q ? ld(o) * scale : ld(o);
      };
      if constexpr (D == 64 || D == 128) {
        float w[D / 32], c[D / 64], sn[D / 64];
        head_norm_rope_regs_load<T, D>(is_q ? nr.qn : nr.kn, cs, w, c, sn);
        head_norm_rope_regs<T, D>(x, w, nr.eps, c, sn, store);
      } else {
        head_norm_rope<T>(x, is_q ? nr.qn : nr.kn, D, nr.eps, cs, buf[warp], store);
      }
    }
  } else {
    for (int i = threadIdx.x; i < D; i += kThreads) {
      qs[i] = ld(q[hoff + i]) * scale;
      ks[i] = ld(k[hoff + i]);
    }
  }
  if (threadIdx.x < VS) vs[threadIdx.x] = vr;
  __syncthreads();  // every read of q and k is done
  if constexpr (kTicket) {
    if (threadIdx.x == 0) {
      unsigned* t = nr.tickets + int64_t(blockIdx.y) * gridDim.x + h;
      __threadfence();
      const unsigned tk = atomicAdd(t, 1u);
      if (tk == Z - 1) {
        *t = 0;  // for the next call: it reads the ticket only after this grid completed
        __threadfence();
      }
      ticket = tk;
    }
    __syncthreads();
    if (ticket == Z - 1)
      for (int i = threadIdx.x; i < D; i += kThreads) {
        q[hoff + i] = cvt<T>(qo[i]);
        k[hoff + i] = cvt<T>(ks[i]);
      }
  }
  const float vj = vs[j];
  float acc = 0.f;
#pragma unroll
  for (int r = 0; r < RPT; ++r) {
    const int i = rg * RPT + r;
    st[r] = gla_state_step(lam, st[r], ks[i], vj);
    acc = __fmaf_rn(qs[i], st[r], acc);
  }
  part[rg][j] = acc;
  float* Sd = states + int64_t(s.state_dst_slot) * slot_stride + head + c0 + j;
#pragma unroll
  for (int r = 0; r < RPT; ++r) Sd[(rg * RPT + r) * D] = st[r];
  __syncthreads();
  if (threadIdx.x < VS)
    out[row * ostride + int64_t(h) * D + c0 + j] =
        cvt<T>(((part[0][j] + part[1][j]) + part[2][j]) + part[3][j]);
}

// Chunked form (SPEC §8.4), one block per (head, sequence, value-column slice of VS).
// State columns are independent in the value dimension, so slices run in parallel.
//                                            grid: (nh, n_seqs, D / VS), block: 256
template <int D, int VS>
struct ChunkSmem {
  static constexpr int kQ = kChunk * (D + 1), kA = kChunk * (kChunk + 1);
  static constexpr int kFloats = 2 * kQ + kChunk * VS + kA + D * VS + kDecayStride;
  static constexpr size_t kBytes = size_t(kFloats) * 4;
};

template <typename T, int D, int VS>
__global__ void __launch_bounds__(256) gla_chunked_kernel(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    int64_t stride, const DevSeq* __restrict__ seqs, const int32_t* __restrict__ list,
    float* __restrict__ states, int64_t slot_stride, int64_t layer_off,
    const float* __restrict__ decay_g, float scale, T* __restrict__ out, int64_t ostride) {
  using L = ChunkSmem<D, VS>;
  extern __shared__ float sm[];
  float* Qs = sm;                      // [64][D+1]
  float* Ks = Qs + L::kQ;              // [64][D+1]
  float* Vs = Ks + L::kQ;              // [64][VS]
  float* A = Vs + kChunk * VS;         // [64][65]
  float* Ss = A + L::kA;               // [D][VS]
  float* decay = Ss + D * VS;          // [65]
  constexpr int DP = D + 1, AP = kChunk + 1;
  const int h = blockIdx.x;
  const DevSeq s = seqs[list[blockIdx.y]];
  const int v0 = blockIdx.z * VS;
  const int tid = threadIdx.x, nt = blockDim.x;
  float* Sg = states + int64_t(s.state_slot) * slot_stride + layer_off + int64_t(h) * D * D;
  for (int e = tid; e < kDecayStride; e += nt) decay[e] = decay_g[h * kDecayStride + e];
  for (int e = tid; e < D * VS; e += nt) {
    const int x = e / VS, c = e % VS;
    Ss[e] = s.past_len == 0 ? 0.f : Sg[x * D + v0 + c];
  }
  for (int c0 = 0; c0 < s.num_tokens; c0 += kChunk) {
    const int C = min(kChunk, s.num_tokens - c0);
    const int64_t row0 = int64_t(s.token_begin + c0);
    for (int e = tid; e < kChunk * D; e += nt) {
      const int i = e / D, x = e % D;
      const int64_t off = (row0 + i) * stride + int64_t(h) * D + x;
      Qs[i * DP + x] = i < C ? ld(q[off]) : 0.f;
      Ks[i * DP + x] = i < C ? ld(k[off]) : 0.f;
    }
    for (int e = tid; e < kChunk * VS; e += nt) {
      const int i = e / VS, c = e % VS;
      Vs[e] = i < C ? ld(v[(row0 + i) * stride + int64_t(h) * D + v0 + c]) : 0.f;
    }
    __syncthreads();
    // intra-chunk scores A[i][j] = scale (q_i·k_j) λ^(i-j), j <= i
    for (int e = tid; e < kChunk * kChunk; e += nt) {
      const int i = e / kChunk, j = e % kChunk;
      float a = 0.f;
      if (j <= i && i < C) {
        float dot = 0.f;
#pragma unroll 8
        for (int x = 0; x < D; ++x) dot += Qs[i * DP + x] * Ks[j * DP + x];
        a = scale * dot * decay[i - j];
      }
      A[i * AP + j] = a;
    }
    __syncthreads();
    // o_i = scale λ^(i+1) q_i S_prev + Σ_{j<=i} A[i][j] v_j
    for (int e = tid; e < C * VS; e += nt) {
      const int i = e / VS, c = e % VS;
      const float f = scale * decay[i + 1];
      float o = 0.f;
#pragma unroll 8
      for (int x = 0; x < D; ++x) o += (Qs[i * DP + x] * f) * Ss[x * VS + c];
      for (int j = 0; j <= i; ++j) o += A[i * AP + j] * Vs[j * VS + c];
      out[(row0 + i) * ostride + int64_t(h) * D + v0 + c] = cvt<T>(o);
    }
    __syncthreads();
    // S = λ^C S + Σ_j λ^(C-1-j) k_jᵀ v_j
    for (int e = tid; e < D * VS; e += nt) {
      const int x = e / VS, c = e % VS;
      float sv = decay[C] * Ss[e];
      for (int j = 0; j < C; ++j) sv += (Ks[j * DP + x] * decay[C - 1 - j]) * Vs[j * VS + c];
      Ss[e] = sv;
    }
    __syncthreads();
  }
  for (int e = tid; e < D * VS; e += nt) {
    const int x = e / VS, c = e % VS;
    Sg[x * D + v0 + c] = Ss[e];
  }
}

// The recurrent kernel over the n seqs of list (kNormRope: with the q/k norm + RoPE of nr).
template <typename T, int D, bool kNormRope>
void launch_recurrent(const GlaArgs<T>& a, const GlaNormRope<T>& nr, const int32_t* list, int n,
                      cudaStream_t st) {
  if (n == 0) return;
  if (a.one_token) {  // the decode form
    constexpr int VS = kGlaOneVS<D>;
    if (kNormRope && D / VS > 1 && !nr.tickets) {
      std::fprintf(stderr, "%s:%d: the decode form's q/k write-back needs tickets\n", __FILE__,
                   __LINE__);
      std::abort();
    }
    launch_pdl(gla_one_token_kernel<T, D, kNormRope>,
               dim3(unsigned(a.nh), unsigned(n), unsigned(D / VS)), 4 * VS, 0, st, a.q, a.k, a.v,
               a.stride, a.seqs, list, a.states, a.slot_stride, a.layer_off, a.decay, a.scale,
               a.out, a.ostride, nr);
    CUDA_CHECK_LAUNCH();
    return;
  }
  launch_pdl(gla_recurrent_kernel<T, D, kNormRope>, dim3(unsigned(a.nh), unsigned(n)), 4 * D, 0,
             st, a.q, a.k, a.v, a.stride, a.seqs, list, a.states, a.slot_stride, a.layer_off,
             a.decay, a.scale, a.out, a.ostride, nr);
  CUDA_CHECK_LAUNCH();
}

template <typename T, int D>
void launch_gla_d(const GlaArgs<T>& a, const int32_t* short_list, int n_short, const int32_t* long_list,
                int n_long, cudaStream_t st) {
  launch_recurrent<T, D, false>(a, GlaNormRope<T>{}, short_list, n_short, st);
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  if (n_long == 0) return;
  const bool aligned = a16(a.q) && a16(a.k) && a16(a.v) && a.stride % 8 == 0;
  if constexpr (std::is_same_v<T, bf16>) {
    if (aligned && a16(a.out) && a.ostride % 8 == 0) {
      launch_gla_seq_tc<D>(a, long_list, n_long, st);  // cuda_lightning_seq_tc.cu
      return;
    }
  } else if (aligned && a.ws && a.ws_floats >= int64_t(a.nh) * D * D && a.max_chunks > 0) {
    launch_gla_chunk3<D>(a, long_list, n_long, st);  // cuda_lightning_chunk3.cu
    return;
  }
  // The serial form: no workspace (fp32 mode) or unaligned rows.
  constexpr int VS = D >= 32 ? 32 : D;
  using L = ChunkSmem<D, VS>;
  static SmemOptIn optin;  // per device
  optin.raise(gla_chunked_kernel<T, D, VS>, L::kBytes);
  gla_chunked_kernel<T, D, VS><<<dim3(unsigned(a.nh), unsigned(n_long), unsigned(D / VS)), 256,
                              L::kBytes, st>>>(a.q, a.k, a.v, a.stride, a.seqs, long_list,
                                               a.states, a.slot_stride, a.layer_off, a.decay,
                                               a.scale, a.out, a.ostride);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
bool launch_gla(int d, const GlaArgs<T>& a, const int32_t* short_list, int n_short,
                const int32_t* long_list, int n_long, cudaStream_t st) {
  switch (d) {
    case 16: launch_gla_d<T, 16>(a, short_list, n_short, long_list, n_long, st); return true;
    case 32: launch_gla_d<T, 32>(a, short_list, n_short, long_list, n_long, st); return true;
    case 64: launch_gla_d<T, 64>(a, short_list, n_short, long_list, n_long, st); return true;
    case 128: launch_gla_d<T, 128>(a, short_list, n_short, long_list, n_long, st); return true;
    default: return false;
  }
}
template <typename T>
bool launch_gla_norm_rope(int d, const GlaArgs<T>& a, const GlaNormRope<T>& nr,
                          const int32_t* list, int n, cudaStream_t st) {
  switch (d) {
    case 16: launch_recurrent<T, 16, true>(a, nr, list, n, st); return true;
    case 32: launch_recurrent<T, 32, true>(a, nr, list, n, st); return true;
    case 64: launch_recurrent<T, 64, true>(a, nr, list, n, st); return true;
    case 128: launch_recurrent<T, 128, true>(a, nr, list, n, st); return true;
    default: return false;
  }
}

#define SALA_GLA_INSTANTIATE(T)                                                                   \
  template bool launch_gla<T>(int, const GlaArgs<T>&, const int32_t*, int, const int32_t*, int,  \
                              cudaStream_t);                                                      \
  template bool launch_gla_norm_rope<T>(int, const GlaArgs<T>&, const GlaNormRope<T>&,           \
                                        const int32_t*, int, cudaStream_t);
SALA_GLA_INSTANTIATE(bf16)
SALA_GLA_INSTANTIATE(float)
#undef SALA_GLA_INSTANTIATE

}  // namespace sala::cuda
