// The machinery shared by the skinny GEMMs (cuda_gemv.cu: bf16 weights; cuda_gemv_fp8.cu: e4m3
// codes; cuda_gemv_int4.cu: int4 codes): K slices, the persistent weight ring (bulk copies for
// M <= 16 on sm_90, else cp.async) and its tile walk, the shared-memory epilogue. The weights
// are handled as bytes: a 16-byte chunk is 8 bf16, 16 e4m3 or 32 int4 k.
//
// Shapes. A CTA is kWarps = 8 warps; warp w owns the fixed K slice Slice(kc, w) of every weight
// row (kc = K / k per chunk). Input rows: M <= kGemvMaxRows = 64, as NT <= 8 n8 tiles of the
// mma B operand (instantiations NT = 1, 2, 4, 8; tile nt holds rows 8 nt .. 8 nt + 7, zeros
// past M). Accumulators acc[R][NT][4]: R 16-row weight tiles (ring: R = 2, a 32-row tile).
//
// Row invariance rests on: the K split (Slice) and the k order of the mma sequence of each
// accumulator depend only on K; mma columns are independent; the epilogue sums one output's
// 8 warp partials in warp order, then scales / rounds it alone. Nothing here depends on M
// except which columns exist.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace sala::cuda::gemv {

constexpr int kWarps = 8;  // K slices per CTA: part of the numerics
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxNT = kGemvMaxRows / 8;  // n8 tiles of input rows
static_assert(kGemvMaxRows % 16 == 0 && kMaxNT <= 8, "epilogue passes of 16 columns");

// n8 tiles for M rows: the instantiation that launch_gemv* picks (1, 2, 4 or 8).
constexpr int nt_for(int M) { return M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8; }
// n-tiles whose B fragments are held in registers at once (the rest are loaded per group):
// all X fragments of NT = 8 would take 128 registers per lane.
constexpr int kGroupNT = 2;

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
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
// Two ways to fill a stage (issue_stage's kBulk, the same bytes in the same places):
// - cp.async: 16 copies of 16 bytes per lane, cp.async.wait_group per lane, then __syncwarp;
// - bulk (sm_90): lane r copies row r's 256-byte run by one cp.async.bulk (the TMA engine),
//   completing on the slot's mbarrier, marked evict-first in L2 (the weights are read once per
//   step; what later kernels read again, x rows, KV pages, lightning state, stays).
// The kernels take bulk copies for M <= 16 rows (bulk_rows(NT)), cp.async above. H100, session
// 54 (docs/PERF_LOG.md): decode at 4K FP8 + FP8 KV B = 1 -2.3..-3.5 %, B = 8 -0.2..-1.3 %, W4A16
// -2.5 / -1.8 %; at 32..64 rows the bulk copies made the GEMVs up to 11 % slower (26 % without
// the L2 policy). Before sm_90 the bulk path compiles to the cp.async one (the ring runs
// only where 227 KB of shared memory per block exist, so it is not launched there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SALA_GEMV_BULK 1
#endif
constexpr bool bulk_rows(int NT) { return NT <= 2; }
__device__ __forceinline__ void bar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(bar) : "memory");
}
#ifdef SALA_GEMV_BULK
// One arrival (the barrier's only one per phase) announcing `bytes` of bulk copies.
__device__ __forceinline__ void bar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
// Returns once the barrier's phase of this parity completed (acquire: the copies are visible).
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n\t"
        "selp.b32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
#endif

__device__ __forceinline__ uint4 lds(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a)
               : "memory");
  return v;
}

// The GEMVs' MMAs: m16n8k16, fp32 accumulation, A the 16 weight rows, B an n8 tile of x rows.
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// K slice of warp w over kc 16-byte chunks: chunks [cb, ce) (empty when ce <= cb),
// 4·ceil(kc/8/4) long.
struct Slice {
  int cb, ce;
  __device__ Slice(int kc, int w) {
    const int per = ((kc + kWarps - 1) / kWarps + 3) / 4 * 4;
    cb = w * per;
    ce = min(cb + per, kc);
  }
};

