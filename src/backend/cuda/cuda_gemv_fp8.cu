// W8A8 FP8 skinny GEMM for decode and verify rows (M <= kGemvMaxRows = 64), one pass over the
// weights for all M rows; the GPU twin of CpuBackend::linear_fp8 (cpu_fp8.cpp):
// y[m, n] = (Σ_k xq[m, k] · wq[n, k]) · sx[m] · w_scales[n], with wq the e4m3 codes w[N, K] and
// xq [M, K] / sx [M] the activation codes and scales written by launch_quantize_rows_fp8
// (cuda_fp8_quant.cu: sx[m] = amax|x[m, :]| / 448, xq = e4m3(x / sx), core/fp8.h's rounding bit
// for bit). Quantizing inside this kernel (every CTA redoing the whole row, two e4m3
// conversions per pair in the inner loop) made it ALU-bound at 1.2–1.8 TB/s; on pre-quantized
// codes it streams at 2–4 TB/s (docs/PERF.md). Shared machinery: cuda_gemv_ring.cuh; the
// arithmetic: cuda_gemv_fp8_math.cuh.
//
// Numerics. (sum · sx[m]) · w_scales[n] in that order, rounded once to bf16 (o.f32: a
// bf16-rounded fp32). Products of two e4m3 values are exact. The codes of W and x as their
// exact f16 values (e4m3 ⊂ f16; sm_89+: the hardware conversion, older GPUs: integer
// operations) through f16 MMAs with fp32 accumulation, each group of 256 k summed into fresh
// registers and added to the fp32 totals (chunk_mma, add_part). On sm_90 this is what ptxas
// made of the m16n8k32 e4m3 mma.sync used before (sm_90 has no FP8 mma.sync), minus the
// FADDs of its per-MMA partials. (Converting the weights with integer operations instead had
// made the kernel issue-bound at ~1.3 TB/s.) Only the summation order differs from the CPU's
// sgemm. NaN weight codes (never produced by the saturating quantizer) decode as 480 on the
// sm_80 path.
//
// Layout of the arithmetic (cuda_gemv.cu's, with 1-byte weights): a 16-byte chunk is 16 k.
// W is the A operand (16 weight rows per m16 tile), the x rows B in NT n8 tiles (NT = 1, 2, 4,
// 8 for M <= 8, 16, 32, 64; rows past M are zeros, tiles wholly past M skipped). Lane (g, t)
// takes chunk c = 4v + t of weight rows g and g + 8 and of input rows g + 8 nt, and feeds its
// 16 k to the fragments in a fixed order (chunk_mma): k is permuted identically in A and B, so
// the dot products are unchanged. The 8 warps of a CTA split K into fixed slices; their
// partial tiles are summed in shared memory in warp order (passes of 16 input columns),
// scaled, rounded once.
//
// Row invariance: sx[m] depends only on row m; every output (n, m) is one accumulator column
// of an mma sequence (per group of 256 k: a fresh partial, then added to the total) whose k
// order and K split depend only on K; other rows of x only feed other columns of B; NT only
// decides which columns exist. Row m's result is bit-identical for any M in 1..64, and the
// M <= 16 results are those of the NT <= 2 kernel before M went to 64.
//
// Streaming (ring kernel, as cuda_gemv.cu): persistent CTAs (one per SM, 220 KB of shared memory)
// walk tiles of 32 weight rows; each warp streams its K slice through a private 3-stage ring
// (stage: 32 rows x 256 B = 256 k; M <= 16: bulk copies), across tile boundaries. The refill of a
// slot is issued at the top of the next iteration, so 3 stages (24 KB per warp, 192 KB per SM) are
// in flight. Each thread loads the weight scale its epilogue applies when the tile starts (a load
// in the epilogue stalled every tile by a DRAM round trip: 32768 x 4096 at M = 1 went 42.8 -> 36.9
// us). The x codes of the stage's first kGroupNT n-tiles (all of them for M <= 16) are loaded a
// stage ahead of use, the other n-tiles' (M > 16) in the stage; a stage's W fragments stay in
// registers meanwhile. PDL (sm_90+): each CTA issues its first two weight stages, then
// griddepcontrol.wait; the codes and sx are read only after it.
// Speeds: docs/PERF.md, CudaFp8Gemv.Speed.
//
// Fallback: a GPU whose per-block shared memory opt-in is below the ring's (A100) runs the
// tile kernel: one CTA per 16 weight rows, W loaded straight into registers, the same slices
// and mma sequence, no PDL.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_fp8_math.cuh"
#include "backend/cuda/cuda_gemv_row_tail.cuh"
#include "backend/cuda/cuda_gemv_ring.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {
using namespace gemv;
using namespace gemv8;

