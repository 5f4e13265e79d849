// Skinny GEMM for decode and verify rows (M <= kGemvMaxRows = 64) on tensor cores, one pass
// over the weights for all M rows: y[m, n] = Σ_k x[m, k] W[n, k]. Shared machinery (slices,
// ring, tile walk, epilogue): cuda_gemv_ring.cuh.
//
// Numerics: mma.sync m16n8k16 (bf16 in, fp32 accumulate) with W as the A operand (16 weight
// rows per m16 tile) and the input rows as B in NT n8 tiles (NT = 1, 2, 4, 8 for M <= 8, 16,
// 32, 64; rows past M are zeros in registers, tiles wholly past M are skipped). Lane (g, t) of
// a warp takes 8 consecutive k of weight rows g and g+8 at chunk c = 4u + t, and the same chunk
// of input rows g + 8 nt, and uses elements 0-3 / 4-7 as the two k16 steps (k is permuted
// identically in A and B, so the dot products are unchanged). The 8 warps of a CTA split K
// into fixed slices; their partial tiles are summed in shared memory in warp order and rounded
// once (in passes of 16 input columns).
//
// Row invariance: every output (n, m) is one accumulator column of the same mma sequence (per
// 4-chunk step u: the k16 of elements 0-3, then of 4-7, in chunk order), whose k order and K
// split depend only on K; its 8 partials are summed in warp order. Other rows of x only feed
// other columns of B, and NT only decides how many columns exist and in which order the
// (independent) accumulators are issued: a row's result is bit-identical for any M in 1..64
// (and in a padded recorded step), and the M <= 16 results are those of the NT <= 2 kernel
// before M went to 64. Outputs may be split over up to 4 tensors (stacked weights).
//
// Streaming (ring kernel). Loading a group of W into registers, then multiplying, keeps at
// most 4 KB per warp in flight, ~0 between groups, while HBM needs ~35-65 KB per SM in flight
// all the time (latency x bandwidth / SMs): such a kernel stops well short of the HBM
// bandwidth. Here persistent CTAs (grid = min(tiles, SMs), one per SM, 220 KB of shared
// memory) walk tiles of 32 weight rows; each warp streams its K slice through a private
// 3-stage ring (stage: 32 rows x 256 B; M <= 16 on sm_90: one bulk copy per row on the slot's
// mbarrier, cuda_gemv_ring.cuh's issue_stage), refilled as soon as a stage is consumed,
// across tile boundaries: ~128 KB per SM stay in flight and there is no ramp per CTA. A
// stage's W fragments (both 16-row halves, 64 registers) stay in registers while the x
// fragments are loaded kGroupNT n-tiles at a time (NT = 8's would need 128 registers), the
// next group's while the MMAs of this one run (two sets, 244 registers at NT = 8, no spill:
// M = 40 at 16384 x 4096 74.1 -> 67.9 us, 4096 x 16384 74.4 -> 59.8 us, session 18): x is
// read once per stage and 32 weight rows, i.e. M / 32 of the weight bytes again from L1/L2.
//
// PDL (sm_90+). The ring kernel is launched with programmatic stream serialization: it may
// start while the kernel before it still runs, once every CTA of that kernel has executed
// pdl_trigger() (every kernel of a decode step calls it first, in pdl_begin(), so the GEMV
// can launch while the chain of small kernels before it runs). Each CTA issues its first two
// weight stages, then waits (griddepcontrol.wait: the preceding grid has completed and its
// writes are visible); x is read and y written only after that. Weights are never written by
// kernels, so this is safe whatever kernel precedes it (one without a trigger: no overlap).
//
// Fallback: a GPU whose per-block shared memory opt-in is below the ring's (A100: 163 KB)
// runs the tile kernel: one CTA per 16 weight rows, W loaded straight into registers, the same
// slices and mma sequence (group_mma), no PDL.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_row_tail.cuh"
#include "backend/cuda/cuda_gemv_ring.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {
using namespace gemv;

constexpr int kRingSmem = kRingBytes + kRedBytes + kGateBytes;  // 225,280 B
static_assert(kRingSmem <= kRingMaxSmem, "the ring does not fit an sm_90 SM");