// Predicated loads through the non-coherent path. `ok ? __ldg(p) : 0` compiles to a branch per
// load with the address recomputed inside each branch (from the kernel parameters: ~40
// instructions per chunk group of the int4 GEMV's stage loop, SASS of session 30); these
// compute it once. ldg_or_zero: zeros when !ok; ldg_if: the registers are left undefined when
// !ok (for loads whose values are then never used).
__device__ __forceinline__ uint4 ldg_or_zero(const void* p, bool ok) {
  uint4 v;
  asm volatile(
      "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(int(ok)));
  return v;
}
__device__ __forceinline__ uint4 ldg_if(const void* p, bool ok) {
  uint4 v;
  asm volatile(
      "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t"
      "@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(int(ok)));
  return v;
}

// The x rows of lane row g: row g + 8 nt feeds n-tile nt's B column g. A row past M reads
// row 0 instead of zeros: an x row only feeds its own mma column, and the columns of rows
// past M are never stored. The row address is computed once (per kernel).
struct XLane {
  const uint8_t* row0;  // x row g, or row 0 when g >= M
  int64_t step;         // bytes between n-tiles: 8 rows
  int M, g;
  __device__ XLane(const uint8_t* x, int64_t ld, int M_, int g_)
      : row0(x + (g_ < M_ ? g_ : 0) * ld), step(8 * ld), M(M_), g(g_) {}
  // The 16-byte chunks of n-tile nt's row start at row(nt).
  __device__ __forceinline__ const uint4* row(int nt) const {
    return reinterpret_cast<const uint4*>(g + 8 * nt < M ? row0 + nt * step : row0);
  }
};

// B fragments (bf16 and FP8 GEMVs): chunks c0 + 4u + t, u < 4, of the slice ending at ce, of
// n-tiles nt0 .. nt0 + G - 1; zeros past the slice (their W fragments are multiplied too).
// From L1/L2: x is small and read by every CTA.
// kFull: the caller knows every chunk is inside the slice (a full stage): plain loads.
struct XRows : XLane {
  using XLane::XLane;
  template <int G, bool kFull = false>
  __device__ __forceinline__ void load(uint4 (&X)[G][4], int nt0, int c0, int t, int ce) const {
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const uint4* r = row(nt0 + j);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = c0 + 4 * u + t;
        X[j][u] = kFull ? __ldg(r + c) : ldg_or_zero(r + c, c < ce);
      }
    }
  }
};

// ---- the ring ----
// A warp's stage: kRows weight rows x kCps chunks (256 B) of its slice. Even rows, then odd
// rows 64 B further (at 64 mod 128): lane (g, t) reading chunk 4v + t of row g hits 8
// distinct 16-byte bank groups per quarter warp, no swizzle, every row one contiguous run.
constexpr int kRows = 32, kCps = 16, kStages = 3;
constexpr int kHalf = kRows / 2 * kCps * 16, kStage = 2 * kHalf + 128;
// The slot's mbarrier (sm_90 bulk copies) in the stage's last 64 bytes, which no row uses (odd
// rows end at 2 kHalf + 64).
constexpr int kBarOff = 2 * kHalf + 64;
static_assert(kBarOff + 8 <= kStage && kBarOff % 8 == 0, "the slot barrier fits its pad");
static_assert(kRows == 32, "issue_stage: one bulk copy per lane, lane r copying row r");
constexpr int kRingBytes = kWarps * kStages * kStage;      // 199,680
constexpr int kRedBytes = kWarps * kRows * 17 * 4;          // one pass of 16 columns: 17,408
constexpr int kGateBytes = kRows * kGemvMaxRows * 4;        // silu_pair's gate tile: 8,192
constexpr int kRingMaxSmem = 227 * 1024;                    // sm_90's per-block opt-in

