// The int4 GEMV's issue-22 variants (Int4GemvVariant in cuda_kernels.h): the ring kernel of
// cuda_gemv_int4.cu (kLegacy; its header comment gives the weight layout, the numerics and the
// lane layout, all kept here) rebuilt to issue fewer instructions per byte streamed.
//
// Why. kLegacy streams 1.3-1.9 TB/s at M = 1..16 where the FP8 GEMV does 3.6-4.0: on the H200
// it issues only 24 % of the slots with 2 warps per scheduler, each waiting ~6 cycles per
// instruction (latency-bound), so a stage costs its instruction count times ~6 cycles. Its
// SASS (sm_90a, NT = 1) per 8 KB stage: 4 chunk-group bodies of 206 instructions (per lane and
// group: 16 words x 11 dequantization instructions, 16 MMAs, 8 scale fmas, lds) plus ~600
// between the stage wait and the first body: the refill's 16 copies each with its own clamped
// 64-bit address, a runtime division (u / nst) and 64-bit divisions for the 4 scale columns.
//
// kLean (bit-identical to kLegacy: the same K slices, mma order, group partials and epilogue):
//  - the refill walks a cursor (tile, stage, slot) instead of dividing; each lane's copy source
//    is one pointer per stage stepped by a fixed stride (only a tile past N's end clamps row by
//    row); a group scale's column is (c0 / 4 + v) / (group / 128), divided only when group !=
//    128: ~200 instructions between the wait and the first body on that path;
//  - the x rows' addresses (M <= 16) are computed once per kernel.
// kLean2: CTAS = 2, two CTAs per SM at M <= 16 (16 warps per SM: twice the warps to hide each
// one's dependency chains, and one CTA's tile barrier no longer idles the SM), each warp a ring
// of 2 stages of 4 KB (89 KB per CTA, <= 128 registers: at M 9..16 the x of a chunk group is
// loaded when it is needed, not one group ahead), on tiles of 32 rows where N gives every SM
// two (N >= 8,448), else of 16 rows (H = 1: N = 4096 makes 256 tiles, not 128 for 132 SMs, and
// a warp's chain per tile is half as long). Same K slices and the same mma order per output:
// the bits of kLean. M > 16 runs kLean.
// kBiased / kBiased2: the codes enter the MMA as 136 + q (dequant_word_biased: no fma.bf16x2,
// 7 instructions per word instead of 11: a body of 164 instructions instead of 206) and each
// group's partial becomes
//   P − C,  P = Σ_k (136 + q_k) x_k,  C = 136 · Σ_k x_k   (both fp32 tensor-core sums in the
// same k order; C by MMAs with A = 136 everywhere, once per chunk group and n-tile, shared by
// the 32 weight rows), then acc = fma(P − C, s, acc) as before. Products are exact in both and
// P − C is exact (P ≈ C); what changes is that P's and C's roundings are those of sums ~50x
// larger than Σ q x (136 / |q|), so the result differs from kLean in the last fp32 bits and
// slightly more outputs land one bf16 ulp from the CPU (a model with the tensor core's
// truncating fp32 adds: ~0.1-0.2 % of outputs, max 1 ulp, where MatchesCpu allows 3 %). Row
// invariance holds (C of column m depends on x row m only). CudaInt4Gemv.Variants holds every
// variant to MatchesCpu's bounds and to row invariance.
#include <algorithm>

#include "backend/cuda/cuda_gemv_int4.cuh"
#include "backend/cuda/cuda_launch.cuh"