constexpr int kSxBytes = kGemvMaxRows * 4;
constexpr int kRingSmem = kRingBytes + kRedBytes + kGateBytes + kSxBytes;  // 225,536 B
static_assert(kRingSmem <= kRingMaxSmem, "the ring does not fit an sm_90 SM");

// ---- ring kernel ----
// x and sx have no __restrict__: under PDL they are written by the preceding grid (the
// quantize kernel) while this one runs, so no load of them may be moved above pdl_wait().
template <int NT>
__global__ void __launch_bounds__(kThreads, 1)
    gemv8_ring_kernel(const uint8_t* x, int64_t ldx, const float* sx,
                      const uint8_t* __restrict__ w, const float* __restrict__ ws, int64_t N,
                      int K, int M, GemvOut o, int ntiles) {
  constexpr int G = NT < kGroupNT ? NT : kGroupNT, NG = NT / G;
  constexpr bool kBulk = bulk_rows(NT);  // how the ring's stages are filled (issue_stage)
  extern __shared__ __align__(128) unsigned char smem[];
  pdl_trigger();  // a GEMV after this one may start its weight prologue
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(smem)) + warp * kStages * kStage;
  auto red = reinterpret_cast<float(*)[kRows][17]>(smem + kRingBytes);
  float* gate = reinterpret_cast<float*>(smem + kRingBytes + kRedBytes);
  float* sxs = reinterpret_cast<float*>(smem + kRingBytes + kRedBytes + kGateBytes);
  const Slice s(K / kChunkK, warp);
  const Walk wk(ntiles, o.silu_pair, s);
  Cursor cur;
  ring_init<kBulk>(ring);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue_stage<kBulk>(wk, cur, ring, s, w, K, N);
  pdl_wait();  // every CTA, tiles or not: x and y only after the preceding grid completed
  load_row_scales(sx, M, sxs);
  const XRows xr{x, ldx, M, g};
  const uint32_t lo = lane_off(g, t);
  // M <= 16 (one n-tile group): stage u's x is loaded during stage u - 1 (from L2: its latency
  // is then hidden behind that stage's MMAs). Wider M: group 0's at the top of stage u, in
  // flight while waiting for W (a second set of fragments would spill).
  constexpr bool kAhead = NG == 1;
  uint4 X[G][4];
  if constexpr (kAhead) xr.load(X, 0, s.cb, t, wk.U > 0 ? s.ce : 0);
  int u = 0;
  for (int ti = 0; ti < wk.ntc; ++ti) {
    float acc[2][NT][4] = {};
    const int64_t n0 = int64_t(wk.tile(ti)) * kRows;
    const float wsn = tile_scale<kRows>(ws, n0, N);  // used in finish
    for (int st = 0; st < wk.nst; ++st, ++u) {
      const int c0 = s.cb + st * kCps;
      __syncwarp();  // every lane's reads of slot (u - 1) % S (iteration u - 1) done
      issue_stage<kBulk>(wk, cur, ring, s, w, K, N);  // stage u + 2: u .. u + 2 in flight
      [[maybe_unused]] uint4 Xn[G][4];  // stage u + 1's: the next chunks, or the next tile's
      if constexpr (kAhead) {
        const int nc0 = st + 1 < wk.nst ? c0 + kCps : s.cb, nce = u + 1 < wk.U ? s.ce : 0;
        if (nc0 + kCps <= nce)  // a full next stage: no bounds, no zeros
          xr.load<G, true>(Xn, 0, nc0, t, nce);
        else
          xr.load(Xn, 0, nc0, t, nce);
      }
      // kFull: every chunk of the stage is inside the slice (every stage of the 9B's shapes),
      // so no read needs a bound or zeros; a slice's partial last stage takes the other copy.
      auto stage = [&]<bool kFull>() {
        if constexpr (!kAhead) xr.load<G, kFull>(X, 0, c0, t, s.ce);
        stage_wait<kStages - 1, kBulk>(ring, u);  // stage u landed for every lane
        const uint32_t base = ring + (u % kStages) * kStage;
        // The W fragments are read from the ring per n-tile group and chunk, both 16-row
        // halves of a chunk together (ld.shared is volatile: never merged into one set per
        // stage). A stage's W operands kept in registers across the groups spilled at NT >= 4
        // on sm_90a (ptxas -v: 250 vs 164 registers at NT = 8 on sm_89 in that form).
        if constexpr (kAhead) {
          // One n-tile group (M <= 16): a 16-row half's 8 W fragments are read before its MMAs
          // (as before the 64-row restructuring: interleaving each chunk's reads with its MMAs
          // cost 36.9 -> 39.5 us at 32768 x 4096, M = 1, ~3.5 % of an FP8 decode step).
          float part[G][4];
#pragma unroll
          for (int rt = 0; rt < 2; ++rt) {
            uint4 W0[4], W8[4];
#pragma unroll
            for (int v = 0; v < 4; ++v) {
              const bool ok = c0 + 4 * v + t < s.ce;
              W0[v] = ring_read<kFull>(base + lo + row_off(rt * 16) + v * 64, ok);
              W8[v] = ring_read<kFull>(base + lo + row_off(rt * 16 + 8) + v * 64, ok);
            }
#pragma unroll
            for (int j = 0; j < G; ++j)
#pragma unroll
              for (int i = 0; i < 4; ++i) part[j][i] = 0.f;
#pragma unroll
            for (int v = 0; v < 4; ++v) chunk_mma(part, W0[v], W8[v], X, v);
            add_part(acc[rt], 0, part);
          }
        }
#pragma unroll
        for (int q = 0; q < (kAhead ? 0 : NG); ++q) {
          if (8 * G * q >= M) break;  // n-tiles wholly past M (uniform)
          if (q > 0) xr.load<G, kFull>(X, G * q, c0, t, s.ce);
          float part[2][G][4] = {};
#pragma unroll
          for (int v = 0; v < 4; ++v)
#pragma unroll
            for (int rt = 0; rt < 2; ++rt) {
              const bool ok = c0 + 4 * v + t < s.ce;
              const uint4 W0 = ring_read<kFull>(base + lo + row_off(rt * 16) + v * 64, ok);
              const uint4 W8 = ring_read<kFull>(base + lo + row_off(rt * 16 + 8) + v * 64, ok);
              chunk_mma(part[rt], W0, W8, X, v);
            }
          add_part(acc[0], G * q, part[0]);
          add_part(acc[1], G * q, part[1]);
        }
      };
      // (M > 16: one copy; two made ptxas spill at NT >= 4 with the e4m3 MMAs' registers)
      if (kAhead && c0 + kCps <= s.ce)
        stage.template operator()<kAhead>();
      else
        stage.template operator()<false>();
      if constexpr (kAhead)
#pragma unroll
        for (int j = 0; j < G; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) X[j][v] = Xn[j][v];
    }
    finish<kRows>(red, acc, n0, N, M, o, wk.epi(ti), gate, Scale{sxs, wsn});
    __syncthreads();  // red is reused by the next tile
  }
  cp_wait<0>();  // only empty groups can remain
  gemv_row_tail<kThreads>(o, M, reinterpret_cast<float*>(smem + kRingBytes));
}