// GemvOut's store of output n (a weight row) of x row m: into its part (parts by weight-row
// ranges), fp32 outputs holding the bf16-rounded value. Shared with the wgmma skinny GEMM.
__device__ __forceinline__ void store_gemv_out(const GemvOut& o, int64_t m, int64_t n, float v) {
  int q = 0;
  while (q + 1 < o.nparts && n >= o.end[q]) ++q;
  const int64_t col = n - (q ? o.end[q - 1] : 0);
  if (o.f32)
    static_cast<float*>(o.y[q])[m * o.cols[q] + col] = rb(v);
  else
    static_cast<bf16*>(o.y[q])[m * o.cols[q] + col] = f2b(v);
}

// silu_pair's output bf16(bf16(silu(g)) · u) of a bf16-rounded gate sum g and the up sum u
// (SiluMul's roundings).
__device__ __forceinline__ bf16 silu_pair_value(float g, float u) {
  return f2b(rb(g / (1.f + expf(-g))) * rb(u));
}

__device__ __forceinline__ uint32_t row_off(int r) {
  return (r & 1) * (kHalf + 64) + (r >> 1) * kCps * 16;
}
// Lane (g, t)'s chunk t of row g in a stage. Rows g + e (e even) and chunk groups v are
// constants further, row_off(g + e) + 64 v = row_off(g) + row_off(e) + 64 v, so the ring
// reads take immediate offsets instead of an address computation each.
__device__ __forceinline__ uint32_t lane_off(int g, int t) { return row_off(g) + t * 16; }

// A ring read (16 bytes at shared address a) when ok, else zeros; volatile and ordered like
// lds (the slot is refilled by asynchronous copies).
__device__ __forceinline__ uint4 lds_or_zero(uint32_t a, bool ok) {
  uint4 v;
  asm volatile(
      "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@q ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "r"(a), "r"(int(ok))
      : "memory");
  return v;
}
// kFull: ok is known to hold (a full stage): a plain lds.
template <bool kFull>
__device__ __forceinline__ uint4 ring_read(uint32_t a, bool ok) {
  if constexpr (kFull) return lds(a);
  return lds_or_zero(a, ok);
}

// What a tile's epilogue does with its values (GemvOut::silu_pair: the gate tile parks them
// in shared memory, the up tile of the same columns combines).
enum class Epi { kStore, kKeepGate, kSiluMul };

// A persistent CTA's walk: tiles bx, bx + gx, ...; with silu_pair, units bx, bx + gx, ... of
// the ntiles / 2 gate tiles, each followed by its up tile (ntiles / 2 further), so both meet
// in this CTA. Stage u of this warp is stage u % nst of tile u / nst, in slot u % kStages.
struct Walk {
  int bx, gx, units, ntc, nst, U;
  bool pair;
  __device__ Walk(int ntiles, bool silu_pair, const Slice& s)
      : bx(int(blockIdx.x)), gx(int(gridDim.x)), pair(silu_pair) {
    units = pair ? ntiles / 2 : ntiles;
    const int nuc = bx < units ? (units - 1 - bx) / gx + 1 : 0;
    ntc = pair ? 2 * nuc : nuc;                                    // tiles of this CTA
    nst = s.ce > s.cb ? (s.ce - s.cb + kCps - 1) / kCps : 0;       // stages per tile
    U = ntc * nst;                                                 // stages this warp consumes
  }
  __device__ int tile(int ti) const {
    return pair ? bx + (ti >> 1) * gx + (ti & 1) * units : bx + ti * gx;
  }
  __device__ Epi epi(int ti) const {
    return !pair ? Epi::kStore : (ti & 1) ? Epi::kSiluMul : Epi::kKeepGate;
  }
};

// A warp's copy cursor: the next stage to issue (stage st of this CTA's tile ti, into ring slot
// `slot`), advanced by one stage per call, so that issuing needs no division (the copy path
// was ~27 % of the ring kernels' instructions when it divided and clamped per stage: ncu,
// session 16). q, r: the caller's own per-stage state (the int4 GEMV's scale group).
struct Cursor {
  int u = 0, ti = 0, st = 0, slot = 0;
  int q = 0, r = 0;
};

struct NoExtraCopies {
  __device__ void operator()(Cursor&, int64_t, int, int) const {}
};

