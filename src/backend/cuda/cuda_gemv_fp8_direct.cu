// The FP8 GEMV for runs of M <= 8 rows without a shared-memory ring: each lane loads its
// weight chunks straight into registers, a group (256 k) or more ahead, with PDL.
//
// Why: the ring kernel (cuda_gemv_fp8.cu) runs one 8-warp CTA per SM and streams ≈ 2.6 TB/s
// at M = 1 (61 % of the device copy); its probes (PERF.md, session 36) found its time equal
// to its copies' alone. Here a CTA is 8 warps on one 16-row tile with ≈ 9 KB of shared memory,
// 2 CTAs per SM, and each lane keeps Depth groups of its chunks in flight in registers (2 x
// 128 B per group: ≈ 128 KB per SM at Depth 2, the ring's amount), without copy instructions
// or ring barriers. (The tile kernel of the same file, the A100 fallback, loads one group at a
// time without PDL.)
//
// Same bits as the ring kernel (CudaFp8Gemv.DirectMatchesRing): warp w takes the same K slice,
// lane (g, t) chunks 4u + t (u = 0..3) of each group of rows g and g + 8, zeros past the
// slice as the ring's reads, the same chunk_mma / add_part sequence per group and half, and
// the ring's finish with its Scale ((sum · sx[m]) · ws[n], rounded once). silu_pair: the gate
// tile, then its up tile N / 2 further, in the same CTA.
//
// PDL: each CTA issues its first groups' weight loads, then griddepcontrol.wait; the x codes
// and sx are read only after it.
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
using namespace gemv8;

constexpr int kTileRows = 16;

// A lane's walk over its warp's K slice of one 16-row tile, by groups of kCps = 16 chunks
// (the ring's stages): chunks 4u + t of rows g and g + 8, Depth groups ahead in a register
// ring (slot v % Depth holds group v).
template <int Depth>
struct Fp8Lane {
  const uint8_t* w0;  // row g at chunk slice.cb + t; group v, chunk 4u + t: + 256 v + 64 u
  const uint8_t* w8;  // row g + 8
  int cb, ce, ngroups;
  uint4 W[Depth][2][4];

  __device__ __forceinline__ Fp8Lane(const uint8_t* w, int K, int64_t n0, int64_t N,
                                     const Slice& s, int g, int t)
      : cb(s.cb), ce(s.ce) {
    w0 = w + min(n0 + g, N - 1) * int64_t(K) + int64_t(s.cb + t) * 16;
    w8 = w + min(n0 + g + 8, N - 1) * int64_t(K) + int64_t(s.cb + t) * 16;
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

// One tile's accumulators: per group, a fresh partial over its 4 chunks (chunk_mma), added to
// the totals (add_part): the ring's sequence for one 16-row half.
template <int Depth>
__device__ __forceinline__ void fp8_direct_tile(float (&acc)[1][1][4], Fp8Lane<Depth>& L,
                                                const XRows& xr, int t) {
  for (int v0 = 0; v0 < L.ngroups; v0 += Depth) {
#pragma unroll
    for (int d = 0; d < Depth; ++d) {
      const int v = v0 + d;
      if (v >= L.ngroups) break;  // uniform over the warp
      const int c0 = L.cb + kCps * v;
      uint4 X[1][4];  // from L1 (the SM's CTAs share x); zeros past the slice as the ring's
      if (c0 + kCps <= L.ce)
        xr.load<1, true>(X, 0, c0, t, L.ce);
      else
        xr.load(X, 0, c0, t, L.ce);
      uint4 W0[4], W8[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) W0[u] = L.W[d][0][u], W8[u] = L.W[d][1][u];
      L.issue(d, v + Depth, t);
      float part[1][4] = {};
#pragma unroll
      for (int u = 0; u < 4; ++u) chunk_mma(part, W0[u], W8[u], X, u);
      add_part(acc[0], 0, part);
    }
  }
}

// x and sx have no __restrict__: under PDL they are written by the preceding grid.
// Grid: one CTA per 16-row tile (silu_pair: per gate tile, its up tile N / 2 further).
template <int Depth>
__global__ void __launch_bounds__(kThreads, 2)
    gemv8_direct_kernel(const uint8_t* x, int64_t ldx, const float* sx,
                        const uint8_t* __restrict__ w, const float* __restrict__ ws, int64_t N,
                        int K, int M, GemvOut o) {
  __shared__ float red[kWarps][kTileRows][17];
  __shared__ float gate[kTileRows * 8];  // silu_pair: the gate tile's values [M][16]
  __shared__ float sxs[kGemvMaxRows];
  pdl_trigger();
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const Slice s(K / kChunkK, int(threadIdx.x / 32));
  const int64_t n0 = int64_t(blockIdx.x) * kTileRows;
  Fp8Lane<Depth> L(w, K, n0, N, s, g, t);  // issues the first loads
  float wsn = tile_scale<kTileRows>(ws, n0, N);
  pdl_wait();  // every CTA: x, sx and y only after the preceding grid completed
  load_row_scales(sx, M, sxs);
  const XRows xr{x, ldx, M, g};
  float acc[1][1][4] = {};
  fp8_direct_tile<Depth>(acc, L, xr, t);
  if (!o.silu_pair) {
    finish<kTileRows>(red, acc, n0, N, M, o, Epi::kStore, gate, Scale{sxs, wsn});
    return;
  }
  const int64_t nu = n0 + N / 2;  // the up rows of the gate rows n0 ..
  L = Fp8Lane<Depth>(w, K, nu, N, s, g, t);  // loads under the gate's epilogue
  finish<kTileRows>(red, acc, n0, N, M, o, Epi::kKeepGate, gate, Scale{sxs, wsn});
  wsn = tile_scale<kTileRows>(ws, nu, N);
  __syncthreads();  // red is reused; gate is read by the thread that wrote it
  float up[1][1][4] = {};
  fp8_direct_tile<Depth>(up, L, xr, t);
  finish<kTileRows>(red, up, nu, N, M, o, Epi::kSiluMul, gate, Scale{sxs, wsn});
}

}  // namespace

bool gemv_fp8_direct_supported(int64_t M) { return M >= 1 && M <= kFp8DirectMaxRows; }

void launch_gemv_fp8_direct(const uint8_t* xq, int64_t ldq, const float* sx, const uint8_t* w,
                            const float* w_scales, int64_t N, int K, int M, const GemvOut& o,
                            cudaStream_t st, int depth) {
  if (!(gemv_fp8_direct_supported(M) && gemv_fp8_supported(w, K, M) && ldq % 16 == 0 &&
        aligned16(xq) && sx && N >= 1 && depth >= 1 && depth <= 2) ||
      (o.silu_pair && N % (2 * kTileRows) != 0)) {
    std::fprintf(stderr,
                 "%s:%d: direct FP8 GEMV unsupported: M = %d, K = %d, N = %lld, ldq = %lld, "
                 "silu_pair = %d, depth = %d\n",
                 __FILE__, __LINE__, M, K, static_cast<long long>(N),
                 static_cast<long long>(ldq), int(o.silu_pair), depth);
    std::abort();
  }
  const int64_t units = o.silu_pair ? N / (2 * kTileRows) : (N + kTileRows - 1) / kTileRows;
  launch_pdl(depth == 1 ? gemv8_direct_kernel<1> : gemv8_direct_kernel<2>, dim3(unsigned(units)),
             dim3(kThreads), 0, st, xq, ldq, sx, w, w_scales, N, K, M, o);
}

}  // namespace sala::cuda
