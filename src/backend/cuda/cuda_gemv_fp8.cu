// W8A8 FP8 skinny GEMM for decode rows (M <= 16), the GPU twin of CpuBackend::linear_fp8
// (cpu_fp8.cpp): y[m, n] = (Σ_k xq[m, k] · wq[n, k]) · sx[m] · w_scales[n], with wq the e4m3
// codes w[N, K] and xq [M, K] / sx [M] the activation codes and scales written by
// launch_quantize_rows_fp8 (cuda_fp8_quant.cu: sx[m] = amax|x[m, :]| / 448, xq = e4m3(x / sx),
// core/fp8.h's rounding bit for bit). Quantizing inside this kernel (every CTA redoing the
// whole row, two e4m3 conversions per pair in the inner loop) made it ALU-bound at 1.2–1.8
// TB/s; on pre-quantized codes it streams at 2–4 TB/s (docs/PERF.md).
//
// Numerics. (sum · sx[m]) · w_scales[n] in that order, rounded once to bf16 (o.f32: a
// bf16-rounded fp32). Products of two e4m3 values are exact. sm_89+ (the H200): mma.sync
// m16n8k32 e4m3 on the codes themselves (no conversion of the weights: a conversion per weight
// byte made the kernel issue-bound at ~1.3 TB/s); the FP8 MMA's accumulator keeps fewer bits
// than fp32, so each group of 256 k sums into fresh registers, added to the fp32 totals
// (group_mma). Older GPUs (the sm_80 build): the codes as exact f16 values (e4m3 ⊂ f16)
// through f16 MMAs with fp32 accumulation, the same grouping. Only the summation (and the FP8
// MMA's internal rounding) differs from the CPU's sgemm. NaN weight codes (never produced by
// the saturating quantizer) decode as 480 on the sm_80 path.
//
// Layout of the arithmetic (cuda_gemv.cu's, with 1-byte weights): a 16-byte chunk is 16 k.
// W is the A operand (16 weight rows per m16 tile), the x rows B (NT = 1 n8 tile for M <= 8,
// 2 for M <= 16; rows past M are zeros). Lane (g, t) takes chunk c = 4v + t of weight rows g
// and g + 8 and of input row g (+ 8), and feeds its 16 k to the fragments in a fixed order
// (group_mma): k is permuted identically in A and B, so the dot products are unchanged. The 8
// warps of a CTA split K into fixed slices; their partial tiles are summed in shared memory in
// warp order, scaled, rounded once.
//
// Batch invariance: sx[m] depends only on row m; every output (n, m) is one accumulator
// column of an mma sequence whose k order and K split depend only on K; other rows of x only
// feed other columns of B. Row m's result is bit-identical for any M in 1..16.
//
// Streaming (ring kernel, as cuda_gemv.cu): persistent CTAs (one per SM, 214 KB of shared
// memory) walk tiles of 32 weight rows; each warp streams its K slice through a private
// 3-stage cp.async ring (stage: 32 rows x 256 B = 256 k), across tile boundaries. The refill
// of a slot is issued at the top of the next iteration, so 3 stages (24 KB per warp, 192 KB
// per SM) are in flight. Each thread loads the weight scale its epilogue applies when the tile
// starts (a load in the epilogue stalled every tile by a DRAM round trip: 32768 x 4096 at
// M = 1 went 42.8 -> 36.9 us). PDL (sm_90+): each CTA issues its first two weight stages, then
// griddepcontrol.wait; the codes and sx are read only after it, x's codes a stage ahead of use.
// Speeds: docs/PERF.md, CudaFp8Gemv.Speed.
//
// Fallback: a GPU whose per-block shared memory opt-in is below the ring's (A100) runs the
// tile kernel: one CTA per 16 weight rows, W loaded straight into registers, the same slices
// and mma sequence, no PDL.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace sala::cuda {
namespace {

constexpr int kWarps = 8;  // K slices per CTA: part of the numerics
constexpr int kThreads = 32 * kWarps;
constexpr int kChunkK = 16;  // k per 16-byte chunk of a weight row

// ---- e4m3 conversions and MMAs ----
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// D += A · B, m16n8k32, e4m3 x e4m3 -> fp32.
__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#else
// GPUs without FP8 instructions (the sm_80 build): e4m3 values as exact f16, f16 MMAs.
// Four e4m3 codes c (bytes 0..3: k, k+1, k+2, k+3) as two f16x2: lo = (k, k+1), hi = (k+2,
// k+3), the lower k in the lower half. The code S.EEEE.MMM in the top byte of a half, then S
// kept and EEEE.MMM moved right by one: the f16 S.0EEEE.MMM0000000, which is the e4m3 value ·
// 2^-8 (subnormals included: f16 subnormal M·2^-17 = M·2^-9 · 2^-8); · 256 in f16 is exact.
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t c, uint32_t& lo, uint32_t& hi) {
  const auto f16 = [](uint32_t v) {
    const uint32_t h = (v & 0x80008000u) | ((v >> 1) & 0x3f803f80u);
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(0x5c005c00u));  // 256, 256
    return r;
  };
  lo = f16(__byte_perm(c, 0, 0x1404));  // byte 1 -> bits 31..24, byte 0 -> bits 15..8
  hi = f16(__byte_perm(c, 0, 0x3424));  // byte 3, byte 2
}

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// K slice of warp w: 16-byte chunks [cb, ce) (empty when ce <= cb), 4·ceil(K/16/8/4) long.
struct Slice {
  int cb, ce;
  __device__ Slice(int K, int w) {
    const int kc = K / kChunkK, per = ((kc + kWarps - 1) / kWarps + 3) / 4 * 4;
    cb = w * per;
    ce = min(cb + per, kc);
  }
};

