// The bf16 and FP8 GEMVs for runs of M <= kGemvDirectMaxRows = 8 rows without a shared-memory
// ring: each lane loads its weight chunks straight into registers, one or two groups ahead.
//
// Why: the ring kernels (cuda_gemv.cu, cuda_gemv_fp8.cu) run one 8-warp CTA per SM. The FP8
// ring streams ≈ 2.5 TB/s at M = 1 (74 % of an H100's HBM), and its probes (PERF.md, session 36)
// found its time equal to its copies' alone; the bf16 ring streams 3.2 TB/s on 4096 x 4096
// (3.9–4.0 on the large shapes). Here a CTA is 8 warps on one 16-row tile with ≈ 9 KB of shared
// memory, 2 CTAs per SM, and each lane keeps Depth groups of its chunks in flight in
// registers (8 x 16 B per group: ≈ 128 KB per SM at Depth 2, the ring's amount), refilled as
// soon as a group is consumed, without copy instructions or ring barriers. (The files' tile
// kernels, the A100 fallbacks, load one group at a time, then multiply, without PDL.)
//
// Same bits as the ring kernels (CudaGemv.DirectMatchesRing, CudaFp8Gemv.DirectMatchesRing):
// warp w takes the same K slice, lane (g, t) chunks 4u + t (u = 0..3) of each group of 16
// chunks of rows g and g + 8, zeros past the slice as the rings' reads, the same MMA sequence
// per group and 16-row half (bf16: group_mma into the totals; FP8: chunk_mma into a fresh
// partial, then add_part) and the rings' finish (FP8: with its Scale, (sum · sx[m]) · ws[n]).
// silu_pair: the gate tile, then its up tile N / 2 further, in the same CTA.
//
// PDL: each CTA issues its first groups' weight loads, then griddepcontrol.wait; x (and sx)
// are read only after it.
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_fp8_math.cuh"
#include "backend/cuda/cuda_gemv_ring.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace sala::cuda {
namespace {
using namespace gemv;

constexpr int kTileRows = 16;

// A lane's walk over its warp's K slice of one 16-row tile, by groups of kCps = 16 chunks
// (the rings' stages): chunks 4u + t of rows g and g + 8, Depth groups ahead in a register
// ring (slot v % Depth holds group v).
template <int Depth>
struct ChunkLane {
  const uint8_t* w0;  // row g at chunk slice.cb + t; group v, chunk 4u + t: + 256 v + 64 u
  const uint8_t* w8;  // row g + 8
  int cb, ce, ngroups;
  uint4 W[Depth][2][4];

  __device__ __forceinline__ ChunkLane(const uint8_t* w, int64_t row_bytes, int64_t n0,
                                       int64_t N, const Slice& s, int g, int t)
      : cb(s.cb), ce(s.ce) {
    w0 = w + min(n0 + g, N - 1) * row_bytes + int64_t(s.cb + t) * 16;
    w8 = w + min(n0 + g + 8, N - 1) * row_bytes + int64_t(s.cb + t) * 16;
    ngroups = s.ce > s.cb ? (s.ce - s.cb + kCps - 1) / kCps : 0;
#pragma unroll
    for (int d = 0; d < Depth; ++d) issue(d, d, t);
  }
  // Group v's chunks into slot d = v % Depth (a constant in every unrolled caller).
  __device__ __forceinline__ void issue(int d, int v, int t) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const bool ok = v < ngroups && cb + kCps * v + 4 * u + t < ce;
      W[d][0][u] = ldg_stream_or_zero(w0 + 256 * int64_t(v) + 64 * u, ok);
      W[d][1][u] = ldg_stream_or_zero(w8 + 256 * int64_t(v) + 64 * u, ok);
    }
  }
};

// One tile's accumulators: for each group in order, group(W0, W8, X) with the chunks of rows
// g / g + 8 and the x fragments of n-tile 0 (zeros past the slice, as the rings').
template <int Depth, class Group>
__device__ __forceinline__ void direct_tile(ChunkLane<Depth>& L, const XRows& xr, int t,
                                            Group&& group) {
  for (int v0 = 0; v0 < L.ngroups; v0 += Depth) {
#pragma unroll
    for (int d = 0; d < Depth; ++d) {
      const int v = v0 + d;
      if (v >= L.ngroups) break;  // uniform over the warp
      const int c0 = L.cb + kCps * v;
      uint4 X[1][4];  // from L1 (the SM's CTAs share x)
      if (c0 + kCps <= L.ce)
        xr.load<1, true>(X, 0, c0, t, L.ce);
      else
        xr.load(X, 0, c0, t, L.ce);
      uint4 W0[4], W8[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) W0[u] = L.W[d][0][u], W8[u] = L.W[d][1][u];
      L.issue(d, v + Depth, t);
      group(W0, W8, X);
    }
  }
}

