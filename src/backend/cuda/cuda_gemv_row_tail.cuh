// Row work that a ring GEMV's last CTAs do on its own output (GemvOut::tail, GemvRowTail in
// cuda_kernels.h): the residual RMSNorm after o_proj / down_proj (GemmDispatch::linear_norm,
// Backend::linear_add_rmsnorm: h += y·alpha, x = RMSNorm(h)·w, + x's FP8 codes). As a kernel
// of its own the norm cost ≈ 3.4 µs of a bf16 decode step and ≈ 5.6 µs of an FP8 one per call,
// 63 calls per step (H100, session 44's CUPTI timeline, scripts/ktrace). (The same tail writing
// the SiLU product's FP8 codes for down_proj, instead of the quantize kernel, made the FP8
// gate_up GEMV ≈ 30 µs slower per layer, cause not found: session 44, not landed.)
//
// Protocol (grid G ≤ SMs CTAs, all resident: one persistent CTA per SM; M rows, P = min(M, G)):
// every CTA, after its tiles, takes a ticket: a barrier (its threads' y stores before thread
// 0's release: CUTLASS's GenericBarrier pattern), then atom.acq_rel on sync[0]. Tickets
// < G − P exit. The last arrival (ticket G − 1) has acquired every other CTA's y: it zeroes
// sync[0] for the next call (stream order: the next kernel touches it only after pdl_wait)
// and bumps the generation sync[1] (release); the other P − 1 of the last P spin on the
// generation they read before arriving (ld.acquire). They wait only for CTAs that have
// started: a CTA that arrives is resident, and the P − 1 spinning ones leave G − P + 1 SMs to
// the rest. Then CTA rank r = ticket − (G − P) processes rows r, r + P, ... Each step is one
// round trip to L2 (a first version had a fence per thread and a counter of departures).
// Timed alone (CudaGemvRowTail.Speed, session 45, H100) the tail costs what the norm kernel it
// replaces costs, ≈ 3 µs bf16 and 3.5–5.5 µs FP8 with codes: the ticket and the row are L2
// round trips, as a kernel boundary under PDL is.
//
// Numerics: the bits of rmsnorm_vec8_kernel<true, false, kQuant> (cuda_norm.cu), which the
// unfused path runs for these rows (n % 2048 == 0, n ≤ 8192, 16-byte aligned): that kernel has
// n / 8 threads, thread i holding columns 8i .. 8i + 7. Here kThreads threads stand in for them:
// thread t is the kernel's threads t + kThreads·j (j < V = n / (8·kThreads)); the kernel's
// warp w + (kThreads / 32)·j is real warp w's lanes, so each warp sum is the same butterfly over
// the same lanes' values, and the block sum over the n / 256 warp sums is the same 32-lane
// butterfly. Σ v² per 8 columns, inv, h, out and the FP8 codes (amax: a maximum, any order)
// are the kernel's expressions. Rows are independent: row m's bits do not depend on M.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_fp8_quant.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace sala::cuda::gemv {

constexpr int kNormTailMaxV = 4;  // n ≤ 8192 = 8 · 256 · 4