// The B fragments: lane (g, t) feeds input rows g and g + 8 (NT = 2); zeros past M. x is the
// codes [M, ldx] (bytes) of launch_quantize_rows_fp8. load(X, c0, ...) gives, for chunks
// c0 + 4u + t: sm_89+ the codes (X[nt][u][j], j < 4: k 4j..4j+3, byte i: k 4j + i), older GPUs
// their f16x2 values (X[nt][u][i]: k 2i, 2i+1).
template <int NT>
struct XRows {
  const uint4* r[NT];
  bool v[NT];
  __device__ XRows(const uint8_t* x, int64_t ldx, int M, int g) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      v[nt] = g + 8 * nt < M;
      r[nt] = reinterpret_cast<const uint4*>(x + int64_t(v[nt] ? g + 8 * nt : 0) * ldx);
    }
  }
  __device__ void load(uint32_t (&X)[NT][4][8], int c0, int t, int ce) const {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c = c0 + 4 * u + t;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 a = c < ce && v[nt] ? __ldg(r[nt] + c) : make_uint4(0, 0, 0, 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        X[nt][u][0] = a.x, X[nt][u][1] = a.y, X[nt][u][2] = a.z, X[nt][u][3] = a.w;
#else
        e4m3x4_to_f16x2(a.x, X[nt][u][0], X[nt][u][1]);
        e4m3x4_to_f16x2(a.y, X[nt][u][2], X[nt][u][3]);
        e4m3x4_to_f16x2(a.z, X[nt][u][4], X[nt][u][5]);
        e4m3x4_to_f16x2(a.w, X[nt][u][6], X[nt][u][7]);
#endif
      }
    }
  }
};

// sx of the M rows into sxs[16] (1 past M), for every thread of the CTA.
__device__ __forceinline__ void load_row_scales(const float* sx, int M, float* sxs) {
  if (threadIdx.x < kGemvMaxRows) sxs[threadIdx.x] = int(threadIdx.x) < M ? sx[threadIdx.x] : 1.f;
  __syncthreads();
}