// Whether issue_stage<kBulk> copies by cp.async.bulk on this target.
template <bool kBulk>
constexpr bool bulk_here() {
#ifdef SALA_GEMV_BULK
  return kBulk;
#else
  return false;
#endif
}

// The warp's slot barriers (one arrival per phase), before its first issue_stage<kBulk> (only
// bulk copies use them).
template <bool kBulk>
__device__ __forceinline__ void ring_init(uint32_t ring) {
  if (!bulk_here<kBulk>()) return;
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int i = 0; i < kStages; ++i) bar_init(ring + i * kStage + kBarOff);
#ifdef SALA_GEMV_BULK
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
  __syncwarp();
}

// Stage u is in its slot for every lane of the warp: its weight rows (bulk: the slot barrier's
// phase u / kStages completed; cp.async: this lane's groups) and this lane's extra cp.async
// copies (issue_stage's `extra`), with kPending later commit groups still allowed in flight.
// kBulk: the issue_stage<kBulk> that filled it.
template <int kPending, bool kBulk>
__device__ __forceinline__ void stage_wait(uint32_t ring, int u) {
#ifdef SALA_GEMV_BULK
  if constexpr (bulk_here<kBulk>())
    bar_wait(ring + (u % kStages) * kStage + kBarOff, uint32_t(u / kStages) & 1);
#endif
  cp_wait<kPending>();
  __syncwarp();
}

// Stage cur.u into its slot of the warp's ring, then the cursor moves on: one commit group per
// call, empty from U on, so that cp.async.wait_group counts stages (the extra copies', and
// without bulk copies the rows'). Bulk: lane r copies row r's run of the stage (nv chunks) on
// the slot's barrier; else 2 rows x 256 B per instruction, lanes 0-15 copy chunk `lane` of the
// even rows, 16-31 of the odd ones. w: the weights [N, row_bytes]. extra(cur, n0, c0, nv)
// issues more cp.async copies into the same commit group (the stage's tile starts at row n0, its
// nv chunks at c0), before the cursor moves.
template <bool kBulk, class Extra = NoExtraCopies>
__device__ __forceinline__ void issue_stage(const Walk& wk, Cursor& cur, uint32_t ring,
                                            const Slice& s, const uint8_t* __restrict__ w,
                                            int64_t row_bytes, int64_t N, Extra extra = {}) {
  if (cur.u < wk.U) {
    const int c0 = s.cb + cur.st * kCps, nv = min(kCps, s.ce - c0);
    const int64_t n0 = int64_t(wk.tile(cur.ti)) * kRows;
#ifdef SALA_GEMV_BULK
    if constexpr (bulk_here<kBulk>()) {
      const int lane = threadIdx.x % 32;
      const uint32_t slot = ring + cur.slot * kStage, bar = slot + kBarOff;
      if (lane == 0) bar_expect(bar, uint32_t(kRows * nv * 16));
      __syncwarp();  // the phase expects the bytes before any copy completes
      bulk_copy(slot + row_off(lane), w + min(n0 + lane, N - 1) * row_bytes + int64_t(c0) * 16,
                uint32_t(nv * 16), bar);
    }
#endif
    if constexpr (!bulk_here<kBulk>()) {
      const int lane = threadIdx.x % 32, r0 = lane / kCps, c = lane % kCps;
      const uint32_t d0 = ring + cur.slot * kStage + row_off(r0) + c * 16;
      if (c < nv) {
        const uint8_t* src = w + int64_t(c0 + c) * 16;
        if (n0 + kRows <= N) {  // every tile but a last partial one
          src += (n0 + r0) * row_bytes;
#pragma unroll
          for (int j = 0; j < kRows / 2; ++j) cp16(d0 + j * kCps * 16, src + 2 * j * row_bytes);
        } else {
#pragma unroll
          for (int j = 0; j < kRows / 2; ++j)
            cp16(d0 + j * kCps * 16, src + min(n0 + r0 + 2 * j, N - 1) * row_bytes);
        }
      }
    }
    extra(cur, n0, c0, nv);
    cur.slot = cur.slot == kStages - 1 ? 0 : cur.slot + 1;
    if (++cur.st == wk.nst) cur.st = 0, ++cur.ti;
  }
  ++cur.u;
  cp_commit();
}