// The arithmetic of the ring and tile kernels below.
// One group (16 chunks) of a 16-row tile for n-tiles nt0 .. nt0 + G - 1: A = rows g / g + 8,
// chunk 4u + t in A[u] / B[u]. Per accumulator: u = 0..3, each the k16 of elements 0-3, then
// 4-7 (the order every M sees).
template <int G, int NT>
__device__ __forceinline__ void group_mma(float (&acc)[NT][4], int nt0, const uint4 (&A)[4],
                                          const uint4 (&B)[4], const uint4 (&X)[G][4]) {
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int j = 0; j < G; ++j) {
      mma_bf16(acc[nt0 + j], A[u].x, B[u].x, A[u].y, B[u].y, X[j][u].x, X[j][u].y);
      mma_bf16(acc[nt0 + j], A[u].z, B[u].z, A[u].w, B[u].w, X[j][u].z, X[j][u].w);
    }
}

struct NoScale {  // finish's scaling of bf16 weights: none
  __device__ float operator()(float v, int) const { return v; }
};

// ---- ring kernel ----
// x has no __restrict__: under PDL it is written by the preceding grid while this one runs,
// so no load of it may be moved above pdl_wait().
template <int NT>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_ring_kernel(const bf16* x, int64_t ldx, const bf16* __restrict__ w, int64_t N, int K,
                     int M, GemvOut o, int ntiles) {
  constexpr int G = NT < kGroupNT ? NT : kGroupNT, NG = NT / G;
  constexpr bool kBulk = bulk_rows(NT);  // how the ring's stages are filled (issue_stage)
  extern __shared__ __align__(128) unsigned char smem[];
  pdl_trigger();  // a GEMV after this one may start its weight prologue
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(smem)) + warp * kStages * kStage;
  auto red = reinterpret_cast<float(*)[kRows][17]>(smem + kRingBytes);
  float* gate = reinterpret_cast<float*>(smem + kRingBytes + kRedBytes);
  const Slice s(K / 8, warp);
  const Walk wk(ntiles, o.silu_pair, s);
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  const int64_t row_bytes = int64_t(K) * 2;
  Cursor cur;
  ring_init<kBulk>(ring);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue_stage<kBulk>(wk, cur, ring, s, wb, row_bytes, N);
  pdl_wait();  // every CTA, tiles or not: x and y only after the preceding grid completed
  const XRows xr{reinterpret_cast<const uint8_t*>(x), ldx * 2, M, g};
  const uint32_t lo = lane_off(g, t);
  int u = 0;
  for (int ti = 0; ti < wk.ntc; ++ti) {
    float acc[2][NT][4] = {};
    for (int st = 0; st < wk.nst; ++st, ++u) {
      const int c0 = s.cb + st * kCps;
      // kFull: every chunk of the stage is inside the slice (every stage of the 9B's shapes),
      // so no load needs a bound or zeros; a slice's partial last stage takes the other copy.
      auto stage = [&]<bool kFull>() {
        uint4 X[2][G][4];  // two n-tile groups' fragments: group q + 1's load overlaps q's MMAs
        xr.load<G, kFull>(X[0], 0, c0, t, s.ce);  // group 0, in flight while waiting for W
        stage_wait<kStages - 2, kBulk>(ring, u);  // stage u landed; slot (u - 1) % S read
        issue_stage<kBulk>(wk, cur, ring, s, wb, row_bytes, N);  // u + 2: kStages - 1 in flight
        const uint32_t base = ring + (u % kStages) * kStage;
        uint4 A[2][4], B[2][4];
#pragma unroll
        for (int rt = 0; rt < 2; ++rt)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const bool ok = c0 + 4 * v + t < s.ce;
            A[rt][v] = ring_read<kFull>(base + lo + row_off(rt * 16) + v * 64, ok);
            B[rt][v] = ring_read<kFull>(base + lo + row_off(rt * 16 + 8) + v * 64, ok);
          }
#pragma unroll
        for (int q = 0; q < NG; ++q) {
          if (8 * G * q >= M) break;  // n-tiles wholly past M (uniform)
          if (q + 1 < NG && 8 * G * (q + 1) < M)
            xr.load<G, kFull>(X[(q + 1) & 1], G * (q + 1), c0, t, s.ce);
#pragma unroll
          for (int rt = 0; rt < 2; ++rt) group_mma<G>(acc[rt], G * q, A[rt], B[rt], X[q & 1]);
        }
      };
      if (c0 + kCps <= s.ce)
        stage.template operator()<true>();
      else
        stage.template operator()<false>();
    }
    finish<kRows>(red, acc, int64_t(wk.tile(ti)) * kRows, N, M, o, wk.epi(ti), gate, NoScale{});
    __syncthreads();  // red is reused by the next tile
  }
  cp_wait<0>();  // only empty groups can remain
  gemv_row_tail<kThreads>(o, M, reinterpret_cast<float*>(smem + kRingBytes));
}