// One group (16 chunks: 256 k of the warp's slice) of a 16-row tile: W0[v] / W8[v] = chunk
// 4v + t of weight rows g / g + 8.
// sm_89+: two m16n8k32 e4m3 MMAs per chunk, the codes as they are (no conversion): step h uses
// bytes 8h..8h+3 of the chunk as the fragment's k 4t..4t+3 and bytes 8h+4..8h+7 as k
// 16+4t..16+4t+3, in W and x alike (the same permutation of k, so the same dot products). The
// FP8 MMA's accumulator is not a full fp32 adder on Hopper (products are aligned to the
// largest and low bits dropped), so each group sums into fresh registers that are then added
// to acc in fp32: at most 256 products per rounding-limited partial sum.
// Older GPUs: k16 step j of a chunk uses bytes 4j..4j+3 converted to f16 and the x pairs 2j,
// 2j + 1 (f16 MMA, fp32 accumulation), summed the same way.
template <int NT>
__device__ __forceinline__ void group_mma(float (&acc)[NT][4], const uint4 (&W0)[4],
                                          const uint4 (&W8)[4], const uint32_t (&X)[NT][4][8]) {
  float part[NT][4] = {};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#pragma unroll
  for (int v = 0; v < 4; ++v)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma_e4m3(part[nt], W0[v].x, W8[v].x, W0[v].y, W8[v].y, X[nt][v][0], X[nt][v][1]);
      mma_e4m3(part[nt], W0[v].z, W8[v].z, W0[v].w, W8[v].w, X[nt][v][2], X[nt][v][3]);
    }
#else
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const uint32_t a[4] = {W0[v].x, W0[v].y, W0[v].z, W0[v].w};
    const uint32_t b[4] = {W8[v].x, W8[v].y, W8[v].z, W8[v].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t a_lo, a_hi, b_lo, b_hi;
      e4m3x4_to_f16x2(a[j], a_lo, a_hi);
      e4m3x4_to_f16x2(b[j], b_lo, b_hi);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        mma_f16(part[nt], a_lo, b_lo, a_hi, b_hi, X[nt][v][2 * j], X[nt][v][2 * j + 1]);
    }
  }
#endif
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] += part[nt][i];
}

// The weight scale this thread applies in finish<ROWS> for the tile of rows from n0.
template <int ROWS>
__device__ __forceinline__ float tile_scale(const float* __restrict__ ws, int64_t n0, int64_t N) {
  static_assert(kThreads % ROWS == 0, "finish's thread -> row map");
  return __ldg(ws + min(n0 + int64_t(threadIdx.x % ROWS), N - 1));
}

enum class Epi { kStore, kKeepGate, kSiluMul };