namespace sala::cuda {
namespace {
using namespace gemv;
using namespace int4g;

// A CTA's tiles of kTile = 16 H weight rows, and each warp's ring: kStages stages of kTile rows
// x kCps chunks (8 KB for 1 CTA per SM, 4 KB for 2), laid out as gemv::row_off (even rows, then
// odd rows 64 B further: conflict-free 16-byte reads of chunk 4v + t by lane (g, t)).
template <int CTAS, int H>
struct Ring4 {
  static_assert((CTAS == 1 && H == 2) || CTAS == 2, "1 CTA per SM: 32-row tiles");
  static constexpr int kTile = 16 * H;
  static constexpr int kCps = (CTAS == 1 ? 16 : 8) * 2 / H;  // chunks per stage row
  static constexpr int kStages = CTAS == 1 ? 3 : 2;
  static constexpr int kNV = kCps / 4;  // chunk groups (of 128 k) per stage
  static constexpr int kHalf = kTile / 2 * kCps * 16;
  static constexpr int kStage = 2 * kHalf + 128;
  static constexpr int kScaleStage = kTile * kNV * 4;  // the group scales of the stage's rows
  static constexpr int kRingBytes = kWarps * kStages * kStage;
  static constexpr int kScaleBytes = kWarps * kStages * kScaleStage;
  static constexpr int kSmem = kRingBytes + kScaleBytes + kRed4Bytes + kGateBytes;
  static constexpr int kRpi = 32 / kCps;  // rows one copy instruction of a warp covers
  __device__ static uint32_t row_off(int r) {
    return (r & 1) * (kHalf + 64) + (r >> 1) * kCps * 16;
  }
};
static_assert(Ring4<1, 2>::kSmem == 229376 && Ring4<1, 2>::kSmem <= kRingMaxSmem, "kLegacy's");
static_assert(2 * (Ring4<2, 2>::kSmem + 1024) <= 228 * 1024 &&
                  2 * (Ring4<2, 1>::kSmem + 1024) <= 228 * 1024,
              "two CTAs per sm_90 SM");
static_assert(kRows == 32 && Ring4<1, 2>::kRpi % 2 == 0 && Ring4<2, 2>::kRpi % 2 == 0 &&
                  Ring4<2, 1>::kRpi % 2 == 0,
              "a lane's copies stay in one row parity; lane l copies the scales of row l");

// The refill cursor of one warp: stage u (stage st of the CTA's tile ti, ring slot `slot`).
// Lane l copies chunk c = l % kCps of rows kRpi·j + r0 (r0 = l / kCps), j < kTile / kRpi, and
// the group scales of tile row l (l < kTile). One commit group per call (empty from wk.U on),
// so that cp.async.wait_group counts stages.
template <int CTAS, int H>
struct Refill {
  using R = Ring4<CTAS, H>;
  const uint8_t* __restrict__ w;
  const float* __restrict__ ws;
  int64_t N, row_bytes, gpr;
  int gq;               // group / 128: scale column of chunk group i is i / gq
  uint32_t dst, sdst;   // this lane's first copy target in slot 0 (weights, scales)
  int r0, c, lane;
  int u = 0, ti = 0, st = 0, slot = 0;

