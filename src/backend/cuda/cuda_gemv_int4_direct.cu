// The int4 GEMV for runs of M <= 8 rows (decode steps of B <= 8) without a shared-memory ring:
// each lane loads its weight chunks straight into registers, a few chunk groups ahead.
//
// Why: the ring kernel (cuda_gemv_int4.cu) runs one 8-warp CTA per SM (its ring takes the SM's
// shared memory), and at M = 1 it streams 1.8–1.9 TB/s: with 2 warps per scheduler the chain
// of each stage (cp.async wait, ring reads, dequantization, 8 dependent MMAs) is not hidden,
// and ≈ 28 % of its instructions are the copy path (PERF.md, "What bounds the skinny GEMMs").
// Here a CTA is 8 warps on one 16-row tile, with ≈ 5 KB of shared memory, so 2 CTAs (16
// warps) share an SM, and a lane's loads are its own registers: 4 chunk groups = 128 B in
// flight per lane, 64 KB per SM, with no copy instructions or ring barriers.
//
// Same bits as the ring kernel (the test CudaInt4Gemv.DirectMatchesRing): warp w takes the
// same K slice (gemv::Slice), lane (g, t) the same chunks of rows g / g + 8 of each 16-row
// half, and each chunk group runs the same arithmetic (cuda_gemv_int4_math.cuh: the MMAs of
// dequant_chunk + chunk_mma in their order, each word dequantized just before its two MMAs to
// hold fewer registers, into fresh partials; add_scaled with the group's scale) in group order;
// the epilogue is the ring's `finish` (8 warp partials summed in warp order, rounded once). A
// row's result depends only on K, so row invariance across M (and across the two kernels)
// holds. silu_pair: the CTA computes gate tile n0 (kept in shared memory as bf16 values) and
// then up tile n0 + N / 2, as the ring's walk pairs them.
//
// PDL: each CTA issues its first tile's weight and scale loads, then griddepcontrol.wait;
// x is read and y written only after it.
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_int4.cuh"
#include "backend/cuda/cuda_gemv_int4_math.cuh"
#include "backend/cuda/cuda_gemv_ring.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace sala::cuda {
namespace {
using namespace gemv;

constexpr int kTileRows = 16;  // one 16-row half of the ring's 32-row tile

// A scale when ok, else an undefined register (never used then).
__device__ __forceinline__ float ldg_f32_if(const float* p, bool ok) {
  float v;
  asm volatile(
      "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q ld.global.nc.f32 %0, [%1];\n\t}"
      : "=f"(v)
      : "l"(p), "r"(int(ok)));
  return v;
}

// A lane's walk over its warp's K slice of one 16-row tile: the weight chunks of rows g and
// g + 8 (16 B each per chunk group) and their two scales, Depth chunk groups ahead in a
// register ring (slot v % Depth holds group v). The scale of chunk group cg is cg / a
// (a = group / 128), kept as (q, r) without a division.
template <int Depth>
struct DirectLane {
  const uint8_t* w0;  // row g, chunk slice.cb + t; chunk group v is 64 v bytes further
  const uint8_t* w8;  // row g + 8
  const float* s0;    // scales of row g, [K / group]
  const float* s8;
  int nvg, a, q, r;
  uint4 W[Depth][2];
  float S[Depth][2];

  __device__ __forceinline__ DirectLane(const uint8_t* wb, int64_t row_bytes, const float* ws,
                                        int64_t gpr, int a_, int64_t n0, int64_t N,
                                        const Slice& s, int g, int t) {
    const int64_t r0 = min(n0 + g, N - 1), r8 = min(n0 + g + 8, N - 1);
    w0 = wb + r0 * row_bytes + int64_t(s.cb + t) * 16;
    w8 = wb + r8 * row_bytes + int64_t(s.cb + t) * 16;
    s0 = ws + r0 * gpr;
    s8 = ws + r8 * gpr;
    nvg = s.ce > s.cb ? (s.ce - s.cb) / 4 : 0;
    a = a_;
    q = s.cb / 4 / a;
    r = s.cb / 4 % a;
#pragma unroll
    for (int d = 0; d < Depth; ++d) issue(d, d);
  }
  // Group v's loads into slot d = v % Depth (a constant in every unrolled caller, so the ring
  // stays in registers).
  __device__ __forceinline__ void issue(int d, int v) {
    const bool ok = v < nvg;
    W[d][0] = ldg_stream_if(w0 + 64 * int64_t(v), ok);
    W[d][1] = ldg_stream_if(w8 + 64 * int64_t(v), ok);
    S[d][0] = ldg_f32_if(s0 + q, ok);
    S[d][1] = ldg_f32_if(s8 + q, ok);
    if (++r == a) r = 0, ++q;
  }
};

// One tile's accumulators: the ring kernel's per-half sequence (kernel header). Ends with every
// load of the tile consumed.
template <int NT, int Depth>
__device__ __forceinline__ void direct_tile(float (&acc)[1][NT][4], DirectLane<Depth>& L,
                                            const XLane& xl, int cb, int t) {
  constexpr int G = NT;  // NT <= kGroupNT: every n-tile's x in registers, as the ring's NG = 1
  for (int v0 = 0; v0 < L.nvg; v0 += Depth) {
#pragma unroll
    for (int d = 0; d < Depth; ++d) {
      const int v = v0 + d;
      if (v >= L.nvg) break;  // uniform over the warp
      // x from L1 (every CTA of the SM reads it): its latency is hidden by the dequantization
      // below and by the SM's other warps, which costs fewer registers than loading it ahead.
      uint4 X[G][4];
      load_x<G>(X, xl, 0, cb + 4 * v + t, true);
      const uint4 wg = L.W[d][0], w8 = L.W[d][1];
      const float sc[2] = {L.S[d][0], L.S[d][1]};
      L.issue(d, v + Depth);
      const uint32_t wgw[4] = {wg.x, wg.y, wg.z, wg.w}, w8w[4] = {w8.x, w8.y, w8.z, w8.w};
      float part[G][4] = {};
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // chunk_mma's order: per word, pairs 0, 1 then 2, 3
        uint32_t a[4], b[4];
        dequant_word(wgw[i], a);
        dequant_word(w8w[i], b);
#pragma unroll
        for (int j = 0; j < G; ++j) {
          const uint32_t xs[4] = {X[j][i].x, X[j][i].y, X[j][i].z, X[j][i].w};
          mma_bf16(part[j], a[0], b[0], a[1], b[1], xs[0], xs[1]);
          mma_bf16(part[j], a[2], b[2], a[3], b[3], xs[2], xs[3]);
        }
      }
      add_scaled<G>(acc[0], 0, part, sc);
    }
  }
}

