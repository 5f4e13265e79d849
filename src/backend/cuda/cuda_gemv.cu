// Skinny GEMM for decode rows (M <= 16) on tensor cores: y[m, n] = Σ_k x[m, k] W[n, k].
//
// Numerics: mma.sync m16n8k16 (bf16 in, fp32 accumulate) with W as the A operand (16 weight
// rows per m16 tile) and the input rows as B (one n8 tile for M <= 8, two for M <= 16; rows
// past M are zeros in registers). Lane (g, t) of a warp takes 8 consecutive k of weight rows g
// and g+8 at chunk c = 4u + t, and the same chunk of input row g, and uses elements 0-3 / 4-7
// as the two k16 steps (k is permuted identically in A and B, so the dot products are
// unchanged). The 8 warps of a CTA split K into fixed slices; their partial tiles are summed
// in shared memory in warp order and rounded once.
//
// Batch invariance: every output (n, m) is one accumulator column of the same mma sequence,
// whose k order and K split depend only on K. Other rows of x only feed other columns of B,
// so a row's result is bit-identical for any M in 1..16 (and in a padded recorded step).
// Outputs may be split over up to 4 tensors (stacked weights).
//
// Streaming (ring kernel). Loading a group of W into registers, then multiplying, keeps at
// most 4 KB per warp in flight, ~0 between groups, while HBM needs ~35-65 KB per SM in flight
// all the time (latency x bandwidth / SMs): such a kernel stops well short of the HBM
// bandwidth. Here persistent CTAs (grid = min(tiles, SMs), one per SM, 214 KB of shared
// memory) walk tiles of 32 weight rows; each warp streams its K slice through a private
// 3-stage cp.async ring (stage: 32 rows x 256 B), refilled as soon as a stage is consumed,
// across tile boundaries: ~128 KB per SM stay in flight and there is no ramp per CTA. One
// stage's x fragments feed both 16-row halves of a tile (half the x re-reads). The numerics
// are the same as above: same slices, same mma sequence, same reduction order.
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
// runs the tile kernel: one CTA per 16 weight rows, W loaded straight into registers, no PDL.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace sala::cuda {
namespace {

constexpr int kWarps = 8;  // K slices per CTA: part of the numerics
constexpr int kThreads = 32 * kWarps;

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// K slice of warp w: 16-byte chunks [cb, ce) (empty when ce <= cb), 4·ceil(K/8/8/4) long.
struct Slice {
  int cb, ce;
  __device__ Slice(int K, int w) {
    const int kc = K / 8, per = ((kc + kWarps - 1) / kWarps + 3) / 4 * 4;
    cb = w * per;
    ce = min(cb + per, kc);
  }
};

// B fragments: lane (g, t) feeds input rows g and g + 8 (NT = 2); zeros past M.
template <int NT>
struct XRows {
  const uint4* r[NT];
  bool v[NT];
  __device__ XRows(const bf16* x, int64_t ldx, int M, int g) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      v[nt] = g + 8 * nt < M;
      r[nt] = reinterpret_cast<const uint4*>(x + int64_t(v[nt] ? g + 8 * nt : 0) * ldx);
    }
  }
  // Chunks c0 + 4u + t, u < 4, of the slice ending at ce.
  __device__ void load(uint4 (&X)[NT][4], int c0, int t, int ce) const {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c = c0 + 4 * u + t;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        X[nt][u] = c < ce && v[nt] ? __ldg(r[nt] + c) : make_uint4(0, 0, 0, 0);
    }
  }
};

// One group (16 chunks) of a 16-row tile: A = rows g / g + 8, chunk 4u + t in A[u] / B[u].
template <int NT>
__device__ __forceinline__ void group_mma(float (&acc)[NT][4], const uint4 (&A)[4],
                                          const uint4 (&B)[4], const uint4 (&X)[NT][4]) {
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma_bf16(acc[nt], A[u].x, B[u].x, A[u].y, B[u].y, X[nt][u].x, X[nt][u].y);
      mma_bf16(acc[nt], A[u].z, B[u].z, A[u].w, B[u].w, X[nt][u].z, X[nt][u].w);
    }
}

// What a tile's epilogue does with its rounded values (GemvOut::silu_pair: the gate tile
// parks them in shared memory, the up tile of the same columns combines).
enum class Epi { kStore, kKeepGate, kSiluMul };