  __device__ void next(const Walk& wk, const Slice& s) {
    if (u < wk.U) {
      const int c0 = s.cb + st * R::kCps, nv = min(R::kCps, s.ce - c0);
      const int64_t n0 = int64_t(wk.tile(ti)) * R::kTile;
      const uint32_t d = dst + slot * R::kStage;
      constexpr int kCopies = R::kTile / R::kRpi, kStep = R::kRpi / 2 * R::kCps * 16;
      if (c < nv) {
        if (n0 + R::kTile <= N) {  // a whole tile: rows n0 + r0 + kRpi·j
          const uint8_t* src = w + (n0 + r0) * row_bytes + int64_t(c0 + c) * 16;
          const int64_t step = R::kRpi * row_bytes;
#pragma unroll
          for (int j = 0; j < kCopies; ++j) cp16(d + j * kStep, src + j * step);
        } else {  // the last tile: rows past N read row N - 1 (their outputs are not stored)
#pragma unroll
          for (int j = 0; j < kCopies; ++j)
            cp16(d + j * kStep,
                 w + min(n0 + r0 + R::kRpi * j, N - 1) * row_bytes + int64_t(c0 + c) * 16);
        }
      }
      const float* srow = ws + min(n0 + lane, N - 1) * gpr;
      const int gi = c0 / 4;  // chunk group of the stage's first chunk (c0 % 4 == 0)
#pragma unroll
      for (int v = 0; v < R::kNV; ++v)
        if (4 * v < nv && lane < R::kTile)
          cp4(sdst + slot * R::kScaleStage + 4 * v, srow + (gq == 1 ? gi + v : (gi + v) / gq));
    }
    cp_commit();
    ++u;
    if (++slot == R::kStages) slot = 0;
    if (++st == wk.nst) st = 0, ++ti;
  }
};

// x of chunk c (4 uint4 = 32 k) of input row `row` (zeros past M or when !ok), from L1/L2.
__device__ __forceinline__ void load_x_row(uint4 (&X)[4], const uint4* r, int c, bool ok) {
#pragma unroll
  for (int i = 0; i < 4; ++i) X[i] = ok ? __ldg(r + 4 * c + i) : make_uint4(0, 0, 0, 0);
}

// x has no __restrict__: under PDL it is written by the preceding grid while this one runs.
template <int NT, bool BIAS, int CTAS, int H>
__global__ void __launch_bounds__(kThreads, CTAS)
    gemv4_lean_kernel(const bf16* x, int64_t ldx, const uint32_t* __restrict__ w,
                      const float* __restrict__ ws, int64_t N, int K, int gq, int M, GemvOut o,
                      int ntiles) {
  using R = Ring4<CTAS, H>;
  constexpr int G = NT < kGroupNT ? NT : kGroupNT, NG = NT / G;
  constexpr bool kPrefetchX = CTAS == 1 || NT == 1;
  extern __shared__ __align__(128) unsigned char smem[];
  pdl_trigger();  // a GEMV after this one may start its weight prologue
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t sm0 = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t ring = sm0 + warp * R::kStages * R::kStage;
  const uint32_t sring = sm0 + R::kRingBytes + warp * R::kStages * R::kScaleStage;
  auto red =
      reinterpret_cast<float(*)[R::kTile][kPass + 1]>(smem + R::kRingBytes + R::kScaleBytes);
  float* gate = reinterpret_cast<float*>(smem + R::kRingBytes + R::kScaleBytes + kRed4Bytes);
  const Slice s(K / kChunkK, warp);
  Walk wk(ntiles, o.silu_pair, s);
  wk.nst = s.ce > s.cb ? (s.ce - s.cb + R::kCps - 1) / R::kCps : 0;  // this ring's stages
  wk.U = wk.ntc * wk.nst;
  Refill<CTAS, H> rf{reinterpret_cast<const uint8_t*>(w), ws, N, int64_t(K) / 2, int64_t(K) / (kGroupK * gq), gq,
                  ring + R::row_off(lane / R::kCps) + (lane % R::kCps) * 16,
                  sring + lane * R::kNV * 4, lane / R::kCps, lane % R::kCps, lane};
#pragma unroll
  for (int i = 0; i < R::kStages - 1; ++i) rf.next(wk, s);
  pdl_wait();  // every CTA, tiles or not: x and y only after the preceding grid completed
  const auto* xb = reinterpret_cast<const uint8_t*>(x);
  const int64_t ldb = ldx * 2;
  // M <= 16: this lane's x rows g + 8 j, once (rows past M: never read).
  const uint4* xr[G];
  bool xok[G];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int row = g + 8 * j;
    xok[j] = row < M;
    xr[j] = reinterpret_cast<const uint4*>(xb + int64_t(xok[j] ? row : 0) * ldb);
  }
  int slot = 0;
  for (int ti = 0; ti < wk.ntc; ++ti) {
    float acc[H][NT][4] = {};
    for (int st = 0; st < wk.nst; ++st) {
      const int c0 = s.cb + st * R::kCps;
      uint4 X[G][4];
      if constexpr (NG == 1)  // chunk group 0, in flight while waiting for the stage
#pragma unroll
        for (int j = 0; j < G; ++j) load_x_row(X[j], xr[j], c0 + t, xok[j]);
      cp_wait<R::kStages - 2>();
      __syncwarp();  // every lane's copies of this stage landed; the slot refilled next is read
      rf.next(wk, s);
      const uint32_t base = ring + slot * R::kStage, sbase = sring + slot * R::kScaleStage;
      if (++slot == R::kStages) slot = 0;
#pragma unroll
      for (int v = 0; v < R::kNV; ++v) {
        if (c0 + 4 * v >= s.ce) break;  // uniform: the slice ends at a whole chunk group
        const int cl = 4 * v + t;
        uint4 Wr[H][2];  // [half rt][row g / g + 8]
        float sc[H][2];
#pragma unroll
        for (int rt = 0; rt < H; ++rt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = rt * 16 + g + 8 * h;
            Wr[rt][h] = lds(base + R::row_off(r) + cl * 16);
            sc[rt][h] = lds_f32(sbase + r * R::kNV * 4 + v * 4);
          }
        // M <= 16: the next chunk group's x is loaded while this one computes (1 CTA / SM), or
        // (2 CTAs / SM, whose 128 registers a second buffer would overflow) now, for this one.
        [[maybe_unused]] uint4 Xn[G][4];
        if constexpr (NG == 1 && kPrefetchX) {
          const bool more = v + 1 < R::kNV && c0 + 4 * (v + 1) < s.ce;
#pragma unroll
          for (int j = 0; j < G; ++j) load_x_row(Xn[j], xr[j], c0 + 4 * (v + 1) + t, more && xok[j]);
        }
        if constexpr (NG == 1 && !kPrefetchX)
          if (v > 0)
#pragma unroll
            for (int j = 0; j < G; ++j) load_x_row(X[j], xr[j], c0 + cl, xok[j]);
        [[maybe_unused]] float corr[NG][G][4];  // BIAS: 136 · Σ x of the group, per n-tile
#pragma unroll
        for (int rt = 0; rt < H; ++rt) {
          uint32_t a[4][4], b[4][4];
          dequant_chunk<BIAS>(Wr[rt][0], Wr[rt][1], a, b);
#pragma unroll
          for (int q = 0; q < NG; ++q) {
            if (8 * G * q >= M) break;  // n-tiles wholly past M (uniform)
            if constexpr (NG > 1)
#pragma unroll
              for (int j = 0; j < G; ++j) {
                const int row = g + 8 * (G * q + j);
                load_x_row(X[j], reinterpret_cast<const uint4*>(xb + int64_t(row < M ? row : 0) * ldb),
                           c0 + cl, row < M);
              }
            float part[G][4] = {};
            chunk_mma<G>(part, a, b, X);
            if constexpr (BIAS) {
              if (rt == 0) {
#pragma unroll
                for (int j = 0; j < G; ++j)
#pragma unroll
                  for (int i = 0; i < 4; ++i) corr[q][j][i] = 0.f;
                bias_mma<G>(corr[q], X);
              }
#pragma unroll
              for (int j = 0; j < G; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) part[j][i] -= corr[q][j][i];
            }
            add_scaled<G>(acc[rt], G * q, part, sc[rt]);
          }
        }
        if constexpr (NG == 1 && kPrefetchX)
#pragma unroll
          for (int j = 0; j < G; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) X[j][i] = Xn[j][i];
      }
    }
    finish<R::kTile, H, NT, Unscaled, kPass>(red, acc, int64_t(wk.tile(ti)) * R::kTile, N, M, o,
                                             wk.epi(ti), gate, Unscaled{});
    __syncthreads();  // red is reused by the next tile
  }
  cp_wait<0>();  // only empty groups can remain
}

template <int NT, bool BIAS, int CTAS, int H>
void set_attributes() {
  auto* k = gemv4_lean_kernel<NT, BIAS, CTAS, H>;
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Ring4<CTAS, H>::kSmem));
  // Two CTAs per SM only if the shared-memory carveout is the whole of it.
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
}