// x and sx have no __restrict__: under PDL they are written by the preceding grid.
// kFp8: e4m3 codes (16 k per chunk) with the scales sx [M], ws [N]; else bf16 (8 k per chunk).
// Grid: one CTA per 16-row tile (silu_pair: per gate tile, its up tile N / 2 further).
template <bool kFp8, int Depth>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_direct_kernel(const uint8_t* x, int64_t ldx_bytes, const float* sx,
                       const uint8_t* __restrict__ w, const float* __restrict__ ws, int64_t N,
                       int K, int M, GemvOut o) {
  __shared__ float red[kWarps][kTileRows][17];
  __shared__ float gate[kTileRows * 8];  // silu_pair: the gate tile's values [M][16]
  __shared__ float sxs[kGemvMaxRows];    // FP8: sx of the M rows
  pdl_trigger();
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int k_per_chunk = kFp8 ? gemv8::kChunkK : 8;
  const Slice s(K / k_per_chunk, int(threadIdx.x / 32));
  const int64_t row_bytes = kFp8 ? int64_t(K) : 2 * int64_t(K);
  const int64_t n0 = int64_t(blockIdx.x) * kTileRows;
  ChunkLane<Depth> L(w, row_bytes, n0, N, s, g, t);  // issues the first loads
  [[maybe_unused]] float wsn = kFp8 ? gemv8::tile_scale<kTileRows>(ws, n0, N) : 0.f;
  pdl_wait();  // every CTA: x, sx and y only after the preceding grid completed
  if constexpr (kFp8) gemv8::load_row_scales(sx, M, sxs);
  const XRows xr{x, ldx_bytes, M, g};
  auto tile = [&](float (&acc)[1][1][4]) {
    direct_tile(L, xr, t, [&](const uint4 (&W0)[4], const uint4 (&W8)[4], const uint4 (&X)[1][4]) {
      if constexpr (kFp8) {
        float part[1][4] = {};
#pragma unroll
        for (int u = 0; u < 4; ++u) gemv8::chunk_mma(part, W0[u], W8[u], X, u);
        gemv8::add_part(acc[0], 0, part);
      } else {
        group_mma<1>(acc[0], 0, W0, W8, X);
      }
    });
  };
  auto finish_tile = [&](const float (&acc)[1][1][4], int64_t n, Epi epi) {
    if constexpr (kFp8)
      finish<kTileRows>(red, acc, n, N, M, o, epi, gate, gemv8::Scale{sxs, wsn});
    else
      finish<kTileRows>(red, acc, n, N, M, o, epi, gate, NoScale{});
  };
  float acc[1][1][4] = {};
  tile(acc);
  if (!o.silu_pair) {
    finish_tile(acc, n0, Epi::kStore);
    return;
  }
  const int64_t nu = n0 + N / 2;  // the up rows of the gate rows n0 ..
  L = ChunkLane<Depth>(w, row_bytes, nu, N, s, g, t);  // loads under the gate's epilogue
  finish_tile(acc, n0, Epi::kKeepGate);
  if constexpr (kFp8) wsn = gemv8::tile_scale<kTileRows>(ws, nu, N);
  __syncthreads();  // red is reused; gate is read by the thread that wrote it
  float up[1][1][4] = {};
  tile(up);
  finish_tile(up, nu, Epi::kSiluMul);
}

template <bool kFp8>
void launch_direct(const uint8_t* x, int64_t ldx_bytes, const float* sx, const uint8_t* w,
                   const float* ws, int64_t N, int K, int M, const GemvOut& o, cudaStream_t st,
                   int depth) {
  const int64_t units = o.silu_pair ? N / (2 * kTileRows) : (N + kTileRows - 1) / kTileRows;
  launch_pdl(depth == 1 ? gemv_direct_kernel<kFp8, 1> : gemv_direct_kernel<kFp8, 2>,
             dim3(unsigned(units)), dim3(kThreads), 0, st, x, ldx_bytes, sx, w, ws, N, K, M, o);
}

[[noreturn]] void unsupported(const char* what, int M, int K, int64_t N, int64_t ld,
                              bool silu_pair, int depth) {
  std::fprintf(stderr,
               "%s:%d: direct %s GEMV unsupported: M = %d, K = %d, N = %lld, ld = %lld, "
               "silu_pair = %d, depth = %d\n",
               __FILE__, __LINE__, what, M, K, static_cast<long long>(N),
               static_cast<long long>(ld), int(silu_pair), depth);
  std::abort();
}

}  // namespace

bool gemv_direct_supported(int64_t M) { return M >= 1 && M <= kGemvDirectMaxRows; }

void launch_gemv_direct(const bf16* x, int64_t ldx, const bf16* w, int64_t N, int K, int M,
                        const GemvOut& o, cudaStream_t st, int depth) {
  if (!(gemv_direct_supported(M) && gemv_supported(x, ldx, w, K, M) && N >= 1 && depth >= 1 &&
        depth <= 2) ||
      (o.silu_pair && N % (2 * kTileRows) != 0))
    unsupported("bf16", M, K, N, ldx, o.silu_pair, depth);
  launch_direct<false>(reinterpret_cast<const uint8_t*>(x), ldx * 2, nullptr,
                       reinterpret_cast<const uint8_t*>(w), nullptr, N, K, M, o, st, depth);
}

void launch_gemv_fp8_direct(const uint8_t* xq, int64_t ldq, const float* sx, const uint8_t* w,
                            const float* w_scales, int64_t N, int K, int M, const GemvOut& o,
                            cudaStream_t st, int depth) {
  if (!(gemv_direct_supported(M) && gemv_fp8_supported(w, K, M) && ldq % 16 == 0 &&
        aligned16(xq) && sx && N >= 1 && depth >= 1 && depth <= 2) ||
      (o.silu_pair && N % (2 * kTileRows) != 0))
    unsupported("FP8", M, K, N, ldq, o.silu_pair, depth);
  launch_direct<true>(xq, ldq, sx, w, w_scales, N, K, M, o, st, depth);
}

}  // namespace sala::cuda