// Epilogue of a tile of ROWS = 16 R weight rows from n0: the warps' partial tiles to shared
// memory, summed in warp order, rounded once. c0, c1 of acc[rt][nt]: (weight row rt·16 + g,
// input rows nt·8 + 2t, + 1); c2, c3: weight row rt·16 + g + 8. kKeepGate / kSiluMul: gate
// [ROWS][16] holds the gate tile's bf16 values; thread i keeps and reads the same (row, m).
template <int ROWS, int R, int NT>
__device__ __forceinline__ void finish(float (*red)[ROWS][17], const float (&acc)[R][NT][4],
                                       int64_t n0, int64_t N, int M, const GemvOut& o,
                                       Epi epi = Epi::kStore, float* gate = nullptr) {
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int rt = 0; rt < R; ++rt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        red[warp][rt * 16 + g + 8 * (i / 2)][nt * 8 + 2 * t + i % 2] = acc[rt][nt][i];
  __syncthreads();
  for (int i = threadIdx.x; i < ROWS * 16; i += kThreads) {
    const int nl = i % ROWS, m = i / ROWS;
    const int64_t n = n0 + nl;
    if (m >= M || n >= N) continue;
    float v = red[0][nl][m];
#pragma unroll
    for (int q = 1; q < kWarps; ++q) v += red[q][nl][m];
    if (epi == Epi::kKeepGate) {
      gate[i] = rb(v);
      continue;
    }
    if (epi == Epi::kSiluMul) {  // n is an up row; its gate row is n - N / 2
      const float gv = gate[i];
      static_cast<bf16*>(o.y[0])[m * o.cols[0] + n - N / 2] = f2b(rb(gv / (1.f + expf(-gv))) * rb(v));
      continue;
    }
    int p = 0;
    while (p + 1 < o.nparts && n >= o.end[p]) ++p;
    const int64_t col = n - (p ? o.end[p - 1] : 0);
    if (o.f32)
      static_cast<float*>(o.y[p])[m * o.cols[p] + col] = rb(v);
    else
      static_cast<bf16*>(o.y[p])[m * o.cols[p] + col] = f2b(v);
  }
}

// ---- ring kernel ----
// A warp's stage: kRows weight rows x kCps chunks (256 B) of its slice. Even rows, then odd
// rows 64 B further (at 64 mod 128): lane (g, t) reading chunk 4v + t of row g hits 8
// distinct 16-byte bank groups per quarter warp, no swizzle, every row one contiguous run.
constexpr int kRows = 32, kCps = 16, kStages = 3;
constexpr int kHalf = kRows / 2 * kCps * 16, kStage = 2 * kHalf + 128;
constexpr int kRingSmem =
    kWarps * kStages * kStage + kWarps * kRows * 17 * 4 + kRows * 16 * 4;  // 219,136 B
static_assert(kRingSmem <= 227 * 1024, "the ring does not fit an sm_90 SM");

__device__ __forceinline__ uint32_t row_off(int r) {
  return (r & 1) * (kHalf + 64) + (r >> 1) * kCps * 16;
}
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint4 lds(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a)
               : "memory");
  return v;
}

// x has no __restrict__: under PDL it is written by the preceding grid while this one runs,
// so no load of it may be moved above pdl_wait().
template <int NT>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_ring_kernel(const bf16* x, int64_t ldx, const bf16* __restrict__ w, int64_t N, int K,
                     int M, GemvOut o, int ntiles) {
  extern __shared__ __align__(128) unsigned char smem[];
  pdl_trigger();  // a GEMV after this one may start its weight prologue
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(smem)) + warp * kStages * kStage;
  auto red = reinterpret_cast<float(*)[kRows][17]>(smem + kWarps * kStages * kStage);
  float* gate = reinterpret_cast<float*>(smem + kWarps * kStages * kStage + kWarps * kRows * 17 * 4);
  const Slice s(K, warp);
  const int nst = s.ce > s.cb ? (s.ce - s.cb + kCps - 1) / kCps : 0;  // stages per tile
  const int bx = int(blockIdx.x), gx = int(gridDim.x);
  // Tiles bx, bx + gx, ...; with silu_pair, units bx, bx + gx, ... of the ntiles / 2 gate
  // tiles, each followed by its up tile (ntiles / 2 further), so both meet in this CTA.
  const bool pair = o.silu_pair;
  const int units = pair ? ntiles / 2 : ntiles;
  const int nuc = bx < units ? (units - 1 - bx) / gx + 1 : 0;
  const int ntc = pair ? 2 * nuc : nuc;
  auto tile_of = [&](int ti) { return pair ? bx + (ti >> 1) * gx + (ti & 1) * units : bx + ti * gx; };
  const int U = ntc * nst;                                       // stages this warp consumes
  // Stage u (stage u % nst of tile u / nst) into slot u % kStages: one commit group per call,
  // empty from U on, so that cp.async.wait_group counts stages. 2 rows x 256 B per instruction.
  auto issue = [&](int u) {
    if (u < U) {
      const int ti = u / nst, c0 = s.cb + (u - ti * nst) * kCps, nv = min(kCps, s.ce - c0);
      const int64_t n0 = int64_t(tile_of(ti)) * kRows;
      const uint32_t dst = ring + (u % kStages) * kStage;
#pragma unroll
      for (int j = 0; j < kRows * kCps / 32; ++j) {
        const int q = j * 32 + lane, r = q / kCps, c = q % kCps;
        if (c < nv)
          cp16(dst + row_off(r) + c * 16, w + min(n0 + r, N - 1) * int64_t(K) + (c0 + c) * 8);
      }
    }
    cp_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  pdl_wait();  // every CTA, tiles or not: x and y only after the preceding grid completed
  const XRows<NT> xr(x, ldx, M, g);
  const uint4 z = make_uint4(0, 0, 0, 0);
  int u = 0;
  for (int ti = 0; ti < ntc; ++ti) {
    float acc[2][NT][4] = {};
    for (int st = 0; st < nst; ++st, ++u) {
      const int c0 = s.cb + st * kCps;
      uint4 X[NT][4];
      xr.load(X, c0, t, s.ce);  // from L1/L2, in flight while waiting for W
      cp_wait<kStages - 2>();
      __syncwarp();            // every lane's copies of stage u landed; slot (u - 1) % S read
      issue(u + kStages - 1);  // refill that slot: kStages - 1 stages stay in flight
      const uint32_t base = ring + (u % kStages) * kStage;
#pragma unroll
      for (int rt = 0; rt < 2; ++rt) {
        uint4 A[4], B[4];
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const int cl = 4 * v + t;
          const bool ok = c0 + cl < s.ce;
          A[v] = ok ? lds(base + row_off(rt * 16 + g) + cl * 16) : z;
          B[v] = ok ? lds(base + row_off(rt * 16 + g + 8) + cl * 16) : z;
        }
        group_mma(acc[rt], A, B, X);
      }
    }
    const Epi epi = !pair ? Epi::kStore : (ti & 1) ? Epi::kSiluMul : Epi::kKeepGate;
    finish<kRows>(red, acc, int64_t(tile_of(ti)) * kRows, N, M, o, epi, gate);
    __syncthreads();  // red is reused by the next tile
  }
  cp_wait<0>();  // only empty groups can remain
}