template <bool BIAS>
void set_all() {
  set_attributes<1, BIAS, 1, 2>();
  set_attributes<2, BIAS, 1, 2>();
  set_attributes<4, BIAS, 1, 2>();
  set_attributes<8, BIAS, 1, 2>();
  set_attributes<1, BIAS, 2, 2>();
  set_attributes<2, BIAS, 2, 2>();
  set_attributes<1, BIAS, 2, 1>();
  set_attributes<2, BIAS, 2, 1>();
}

template <int NT, bool BIAS, int CTAS, int H>
void launch_one(const bf16* x, int64_t ldx, const uint32_t* w, const float* ws, int64_t N, int K,
                int group, int M, const GemvOut& o, int sms, cudaStream_t st) {
  constexpr int kTile = Ring4<CTAS, H>::kTile;
  const int ntiles = int((N + kTile - 1) / kTile);  // every CTA has >= 1 tile
  launch_pdl(gemv4_lean_kernel<NT, BIAS, CTAS, H>, dim3(unsigned(std::min(ntiles, CTAS * sms))),
             dim3(kThreads), size_t(Ring4<CTAS, H>::kSmem), st, x, ldx, w, ws, N, K,
             group / kGroupK, M, o, ntiles);
}

// two: 2 CTAs per SM at M <= 16, on tiles of 32 rows where those give every SM 2 CTAs (N >=
// 8,448 on the H200), else of 16 rows (N = 4096: 256 tiles, not 128 for 132 SMs). The bits
// depend on neither (the K slices and each output's mma order are the same).
template <bool BIAS>
void launch_lean(bool two, const bf16* x, int64_t ldx, const uint32_t* w, const float* ws,
                 int64_t N, int K, int group, int M, const GemvOut& o, int sms, cudaStream_t st) {
  const bool tall = (N + kRows - 1) / kRows >= 2 * int64_t(sms);
  with_nt(M, [&]<int NT>() {
    if constexpr (NT <= 2)
      if (two)
        return tall ? launch_one<NT, BIAS, 2, 2>(x, ldx, w, ws, N, K, group, M, o, sms, st)
                    : launch_one<NT, BIAS, 2, 1>(x, ldx, w, ws, N, K, group, M, o, sms, st);
    launch_one<NT, BIAS, 1, 2>(x, ldx, w, ws, N, K, group, M, o, sms, st);
  });
}

}  // namespace

void gemv_int4_lean_init() {
  set_all<false>();
  set_all<true>();
}

void launch_gemv_int4_lean(Int4GemvVariant v, const bf16* x, int64_t ldx, const uint32_t* w,
                           const float* w_scales, int64_t N, int K, int group, int M,
                           const GemvOut& o, int sms, cudaStream_t st) {
  const bool two = v == Int4GemvVariant::kLean2 || v == Int4GemvVariant::kBiased2;
  if (v == Int4GemvVariant::kBiased || v == Int4GemvVariant::kBiased2)
    launch_lean<true>(two, x, ldx, w, w_scales, N, K, group, M, o, sms, st);
  else
    launch_lean<false>(two, x, ldx, w, w_scales, N, K, group, M, o, sms, st);
}

}  // namespace sala::cuda