// ---- tile kernel (fallback) ----
// Two CTAs per SM up to NT = 2; wider NT needs the registers of one.
template <int NT>
__global__ void __launch_bounds__(kThreads, NT <= 2 ? 2 : 1)
    gemv8_tile_kernel(const uint8_t* __restrict__ x, int64_t ldx, const float* __restrict__ sx,
                      const uint8_t* __restrict__ w, const float* __restrict__ ws, int64_t N,
                      int K, int M, GemvOut o) {
  constexpr int G = NT < kGroupNT ? NT : kGroupNT, NG = NT / G;
  __shared__ float red[kWarps][16][17];
  __shared__ float sxs[kGemvMaxRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const Slice s(K / kChunkK, warp);
  const uint4* wa = reinterpret_cast<const uint4*>(w + min(n0 + g, N - 1) * int64_t(K));
  const uint4* wb = reinterpret_cast<const uint4*>(w + min(n0 + g + 8, N - 1) * int64_t(K));
  load_row_scales(sx, M, sxs);
  const XRows xr{x, ldx, M, g};
  const uint4 z = make_uint4(0, 0, 0, 0);
  float acc[1][NT][4] = {};
  for (int c0 = s.cb; c0 < s.ce; c0 += kCps) {
    uint4 W0[4], W8[4], X[G][4];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int c = c0 + 4 * v + t;
      W0[v] = c < s.ce ? ld_stream(wa + c) : z;
      W8[v] = c < s.ce ? ld_stream(wb + c) : z;
    }
#pragma unroll
    for (int q = 0; q < NG; ++q) {
      if (8 * G * q >= M) break;
      xr.load(X, G * q, c0, t, s.ce);
      float part[G][4] = {};
#pragma unroll
      for (int v = 0; v < 4; ++v) chunk_mma(part, W0[v], W8[v], X, v);
      add_part(acc[0], G * q, part);
    }
  }
  finish<16>(red, acc, n0, N, M, o, Epi::kStore, nullptr, Scale{sxs, tile_scale<16>(ws, n0, N)});
}