// ---- tile kernel (fallback) ----
template <int NT>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_tile_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int64_t N,
                     int K, int M, GemvOut o) {
  __shared__ float red[kWarps][16][17];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const Slice s(K, warp);
  const uint4* wa = reinterpret_cast<const uint4*>(w + min(n0 + g, N - 1) * int64_t(K));
  const uint4* wb = reinterpret_cast<const uint4*>(w + min(n0 + g + 8, N - 1) * int64_t(K));
  const XRows<NT> xr(x, ldx, M, g);
  const uint4 z = make_uint4(0, 0, 0, 0);
  float acc[1][NT][4] = {};
  for (int c0 = s.cb; c0 < s.ce; c0 += 16) {
    uint4 A[4], B[4], X[NT][4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c = c0 + 4 * u + t;
      A[u] = c < s.ce ? ld_stream(wa + c) : z;
      B[u] = c < s.ce ? ld_stream(wb + c) : z;
    }
    xr.load(X, c0, t, s.ce);
    group_mma(acc[0], A, B, X);
  }
  finish<16>(red, acc, n0, N, M, o);
}

// ---- host side ----
struct Setup {
  bool ring;  // the ring's shared memory fits this GPU
  bool pdl;   // launch it with programmatic stream serialization
  int sms;
};

// Once per process, for the current device (the engine uses one): outside any stream capture
// when called from the backend's constructor (gemv_init).
const Setup& setup() {
  static const Setup s = [] {
    int dev = 0, optin = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    Setup r{optin >= kRingSmem, false, sms};
    if (r.ring) {
      for (auto* k : {gemv_ring_kernel<1>, gemv_ring_kernel<2>})
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingSmem));
      r.pdl = pdl_launch_enabled();
    }
    return r;
  }();
  return s;
}

template <int NT>
void launch_t(const bf16* x, int64_t ldx, const bf16* w, int64_t N, int K, int M, const GemvOut& o,
              cudaStream_t st) {
  const Setup& s = setup();
  if (o.silu_pair && (!s.ring || N % (2 * kRows) != 0)) {  // callers ask gemv_silu_pair_supported
    std::fprintf(stderr, "%s:%d: silu_pair GEMV on N = %lld rows unsupported\n", __FILE__, __LINE__,
                 static_cast<long long>(N));
    std::abort();
  }
  if (!s.ring) {
    gemv_tile_kernel<NT><<<unsigned((N + 15) / 16), kThreads, 0, st>>>(x, ldx, w, N, K, M, o);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const int ntiles = int((N + kRows - 1) / kRows);
  cudaLaunchAttribute at[1] = {};
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(std::min(ntiles, s.sms)));  // every CTA has >= 1 tile
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kRingSmem;
  cfg.stream = st;
  cfg.attrs = at;
  cfg.numAttrs = s.pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemv_ring_kernel<NT>, x, ldx, w, N, K, M, o, ntiles));
}

}  // namespace

void gemv_init() {
  setup();
}

bool gemv_silu_pair_supported(int64_t N) {
  return setup().ring && N % (2 * kRows) == 0;
}

bool gemv_supported(const void* x, int64_t ldx, const void* w, int64_t K, int64_t M) {
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return M >= 1 && M <= kGemvMaxRows && K % 8 == 0 && ldx % 8 == 0 && a16(x) && a16(w);
}

void launch_gemv(const bf16* x, int64_t ldx, const bf16* w, int64_t N, int K, int M,
                 const GemvOut& o, cudaStream_t st) {
  if (M <= 8)
    launch_t<1>(x, ldx, w, N, K, M, o, st);
  else
    launch_t<2>(x, ldx, w, N, K, M, o, st);
}

}  // namespace sala::cuda