// ---- tile kernel (fallback) ----
// Two CTAs per SM up to NT = 4; NT = 8 needs the registers of one.
template <int NT>
__global__ void __launch_bounds__(kThreads, NT <= 4 ? 2 : 1)
    gemv_tile_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int64_t N,
                     int K, int M, GemvOut o) {
  constexpr int G = NT < kGroupNT ? NT : kGroupNT, NG = NT / G;
  __shared__ float red[kWarps][16][17];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const Slice s(K / 8, warp);
  const uint4* wa = reinterpret_cast<const uint4*>(w + min(n0 + g, N - 1) * int64_t(K));
  const uint4* wb = reinterpret_cast<const uint4*>(w + min(n0 + g + 8, N - 1) * int64_t(K));
  const XRows xr{reinterpret_cast<const uint8_t*>(x), ldx * 2, M, g};
  const uint4 z = make_uint4(0, 0, 0, 0);
  float acc[1][NT][4] = {};
  for (int c0 = s.cb; c0 < s.ce; c0 += 16) {
    uint4 A[4], B[4], X[G][4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c = c0 + 4 * u + t;
      A[u] = c < s.ce ? ld_stream(wa + c) : z;
      B[u] = c < s.ce ? ld_stream(wb + c) : z;
    }
#pragma unroll
    for (int q = 0; q < NG; ++q) {
      if (8 * G * q >= M) break;
      xr.load(X, G * q, c0, t, s.ce);
      group_mma<G>(acc[0], G * q, A, B, X);
    }
  }
  finish<16>(red, acc, n0, N, M, o, Epi::kStore, nullptr, NoScale{});
}

// ---- host side ----
using Setup = RingDevice;

// The device's properties once per process (the GPUs of one process are alike); the kernels'
// shared-memory attributes once per device, outside any stream capture when called from each
// backend's constructor (gemv_init).
const Setup& setup() {
  static const Setup s = ring_device(kRingSmem);
  static OncePerDevice attributes;  // per device: a TP rank's backend may run on another GPU
  if (s.ring)
    attributes([] {
      for (auto* k : {gemv_ring_kernel<1>, gemv_ring_kernel<2>, gemv_ring_kernel<4>,
                      gemv_ring_kernel<8>})
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingSmem));
    });
  return s;
}

}  // namespace

void gemv_init() {
  setup();
}

bool gemv_silu_pair_supported(int64_t N) {
  return setup().ring && N % (2 * kRows) == 0;
}

bool gemv_row_tail_supported() {
  return setup().ring;
}

bool gemv_supported(const void* x, int64_t ldx, const void* w, int64_t K, int64_t M) {
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return M >= 1 && M <= kGemvMaxRows && K % 8 == 0 && ldx % 8 == 0 && a16(x) && a16(w);
}

void launch_gemv(const bf16* x, int64_t ldx, const bf16* w, int64_t N, int K, int M,
                 const GemvOut& o, cudaStream_t st) {
  const Setup& s = setup();
  if (o.silu_pair && !gemv_silu_pair_supported(N)) {  // callers ask gemv_silu_pair_supported
    std::fprintf(stderr, "%s:%d: silu_pair GEMV on N = %lld rows unsupported\n", __FILE__, __LINE__,
                 static_cast<long long>(N));
    std::abort();
  }
  // Callers ask gemv_row_tail_supported and gemv_norm_tail_fits.
  if (o.tail.h && !(s.ring && row_tail_ok(o, N, M))) {
    std::fprintf(stderr, "%s:%d: GEMV with a row tail: unsupported shape (N = %lld, M = %d)\n",
                 __FILE__, __LINE__, static_cast<long long>(N), M);
    std::abort();
  }
  with_nt(M, [&]<int NT>() {
    if (!s.ring) {
      gemv_tile_kernel<NT><<<unsigned((N + 15) / 16), kThreads, 0, st>>>(x, ldx, w, N, K, M, o);
      CUDA_CHECK_LAUNCH();
      return;
    }
    const int ntiles = int((N + kRows - 1) / kRows);  // every CTA has >= 1 tile
    launch_pdl(gemv_ring_kernel<NT>, dim3(unsigned(std::min(ntiles, s.sms))), dim3(kThreads),
               size_t(kRingSmem), st, x, ldx, w, N, K, M, o, ntiles);
  });
}

}  // namespace sala::cuda