// The second half of finish()'s pass p: red holds every warp's partials of input columns
// PW p .. PW p + PW - 1 ([kWarps][ROWS][PW + 1], after a __syncthreads); each output is summed in
// warp order, scaled, rounded once and stored (kKeepGate / kSiluMul: see finish). Shared with
// kernels whose accumulators are not in finish()'s mma layout
// (scripts/kernel_ab/int4_imma_gemv.cu).
template <int ROWS, class Scale, int PW>
__device__ __forceinline__ void finish_pass(float (*red)[ROWS][PW + 1], int p, int64_t n0,
                                            int64_t N, int M, const GemvOut& o, Epi epi,
                                            float* gate, Scale scale) {
  for (int i = threadIdx.x; i < ROWS * PW; i += kThreads) {
    const int nl = i % ROWS, ml = i / ROWS, m = PW * p + ml;
    const int64_t n = n0 + nl;
    if (m >= M || n >= N) continue;
    float v = red[0][nl][ml];
#pragma unroll
    for (int q = 1; q < kWarps; ++q) v += red[q][nl][ml];
    v = scale(v, m);
    if (epi == Epi::kKeepGate) {
      gate[m * ROWS + nl] = rb(v);
      continue;
    }
    if (epi == Epi::kSiluMul) {  // n is an up row; its gate row is n - N / 2
      static_cast<bf16*>(o.y[0])[m * o.cols[0] + n - N / 2] =
          silu_pair_value(gate[m * ROWS + nl], v);
      continue;
    }
    store_gemv_out(o, m, n, v);
  }
}

// Epilogue of a tile of ROWS = 16 R weight rows from n0, in passes of PW = 16 (or 8: the int4
// GEMV, whose ring needs the shared memory) input columns (red [kWarps][ROWS][PW + 1] holds one
// pass): the warps' partial tiles to shared memory, summed in warp order,
// scale(v, m) applied (bf16: none; FP8: · sx[m] · w_scale[n]), rounded once. c0, c1 of
// acc[rt][nt]: (weight row rt·16 + g, input rows nt·8 + 2t, + 1); c2, c3: weight row
// rt·16 + g + 8. kKeepGate / kSiluMul: gate [M][ROWS] holds the gate tile's bf16 values; the
// same thread keeps and reads an (n, m). Passes past M are skipped (M is uniform over the CTA).
// Ends with red free to overwrite only after the caller's __syncthreads.
template <int ROWS, int R, int NT, class Scale, int PW = 16>
__device__ __forceinline__ void finish(float (*red)[ROWS][PW + 1], const float (&acc)[R][NT][4],
                                       int64_t n0, int64_t N, int M, const GemvOut& o, Epi epi,
                                       float* gate, Scale scale) {
  static_assert(kThreads % ROWS == 0, "a thread finishes one weight row (FP8: its scale)");
  static_assert(PW == 8 || PW == 16, "passes of one or two n8 tiles");
  constexpr int NTP = PW / 8;  // n8 tiles per pass
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int p = 0; p < (NT + NTP - 1) / NTP; ++p) {
    if (PW * p >= M) break;
    if (p > 0) __syncthreads();  // every thread has read pass p - 1
#pragma unroll
    for (int rt = 0; rt < R; ++rt)
#pragma unroll
      for (int j = 0; j < NTP && NTP * p + j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          red[warp][rt * 16 + g + 8 * (i / 2)][j * 8 + 2 * t + i % 2] = acc[rt][NTP * p + j][i];
    __syncthreads();
    finish_pass<ROWS, Scale, PW>(red, p, n0, N, M, o, epi, gate, scale);
  }
}

// f.template operator()<NT>() for the n8-tile count of M rows (nt_for).
template <class F>
void with_nt(int M, F&& f) {
  switch (nt_for(M)) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 4: return f.template operator()<4>();
    default: return f.template operator()<8>();
  }
}

}  // namespace sala::cuda::gemv