__device__ __forceinline__ uint32_t ld_acquire_gpu(const unsigned* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_relaxed_gpu(const unsigned* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t atom_add_acq_rel_gpu(unsigned* p, unsigned v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(p), "r"(v)
               : "memory");
  return old;
}
__device__ __forceinline__ void red_add_release_gpu(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// One row: red holds ≥ 33 floats of shared memory (kThreads / 32 ≤ 32 warps).
template <int kThreads>
__device__ __forceinline__ void norm_tail_row(const GemvRowTail& t, const bf16* y, int64_t row,
                                              float* red) {
  constexpr int kW = kThreads / 32;
  const int n = t.n, V = n / (8 * kThreads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t base = row * n;
  uint4 hv[kNormTailMaxV], av[kNormTailMaxV], wv[kNormTailMaxV], ov[kNormTailMaxV];
  float v[kNormTailMaxV][8], ss[kNormTailMaxV];
#pragma unroll
  for (int j = 0; j < kNormTailMaxV; ++j) {  // every load in flight at once: one round trip
    if (j >= V) break;
    const int64_t c = (threadIdx.x + kThreads * j) * 8;
    hv[j] = __ldcg(reinterpret_cast<const uint4*>(t.h + base + c));
    av[j] = __ldcg(reinterpret_cast<const uint4*>(y + base + c));  // other CTAs' stores: L2
    wv[j] = __ldg(reinterpret_cast<const uint4*>(t.w + c));
  }
#pragma unroll
  for (int j = 0; j < kNormTailMaxV; ++j) {
    if (j >= V) break;
    const int64_t off = base + (threadIdx.x + kThreads * j) * 8;
    bf16* h8 = reinterpret_cast<bf16*>(&hv[j]);
    const bf16* a8 = reinterpret_cast<const bf16*>(&av[j]);
    ss[j] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[j][e] = rb(b2f(h8[e]) + rb(b2f(a8[e]) * t.alpha));
      h8[e] = f2b(v[j][e]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss[j] = __fmaf_rn(v[j][e], v[j][e], ss[j]);  // as the kernel
    *reinterpret_cast<uint4*>(t.h + off) = hv[j];
  }
  // block_inv_rms over the kernel's n / 256 warps: warp_sum per (virtual) warp, then one
  // warp_sum over their sums with lanes past them 0.
#pragma unroll
  for (int j = 0; j < kNormTailMaxV; ++j) {
    if (j >= V) break;
    const float s = warp_sum(ss[j]);
    if (lane == 0) red[warp + kW * j] = s;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = int(threadIdx.x) < n / 256 ? red[threadIdx.x] : 0.f;
    s = warp_sum(s);
    if (threadIdx.x == 0) red[32] = s;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(red[32] / float(n) + t.eps);
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < kNormTailMaxV; ++j) {
    if (j >= V) break;
    const int64_t off = base + (threadIdx.x + kThreads * j) * 8;
    const bf16* w8 = reinterpret_cast<const bf16*>(&wv[j]);
    bf16* o8 = reinterpret_cast<bf16*>(&ov[j]);
#pragma unroll
    for (int e = 0; e < 8; ++e) o8[e] = f2b(rb(v[j][e] * inv) * b2f(w8[e]));
    if (!t.q.codes || !t.q.skip_out) *reinterpret_cast<uint4*>(t.out + off) = ov[j];
    amax = fp8q::amax8(amax, ov[j]);
  }
  if (!t.q.codes) return;
  // The row's amax: a maximum, exact in any order (fp8q::block_max's result).
  amax = warp_max(amax);
  if (lane == 0) red[warp] = amax;  // red[0 .. kW): read before the last barrier
  __syncthreads();
  amax = 0.f;
  for (int i = 0; i < kW; ++i) amax = fmaxf(amax, red[i]);
  const fp8q::RowScale s = fp8q::row_scale(amax);
  if (threadIdx.x == 0) t.q.scales[row] = s.s;
#pragma unroll
  for (int j = 0; j < kNormTailMaxV; ++j) {
    if (j >= V) break;
    const int64_t off = base + (threadIdx.x + kThreads * j) * 8;
    const uint2 c8 = fp8q::codes8<false>(ov[j], s);
    if (reinterpret_cast<uintptr_t>(t.q.codes) % 8 == 0) {
      *reinterpret_cast<uint2*>(t.q.codes + off) = c8;
    } else {
      for (int e = 0; e < 4; ++e) {
        t.q.codes[off + e] = uint8_t(c8.x >> (8 * e));
        t.q.codes[off + 4 + e] = uint8_t(c8.y >> (8 * e));
      }
    }
  }
}

// Called by every thread of every CTA of a ring GEMV after its last tile (its y stores
// issued, red free). y: o.y[0], [M, n] bf16 (nparts 1: checked by launch_gemv*).
template <int kThreads>
__device__ __forceinline__ void gemv_row_tail(const GemvOut& o, int M, float* red) {
  const GemvRowTail& t = o.tail;
  if (!t.h) return;
  __shared__ unsigned ticket;
  __syncthreads();  // every thread's y stores, before thread 0's release below
  const unsigned G = gridDim.x, P = min(unsigned(M), G);
  if (threadIdx.x == 0) {
    // The generation changes only after the last arrival, so after this read.
    const unsigned gen = ld_relaxed_gpu(t.sync + 1);
    const unsigned tk = atom_add_acq_rel_gpu(t.sync, 1u);
    if (tk == G - 1) {
      t.sync[0] = 0;
      red_add_release_gpu(t.sync + 1, 1u);
    } else if (tk >= G - P) {
      while (ld_acquire_gpu(t.sync + 1) == gen) __nanosleep(20);
    }
    ticket = tk;
  }
  __syncthreads();  // thread 0's acquire, before every thread's reads of y
  const unsigned tk = ticket;
  if (tk < G - P) return;
  const bf16* y = static_cast<const bf16*>(o.y[0]);
  for (int64_t r = tk - (G - P); r < M; r += P) {
    norm_tail_row<kThreads>(t, y, r, red);
    __syncthreads();  // red is reused by the next row
  }
}

// Host side: what launch_gemv / launch_gemv_fp8 require of o.tail (abort otherwise).
inline bool row_tail_ok(const GemvOut& o, int64_t N, int M) {
  const GemvRowTail& t = o.tail;
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return !t.h || (o.nparts == 1 && !o.f32 && !o.silu_pair && o.cols[0] == t.n && N == t.n &&
                  M >= 1 && M <= kGemvRowTailRows && gemv_norm_tail_fits(t.n) && t.sync &&
                  t.w && t.out && a16(t.h) && a16(t.w) && a16(t.out) && a16(o.y[0]) &&
                  (!t.q.codes || t.q.scales));
}

}  // namespace sala::cuda::gemv