// ---- host side ----
using Setup = RingDevice;

// The device's properties once per process (the GPUs of one process are alike); the kernels'
// shared-memory attributes once per device: call gemv_fp8_init (or gemv_fp8_supported, or
// launch once) outside any stream capture first.
const Setup& setup() {
  static const Setup s = ring_device(kRingSmem);
  static OncePerDevice attributes;  // per device: a TP rank's backend may run on another GPU
  if (s.ring)
    attributes([] {
      for (auto* k : {gemv8_ring_kernel<1>, gemv8_ring_kernel<2>, gemv8_ring_kernel<4>,
                      gemv8_ring_kernel<8>})
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingSmem));
    });
  return s;
}

}  // namespace

void gemv_fp8_init() {
  setup();
}

bool gemv_fp8_supported(const void* w, int64_t K, int64_t M) {
  setup();
  return M >= 1 && M <= kGemvMaxRows && K > 0 && K % kChunkK == 0 && K <= (int64_t(1) << 30) &&
         aligned16(w);
}

bool gemv_fp8_silu_pair_supported(int64_t N) {
  return setup().ring && N % (2 * kRows) == 0;
}

bool gemv_fp8_row_tail_supported() {
  return setup().ring;
}

void launch_gemv_fp8(const uint8_t* xq, int64_t ldq, const float* sx, const uint8_t* w,
                     const float* w_scales, int64_t N, int K, int M, const GemvOut& o,
                     cudaStream_t st) {
  if (!(gemv_fp8_supported(w, K, M) && ldq % 16 == 0 && aligned16(xq) && sx && N >= 1)) {
    std::fprintf(stderr, "%s:%d: FP8 GEMV unsupported: M = %d, K = %d, N = %lld, ldq = %lld\n",
                 __FILE__, __LINE__, M, K, static_cast<long long>(N), static_cast<long long>(ldq));
    std::abort();
  }
  const Setup& s = setup();
  if (o.silu_pair && !gemv_fp8_silu_pair_supported(N)) {  // gemv_fp8_silu_pair_supported
    std::fprintf(stderr, "%s:%d: silu_pair FP8 GEMV on N = %lld rows unsupported\n", __FILE__,
                 __LINE__, static_cast<long long>(N));
    std::abort();
  }
  // Callers ask gemv_fp8_row_tail_supported and gemv_norm_tail_fits.
  if (o.tail.h && !(s.ring && row_tail_ok(o, N, M))) {
    std::fprintf(stderr, "%s:%d: FP8 GEMV with a row tail: unsupported (N = %lld, M = %d)\n",
                 __FILE__, __LINE__, static_cast<long long>(N), M);
    std::abort();
  }
  with_nt(M, [&]<int NT>() {
    if (!s.ring) {
      gemv8_tile_kernel<NT>
          <<<unsigned((N + 15) / 16), kThreads, 0, st>>>(xq, ldq, sx, w, w_scales, N, K, M, o);
      CUDA_CHECK_LAUNCH();
      return;
    }
    const int ntiles = int((N + kRows - 1) / kRows);  // every CTA has >= 1 tile
    launch_pdl(gemv8_ring_kernel<NT>, dim3(unsigned(std::min(ntiles, s.sms))), dim3(kThreads),
               size_t(kRingSmem), st, xq, ldq, sx, w, w_scales, N, K, M, o, ntiles);
  });
}

}  // namespace sala::cuda
