// Wide tiles for the skinny GEMM's ring (issue 21: verify steps of 17..64 rows). The ring of
// cuda_gemv_ring.cuh walks tiles of kRows = 32 weight rows; every tile reads the x rows of its
// warps' K slices again from L2: M x K x 2 B per 32 x K x 2 B of weights, more L2 traffic than
// the weights' own DRAM traffic once M > 32 (M = 40, K = 4096: 327 KB of x per 262 KB tile).
// Here a tile is ROWS = 16 R weight rows (R = 4: 64, R = 8: 128), so each x fragment loaded
// feeds R 16-row halves instead of 2: x traffic per weight byte / (R / 2). R = 2 is the 32-row
// tiling with this kernel's loop (x fragments loaded a u-step ahead; kRows32Ahead).
//
// Shapes. A warp's stage stays 8 KB: ROWS rows x CPS = 512 / ROWS chunks (R = 2: 32 x 256 B,
// R = 4: 64 x 128 B, R = 8: 128 x 64 B), kStages = 3, so the ring is 8 warps x 3 x 8 KB = 192 KB and as many
// bytes are in flight per SM as in the 32-row ring. A stage is CPS / 4 mma k-steps ("u-steps":
// chunk 4u + t of lane (g, t)). Accumulators acc[R][NT][4]: R x NT <= 32 (128 registers).
//
// Numerics: the contract of cuda_gemv_ring.cuh unchanged. The K split (Slice), and per
// accumulator the sequence of u-steps (chunks cb + 4j .. + 3, j ascending, each the k16 of
// elements 0-3 then 4-7) are those of the 32-row ring, including its all-zero u-steps past the
// slice's end: a tile walks 4 ceil(len / 16) u-steps of its slice (len = ce - cb chunks), as
// the 32-row ring's ceil(len / 16) stages of 4 do (stages wholly past ce copy nothing and feed
// zeros). The epilogue is cuda_gemv_ring.cuh's finish<32> on each 32-row part of the tile:
// every output is its 8 warp partials summed in warp order, rounded once. So every output's
// bits equal the 32-row ring's, for any M and any R.
//
// Layout of a stage: row r at r x CPS x 16 B, chunk c at position c ^ swz(r). A quarter warp's
// lds.128 reads 4 chunks (64 B) of rows r0 and r0 + 1 (r0 even): with rows of 128 or 256 B
// (CPS = 8, 16) odd rows swap the 64-byte halves of each 128 B (swz = 4) so the two rows use
// disjoint banks; 64-byte rows (CPS = 4) are already adjacent halves of 128 B.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_gemv_ring.cuh"

namespace sala::cuda::gemv {

template <int R>
struct Wide {
  static_assert(R == 2 || R == 4 || R == 8, "32-, 64- or 128-row tiles");
  static constexpr int kRowsT = 16 * R;           // weight rows per tile
  static constexpr int kCpsT = 512 / kRowsT;      // chunks per row per stage (16, 8 or 4)
  static constexpr int kUs = kCpsT / 4;           // u-steps per stage
  static constexpr int kStageT = kRowsT * kCpsT * 16;  // 8,192 B
  static constexpr int kSps = 16 / kCpsT;         // stages per 16 chunks (a 32-row ring stage)
  __device__ static __forceinline__ uint32_t off(int r, int c) {
    const int swz = kCpsT >= 8 ? (r & 1) << 2 : 0;
    return uint32_t(r * kCpsT + (c ^ swz)) * 16;
  }
};
constexpr int kWideRingBytes = kWarps * kStages * 8192;  // 196,608
// The epilogue's gate tile for silu_pair: R / 2 parts of [8 NT][32] fp32 (finish<32>'s layout).
constexpr int kWideGateBytes = 32 * 32 * 4 * 4;          // R x NT <= 32: 16,384
constexpr int kWideSmem = kWideRingBytes + kRedBytes + kWideGateBytes;  // 230,400
static_assert(kWideSmem <= kRingMaxSmem, "the wide ring does not fit an sm_90 SM");

// The tile walk of Walk (cuda_gemv_ring.cuh) with tiles of Wide<R>::kRowsT rows and stages of
// kCpsT chunks; nst: the stages of 16 / kCpsT per 32-row-ring stage (see the numerics above).
template <int R>
struct WideWalk {
  using G = Wide<R>;
  int bx, gx, units, ntc, nst, U;
  bool pair;
  __device__ WideWalk(int ntiles, bool silu_pair, const Slice& s)
      : bx(int(blockIdx.x)), gx(int(gridDim.x)), pair(silu_pair) {
    units = pair ? ntiles / 2 : ntiles;
    const int nuc = bx < units ? (units - 1 - bx) / gx + 1 : 0;
    ntc = pair ? 2 * nuc : nuc;
    nst = s.ce > s.cb ? (s.ce - s.cb + 15) / 16 * G::kSps : 0;
    U = ntc * nst;
  }
  __device__ int tile(int ti) const {
    return pair ? bx + (ti >> 1) * gx + (ti & 1) * units : bx + ti * gx;
  }
  __device__ Epi epi(int ti) const {
    return !pair ? Epi::kStore : (ti & 1) ? Epi::kSiluMul : Epi::kKeepGate;
  }
  // Stage u into slot u % kStages of the warp's ring (one commit group per call, empty from U
  // on and for stages wholly past the slice). 32 / kCpsT rows x kCpsT chunks per instruction.
  __device__ __forceinline__ void issue(int u, uint32_t ring, const Slice& s,
                                        const uint8_t* __restrict__ w, int64_t row_bytes,
                                        int64_t N) const {
    if (u < U) {
      const int ti = u / nst, c0 = s.cb + (u - ti * nst) * G::kCpsT,
                nv = min(G::kCpsT, s.ce - c0);
      const int64_t n0 = int64_t(tile(ti)) * G::kRowsT;
      const uint32_t dst = ring + (u % kStages) * G::kStageT;
      const int lane = threadIdx.x % 32;
#pragma unroll
      for (int j = 0; j < G::kRowsT * G::kCpsT / 32; ++j) {
        const int q = j * 32 + lane, r = q / G::kCpsT, c = q % G::kCpsT;
        if (c < nv)
          cp16(dst + G::off(r, c), w + min(n0 + r, N - 1) * row_bytes + int64_t(c0 + c) * 16);
      }
    }
    cp_commit();
  }
};

// The epilogue of a wide tile from n0: finish<32> on each 32-row part p (acc[2p], acc[2p + 1];
// weight rows n0 + 32 p ..) with scale_of(p)'s scaling, the gate tile's part p at gate + p x 32
// x 8 NT. Ends after a __syncthreads (red free).
template <int R, int NT, class ScaleOf>
__device__ __forceinline__ void finish_wide(float (*red)[32][17], const float (&acc)[R][NT][4],
                                            int64_t n0, int64_t N, int M, const GemvOut& o,
                                            Epi epi, float* gate, ScaleOf scale_of) {
  static_assert(R * NT <= 32, "the gate tile's 16 KB");
#pragma unroll
  for (int p = 0; p < R / 2; ++p) {
    float part[2][NT][4];
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) part[rt][nt][i] = acc[2 * p + rt][nt][i];
    finish<32>(red, part, n0 + 32 * p, N, M, o, epi, gate + p * 32 * 8 * NT, scale_of(p));
    __syncthreads();  // red is reused by the next part / tile
  }
}

}  // namespace sala::cuda::gemv