// Epilogue of a tile of ROWS = 16 R weight rows from n0 (cuda_gemv.cu's finish, plus the
// scales): partial tiles summed in warp order, then (sum · sx[m]) · ws[n], rounded once.
// Thread i only finishes weight row n0 + i % ROWS (kThreads is a multiple of ROWS), whose
// scale wsn = ws[n0 + i % ROWS] it loaded when the tile started (tile_scale): a load from
// DRAM here would stall every tile's epilogue by its latency.
// c0, c1 of acc[rt][nt]: (weight row rt·16 + g, input rows nt·8 + 2t, + 1); c2, c3: weight
// row rt·16 + g + 8. kKeepGate / kSiluMul: gate [ROWS][16] holds the gate tile's bf16 values.
template <int ROWS, int R, int NT>
__device__ __forceinline__ void finish(float (*red)[ROWS][17], const float (&acc)[R][NT][4],
                                       int64_t n0, int64_t N, int M, const float* sxs,
                                       float wsn, const GemvOut& o,
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
    v = __fmul_rn(__fmul_rn(v, sxs[m]), wsn);
    if (epi == Epi::kKeepGate) {
      gate[i] = rb(v);
      continue;
    }
    if (epi == Epi::kSiluMul) {  // n is an up row; its gate row is n - N / 2
      const float gv = gate[i];
      static_cast<bf16*>(o.y[0])[m * o.cols[0] + n - N / 2] =
          f2b(rb(gv / (1.f + expf(-gv))) * rb(v));
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
// distinct 16-byte bank groups per quarter warp (cuda_gemv.cu's layout).
constexpr int kRows = 32, kCps = 16, kStages = 3;
constexpr int kHalf = kRows / 2 * kCps * 16, kStage = 2 * kHalf + 128;
constexpr int kRingBytes = kWarps * kStages * kStage, kRedBytes = kWarps * kRows * 17 * 4;
constexpr int kGateBytes = kRows * 16 * 4, kSxBytes = 16 * 4;
constexpr int kRingSmem = kRingBytes + kRedBytes + kGateBytes + kSxBytes;  // 219,200
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

// x and sx have no __restrict__: under PDL they are written by the preceding grid (the
// quantize kernel) while this one runs, so no load of them may be moved above pdl_wait().
template <int NT>
__global__ void __launch_bounds__(kThreads, 1)
    gemv8_ring_kernel(const uint8_t* x, int64_t ldx, const float* sx,
                      const uint8_t* __restrict__ w, const float* __restrict__ ws, int64_t N,
                      int K, int M, GemvOut o, int ntiles) {
  extern __shared__ __align__(128) unsigned char smem[];
  pdl_trigger();  // a GEMV after this one may start its weight prologue
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(smem)) + warp * kStages * kStage;
  auto red = reinterpret_cast<float(*)[kRows][17]>(smem + kRingBytes);
  float* gate = reinterpret_cast<float*>(smem + kRingBytes + kRedBytes);
  float* sxs = reinterpret_cast<float*>(smem + kRingBytes + kRedBytes + kGateBytes);
  const Slice s(K, warp);
  const int nst = s.ce > s.cb ? (s.ce - s.cb + kCps - 1) / kCps : 0;  // stages per tile
  const int bx = int(blockIdx.x), gx = int(gridDim.x);
  // Tiles bx, bx + gx, ...; with silu_pair, units bx, bx + gx, ... of the ntiles / 2 gate
  // tiles, each followed by its up tile (ntiles / 2 further), so both meet in this CTA.
  const bool pair = o.silu_pair;
  const int units = pair ? ntiles / 2 : ntiles;
  const int nuc = bx < units ? (units - 1 - bx) / gx + 1 : 0;
  const int ntc = pair ? 2 * nuc : nuc;
  auto tile_of = [&](int ti) {
    return pair ? bx + (ti >> 1) * gx + (ti & 1) * units : bx + ti * gx;
  };
  const int U = ntc * nst;  // stages this warp consumes
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
          cp16(dst + row_off(r) + c * 16,
               w + min(n0 + r, N - 1) * int64_t(K) + int64_t(c0 + c) * kChunkK);
      }
    }
    cp_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  pdl_wait();  // every CTA, tiles or not: x and y only after the preceding grid completed
  load_row_scales(sx, M, sxs);
  const XRows<NT> xr(x, ldx, M, g);
  const uint4 z = make_uint4(0, 0, 0, 0);
  // x of stage u is loaded during stage u - 1 (from L2: its latency is then hidden behind
  // that stage's MMAs).
  uint32_t X[NT][4][8];
  xr.load(X, s.cb, t, U > 0 ? s.ce : 0);
  int u = 0;
  for (int ti = 0; ti < ntc; ++ti) {
    float acc[2][NT][4] = {};
    const float wsn = tile_scale<kRows>(ws, int64_t(tile_of(ti)) * kRows, N);  // used in finish
    for (int st = 0; st < nst; ++st, ++u) {
      const int c0 = s.cb + st * kCps;
      __syncwarp();            // every lane's reads of slot (u - 1) % S (iteration u - 1) done
      issue(u + kStages - 1);  // refill it: stages u .. u + 2 in flight
      uint32_t Xn[NT][4][8];  // stage u + 1's x: the next chunks, or the next tile's first
      xr.load(Xn, st + 1 < nst ? c0 + kCps : s.cb, t, u + 1 < U ? s.ce : 0);
      cp_wait<kStages - 1>();  // this lane's copies of stage u landed
      __syncwarp();            // and every other lane's
      const uint32_t base = ring + (u % kStages) * kStage;
#pragma unroll
      for (int rt = 0; rt < 2; ++rt) {
        uint4 W0[4], W8[4];
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const int cl = 4 * v + t;
          const bool ok = c0 + cl < s.ce;
          W0[v] = ok ? lds(base + row_off(rt * 16 + g) + cl * 16) : z;
          W8[v] = ok ? lds(base + row_off(rt * 16 + g + 8) + cl * 16) : z;
        }
        group_mma(acc[rt], W0, W8, X);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int v = 0; v < 4; ++v)
#pragma unroll
          for (int i = 0; i < 8; ++i) X[nt][v][i] = Xn[nt][v][i];
    }
    const Epi epi = !pair ? Epi::kStore : (ti & 1) ? Epi::kSiluMul : Epi::kKeepGate;
    finish<kRows>(red, acc, int64_t(tile_of(ti)) * kRows, N, M, sxs, wsn, o, epi, gate);
    __syncthreads();  // red is reused by the next tile
  }
  cp_wait<0>();  // only empty groups can remain
}