// x has no __restrict__: under PDL it is written by the preceding grid while this one runs.
// Grid: one CTA per 16-row tile (silu_pair: per gate tile, its up tile N / 2 further).
template <int NT, int Depth>
__global__ void __launch_bounds__(kThreads, 2)
    gemv4_direct_kernel(const bf16* x, int64_t ldx, const uint32_t* __restrict__ w,
                        const float* __restrict__ ws, int64_t N, int K, int group, int M,
                        GemvOut o) {
  static_assert(NT <= kGroupNT, "x of every n-tile in registers");
  constexpr int PW = 8 * NT;
  __shared__ float red[kWarps][kTileRows][PW + 1];
  __shared__ float gate[kTileRows * PW];  // silu_pair: the gate tile's values [M][16]
  pdl_trigger();
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const Slice s(K / kChunkK, int(threadIdx.x / 32));
  const uint8_t* wb = reinterpret_cast<const uint8_t*>(w);
  const int64_t row_bytes = K / 2, gpr = K / group;
  const int a = group / kGroupK;
  const int64_t n0 = int64_t(blockIdx.x) * kTileRows;
  DirectLane<Depth> L(wb, row_bytes, ws, gpr, a, n0, N, s, g, t);  // issues the first loads
  pdl_wait();  // every CTA: x and y only after the preceding grid completed
  const XLane xl(reinterpret_cast<const uint8_t*>(x), ldx * 2, M, g);
  float acc[1][NT][4] = {};
  direct_tile<NT, Depth>(acc, L, xl, s.cb, t);
  if (!o.silu_pair) {
    finish<kTileRows, 1, NT, Unscaled, PW>(red, acc, n0, N, M, o, Epi::kStore, gate, Unscaled{});
    return;
  }
  const int64_t nu = n0 + N / 2;  // the up rows of the gate rows n0 ..
  L = DirectLane<Depth>(wb, row_bytes, ws, gpr, a, nu, N, s, g, t);  // loads under the epilogue
  finish<kTileRows, 1, NT, Unscaled, PW>(red, acc, n0, N, M, o, Epi::kKeepGate, gate,
                                         Unscaled{});
  __syncthreads();  // red is reused; gate is read by the thread that wrote it
  float up[1][NT][4] = {};
  direct_tile<NT, Depth>(up, L, xl, s.cb, t);
  finish<kTileRows, 1, NT, Unscaled, PW>(red, up, nu, N, M, o, Epi::kSiluMul, gate, Unscaled{});
}

}  // namespace

void launch_gemv_int4_direct(const bf16* x, int64_t ldx, const uint32_t* w,
                             const float* w_scales, int64_t N, int K, int group, int M,
                             const GemvOut& o, cudaStream_t st, int depth) {
  if (!(gemv_direct_supported(M) && gemv_int4_supported(w, K, group, M) && ldx % 8 == 0 &&
        aligned16(x) && w_scales && N >= 1 && depth >= 2 && depth <= 4) ||
      (o.silu_pair && N % (2 * kTileRows) != 0)) {
    std::fprintf(stderr,
                 "%s:%d: direct int4 GEMV unsupported: M = %d, K = %d, group = %d, N = %lld, "
                 "ldx = %lld, silu_pair = %d, depth = %d\n",
                 __FILE__, __LINE__, M, K, group, static_cast<long long>(N),
                 static_cast<long long>(ldx), int(o.silu_pair), depth);
    std::abort();
  }
  const int64_t units = o.silu_pair ? N / (2 * kTileRows) : (N + kTileRows - 1) / kTileRows;
  auto kernel = depth == 2 ? gemv4_direct_kernel<1, 2>
                : depth == 3 ? gemv4_direct_kernel<1, 3>
                             : gemv4_direct_kernel<1, 4>;
  launch_pdl(kernel, dim3(unsigned(units)), dim3(kThreads), 0, st, x, ldx, w, w_scales, N, K,
             group, M, o);
}

}  // namespace sala::cuda
