// The parts of the int4 GEMV's persistent ring (cuda_gemv_int4.cu: bf16 tensor cores on
// dequantized codes), shared with the int8 experiment scripts/kernel_ab/int4_imma_gemv.cu: the
// packed chunk / group units, the scale ring that travels with the weight ring, the
// shared-memory budget and the kernels' common prologue. Device layout and numerics:
// cuda_gemv_int4.cu.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_gemv_ring.cuh"

namespace sala::cuda::gemv {

constexpr int kChunkK = 32;      // k per 16-byte chunk of a packed row (4 words)
constexpr int kGroupK = 4 * kChunkK;  // k of the 4 chunks one mma covers: the group unit
constexpr int kScaleStage = kRows * 16;                    // 32 rows x 4 fp32 scales
constexpr int kScaleBytes = kWarps * kStages * kScaleStage;  // 12,288
constexpr int kPass = 8;                                   // epilogue columns per pass
constexpr int kRed4Bytes = kWarps * kRows * (kPass + 1) * 4;  // 9,216
constexpr int kRingSmem = kRingBytes + kScaleBytes + kRed4Bytes + kGateBytes;  // 229,376
static_assert(kRingSmem <= kRingMaxSmem, "the int4 ring does not fit an sm_90 SM");
static_assert(kRows == 32, "ScaleCopies: lane l copies the scales of tile row l");

__device__ __forceinline__ void cp4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ float lds_f32(uint32_t a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
  return v;
}

struct Unscaled {  // the scales are applied per group, before the epilogue
  __device__ float operator()(float v, int) const { return v; }
};

// The scale copies of a stage, in its commit group (issue_stage's extra copies): lane l copies
// the scales of row n0 + l for the stage's chunk groups v = 0..3 (one cp.async of 4 B each; a
// group past the slice's end is not copied and never read). Chunk group cg = c0 / 4 + v has
// scale group cg / a (a = group / 128): kept in cur.q, cur.r (cg = q a + r) without a division,
// restarted at each tile's first stage from the slice's first chunk group (qb, rb).
struct ScaleCopies {
  uint32_t sring;
  const float* __restrict__ ws;
  int64_t gpr, N;
  int a, qb, rb;
  bool vec;  // a == 1 and a full stage's 4 scales are one 16-byte aligned run: one copy
  __device__ __forceinline__ void operator()(Cursor& cur, int64_t n0, int, int nv) const {
    const int lane = threadIdx.x % 32;
    if (cur.st == 0) cur.q = qb, cur.r = rb;
    const uint32_t sd = sring + cur.slot * kScaleStage + lane * 16;
    const float* srow = ws + min(n0 + lane, N - 1) * gpr;
    if (vec && nv == kCps) {  // group 128 (the 9B's shapes): q advances by 1 per chunk group
      cp16(sd, srow + cur.q);
      cur.q += 4;
      return;
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      if (4 * v < nv) cp4(sd + 4 * v, srow + cur.q);
      if (++cur.r == a) cur.r = 0, ++cur.q;
    }
  }
};

// A warp's part of the int4 ring, the prologue both int4 GEMVs share: the warp's weight and
// scale rings, the CTA's epilogue pass buffer `red` and silu_pair gate tile (229,376 bytes of
// dynamic shared memory from smem in all), the warp's K slice and tile walk, the scale copies
// and the copy cursor. The constructor issues the first kStages - 1 stages (weights only: no
// x, no y, so a kernel may construct it before its griddepcontrol.wait). kBulk: how the weight
// stages are filled (issue_stage), which wait() matches.
template <bool kBulk>
struct Int4Ring {
  uint32_t ring, sring;
  float (*red)[kRows][kPass + 1];
  float* gate;
  Slice s;
  Walk wk;
  const uint8_t* wb;
  int64_t row_bytes, N;
  ScaleCopies scales;
  Cursor cur;
  __device__ __forceinline__ Int4Ring(unsigned char* smem, const uint32_t* w,
                                      const float* __restrict__ ws, int64_t N_, int K, int group,
                                      bool silu_pair, int ntiles)
      : ring(uint32_t(__cvta_generic_to_shared(smem)) + threadIdx.x / 32 * kStages * kStage),
        sring(uint32_t(__cvta_generic_to_shared(smem)) + kRingBytes +
              threadIdx.x / 32 * kStages * kScaleStage),
        red(reinterpret_cast<float(*)[kRows][kPass + 1]>(smem + kRingBytes + kScaleBytes)),
        gate(reinterpret_cast<float*>(smem + kRingBytes + kScaleBytes + kRed4Bytes)),
        s(K / kChunkK, int(threadIdx.x / 32)),
        wk(ntiles, silu_pair, s),
        wb(reinterpret_cast<const uint8_t*>(w)),
        row_bytes(K / 2),
        N(N_),
        scales(scale_copies(sring, ws, N_, K, group, s)) {
    ring_init<kBulk>(ring);
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) issue();
  }
  // The next stage (stage u + 2 while stage u is read), one commit group.
  __device__ __forceinline__ void issue() {
    issue_stage<kBulk>(wk, cur, ring, s, wb, row_bytes, N, scales);
  }
  // Stage u (weights and scales) is in its slots for every lane; kPending later commit groups
  // may still be in flight.
  template <int kPending>
  __device__ __forceinline__ void wait(int u) const {
    stage_wait<kPending, kBulk>(ring, u);
  }
  // Ring and scale-ring addresses of stage u's slot.
  __device__ __forceinline__ uint32_t base(int u) const { return ring + (u % kStages) * kStage; }
  __device__ __forceinline__ uint32_t sbase(int u) const {
    return sring + (u % kStages) * kScaleStage;
  }

 private:
  static __device__ __forceinline__ ScaleCopies scale_copies(uint32_t sring, const float* ws,
                                                             int64_t N, int K, int group,
                                                             const Slice& s) {
    const int64_t gpr = K / group;
    const int a = group / kGroupK, cgb = s.cb / 4;
    const bool vec = a == 1 && gpr % 4 == 0 && cgb % 4 == 0 &&
                     (reinterpret_cast<uintptr_t>(ws) & 15) == 0;
    return ScaleCopies{sring, ws, gpr, N, a, cgb / a, cgb % a, vec};
  }
};

}  // namespace sala::cuda::gemv