// ---- tile kernel (fallback) ----
// Two CTAs per SM for NT = 1; NT = 2 needs the registers of one (128 would spill).
template <int NT>
__global__ void __launch_bounds__(kThreads, 3 - NT)
    gemv8_tile_kernel(const uint8_t* __restrict__ x, int64_t ldx, const float* __restrict__ sx,
                      const uint8_t* __restrict__ w, const float* __restrict__ ws, int64_t N,
                      int K, int M, GemvOut o) {
  __shared__ float red[kWarps][16][17];
  __shared__ float sxs[kGemvMaxRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const Slice s(K, warp);
  const uint4* wa = reinterpret_cast<const uint4*>(w + min(n0 + g, N - 1) * int64_t(K));
  const uint4* wb = reinterpret_cast<const uint4*>(w + min(n0 + g + 8, N - 1) * int64_t(K));
  load_row_scales(sx, M, sxs);
  const XRows<NT> xr(x, ldx, M, g);
  const uint4 z = make_uint4(0, 0, 0, 0);
  float acc[1][NT][4] = {};
  for (int c0 = s.cb; c0 < s.ce; c0 += kCps) {
    uint4 W0[4], W8[4];
    uint32_t X[NT][4][8];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int c = c0 + 4 * v + t;
      W0[v] = c < s.ce ? ld_stream(wa + c) : z;
      W8[v] = c < s.ce ? ld_stream(wb + c) : z;
    }
    xr.load(X, c0, t, s.ce);
    group_mma(acc[0], W0, W8, X);
  }
  finish<16>(red, acc, n0, N, M, sxs, tile_scale<16>(ws, n0, N), o);
}

// ---- host side ----
struct Setup {
  bool ring;  // the ring's shared memory fits this GPU
  bool pdl;   // launch it with programmatic stream serialization
  int sms;
};

// Once per process, for the current device (the engine uses one): call gemv_fp8_supported
// (or launch once) outside any stream capture first.
const Setup& setup() {
  static const Setup s = [] {
    int dev = 0, optin = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    Setup r{optin >= kRingSmem, false, sms};
    if (r.ring) {
      for (auto* k : {gemv8_ring_kernel<1>, gemv8_ring_kernel<2>})
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingSmem));
      r.pdl = pdl_launch_enabled();
    }
    return r;
  }();
  return s;
}

template <int NT>
void launch_t(const uint8_t* x, int64_t ldx, const float* sx, const uint8_t* w, const float* ws,
              int64_t N, int K, int M, const GemvOut& o, cudaStream_t st) {
  const Setup& s = setup();
  if (o.silu_pair && (!s.ring || N % (2 * kRows) != 0)) {  // gemv_fp8_silu_pair_supported
    std::fprintf(stderr, "%s:%d: silu_pair FP8 GEMV on N = %lld rows unsupported\n", __FILE__,
                 __LINE__, static_cast<long long>(N));
    std::abort();
  }
  if (!s.ring) {
    gemv8_tile_kernel<NT><<<unsigned((N + 15) / 16), kThreads, 0, st>>>(x, ldx, sx, w, ws, N, K, M, o);
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
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemv8_ring_kernel<NT>, x, ldx, sx, w, ws, N, K, M, o, ntiles));
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

void launch_gemv_fp8(const uint8_t* xq, int64_t ldq, const float* sx, const uint8_t* w,
                     const float* w_scales, int64_t N, int K, int M, const GemvOut& o,
                     cudaStream_t st) {
  if (!(gemv_fp8_supported(w, K, M) && ldq % 16 == 0 && aligned16(xq) && sx && N >= 1)) {
    std::fprintf(stderr, "%s:%d: FP8 GEMV unsupported: M = %d, K = %d, N = %lld, ldq = %lld\n",
                 __FILE__, __LINE__, M, K, static_cast<long long>(N), static_cast<long long>(ldq));
    std::abort();
  }
  if (M <= 8)
    launch_t<1>(xq, ldq, sx, w, w_scales, N, K, M, o, st);
  else
    launch_t<2>(xq, ldq, sx, w, w_scales, N, K, M, o, st);
}

}  // namespace sala::cuda
