// W4A16 skinny GEMM on Hopper for decode steps of 17..64 rows (issue 22): y[M, N] = x[M, K] ·
// W[N, K]^T with W the int4 codes of cuda_gemv_int4.cu's device layout (repacked words [N,
// K / 8]: nibble j = k 2j, nibble j + 4 = k 2j + 1, each q + 8) and fp32 group scales [N,
// K / group].
//
// Why: the int4 GEMV (mma.sync) dequantizes each weight once per chunk group and then runs one
// MMA per 8 input rows with the x fragments loaded from L1 per n-tile group: at 64 rows it took
// a decode step of the 9B to 17.1 ms (bf16 8.9; H200, session 16), ~7x its one-row time. Here
// each weight is dequantized once into wgmma's A registers and one m64n64k16 serves all 64 x
// rows: the instructions per weight are the GEMV's at one row.
//
// Structure (cuda_skinny_sm90.cu's, shared through cuda_skinny_sm90.cuh): persistent CTAs walk
// units (tile of 128 weight rows, K split); warp 0 of warpgroup 0 issues TMA loads of the
// packed codes [128 rows x 32 bytes = 64 k] (no swizzle; silu_pair: 64 gate + 64 up rows) and
// of x [M rounded up to 8, 64 k] (128-byte swizzle) into a ring of kStages stages; consumer
// warpgroups 1 and 2 own 64 weight rows each. Per stage a thread reads the 32 bytes of its two
// rows (16 warp + lane / 4 and + 8 of its warpgroup's 64), turns nibble pair lane % 4 of each
// word into the bf16 codes (q_2t, q_2t+1) (shift, lop3, one bf16x2 fma: exact), which are
// wgmma's A fragment for k16 step kk (words 2 kk and 2 kk + 1), and issues 4 wgmma.m64n64k16
// with x as the K-major B operand. A stage's A registers are double-buffered so that the next
// stage's dequantization overlaps the previous stage's MMAs.
//
// Numerics: per group of `group` k (a multiple of 128) the MMAs sum q · x (exact products) into
// fresh registers e, then d = fma(e, s[n, g], d) per weight row; K chunks (kMaxChunks fixed by
// K) are summed from zero and added in order, so a row's bits depend on neither M, nor N, nor
// the split: y = Σ_chunks Σ_g s_g Σ_{k in g} q_k x_k, the GEMV's formula in another fp32 order
// (not its bits). Outputs rounded once to bf16 (fp32 logits: bf16-rounded values), parts and
// silu_pair as the GEMV's.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_skinny_sm90.cuh"
#include "backend/cuda/cuda_skinny_sm90.h"
#include "backend/cuda/cuda_tma_sm90.cuh"

namespace sala::cuda {
namespace {
using namespace skinny;

constexpr int kStageK = 64;              // k per stage: one 128-byte swizzle row of bf16 x
constexpr int kWRowBytes = kStageK / 2;  // a weight row's packed codes per stage
constexpr int kStages = 8;
constexpr int kStageX = kNX * 128;         // 8 KB, 1024-byte aligned (the x swizzle's unit)
constexpr int kStageW = kBM * kWRowBytes;  // 4 KB
// The unsplit units' running chunk totals, [32 accumulators][256 consumer threads] fp32: kept
// in shared memory, not registers (with them ptxas spilled at its 168-register limit).
constexpr int kTotals = 32 * 256 * 4;
constexpr size_t kSmem = size_t(kStages) * (kStageX + kStageW) + kXchg + kTotals + 1024 + 256;

#ifdef SALA_SM90A_DEVICE
// Nibble pair `shift / 4` of a repacked word as the exact bf16 pair (q_2t, q_2t+1): the codes
// q + 8 land in the mantissa of 128 (0x4300), and fma(·, 1, -136) leaves q.
__device__ __forceinline__ uint32_t code_pair(uint32_t w, int shift) {
  uint32_t h, p;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;"
      : "=r"(h)
      : "r"(w >> shift), "r"(0x000f000fu), "r"(0x43004300u));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(p) : "r"(h), "r"(0x3f803f80u), "r"(0xc308c308u));
  return p;
}

__device__ __forceinline__ uint4 lds128(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr(p))
               : "memory");
  return v;
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// One stage of a consumer thread: its two rows' codes (smem rows r and r + 8 of the stage's
// W) as the A fragments of the 4 k16 steps, then the 4 MMAs into e (committed as one group).
__device__ __forceinline__ void stage_mma(float (&e)[32], uint32_t (&A)[4][4], const uint8_t* w,
                                          uint32_t ax, int r, int shift) {
  const uint4 a0 = lds128(w + r * kWRowBytes), a1 = lds128(w + r * kWRowBytes + 16);
  const uint4 b0 = lds128(w + (r + 8) * kWRowBytes), b1 = lds128(w + (r + 8) * kWRowBytes + 16);
  const uint32_t wa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const uint32_t wb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    A[kk][0] = code_pair(wa[2 * kk], shift);      // row r, k 16 kk + 2t, + 1
    A[kk][1] = code_pair(wb[2 * kk], shift);      // row r + 8
    A[kk][2] = code_pair(wa[2 * kk + 1], shift);  // row r, k 16 kk + 8 + 2t, + 1
    A[kk][3] = code_pair(wb[2 * kk + 1], shift);
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_m64n64k16_rs(e, A[kk], smem_desc_sw128(ax + kk * 32));
  wgmma_commit();
}
#endif

__global__ void __launch_bounds__(kThreads, 1)
    skinny_int4_sm90_kernel(const __grid_constant__ CUtensorMap tm_w,
                            const __grid_constant__ CUtensorMap tm_x, const SkinnyArgs a,
                            const float* __restrict__ scales, int gpr, int group) {
#ifdef SALA_SM90A_DEVICE
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sx = smem;                                                      // [kStages][kStageX]
  uint8_t* sw = smem + size_t(kStages) * kStageX;                          // [kStages][kStageW]
  float* xchg = reinterpret_cast<float*>(sw + size_t(kStages) * kStageW);  // [64][kNX]
  float* totals = xchg + kXchg / 4;                                        // [32][256]
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(totals) + kTotals);
  uint64_t* empty = full + kStages;
  int* last_flag = reinterpret_cast<int*>(empty + kStages);
  const int tid = threadIdx.x, wg = tid / 128;
  init_ring<kStages>(full, empty);
  pdl_trigger();
  const int units = a.tiles * a.splits, nk = a.k_per_split / kStageK;

  if (wg == 0) {
    if (tid != 0) return;
    produce<kStages>(a, units, nk, kStageK, kStageW, &tm_x, sx, kStageX, full, empty,
                     [&](int stage, int kc, int tile) {
                       uint8_t* dst = sw + size_t(stage) * kStageW;
                       if (a.o.silu_pair) {  // boxes of 64 rows: the gate half, then the up half
                         for (int c = 0; c < 2; ++c)
                           tma_load_2d(dst + c * (kStageW / 2), &tm_w, kc / 2,
                                       int(half_row0(a, tile, c)), &full[stage]);
                       } else {
                         tma_load_2d(dst, &tm_w, kc / 2, tile * kBM, &full[stage]);
                       }
                     });
    return;
  }

  // Consumers: warpgroup c = wg - 1 owns weight rows [64 c, 64 c + 64) of each tile.
  pdl_wait();
  const int c = wg - 1, t = tid - 128 * wg, warp = t / 32, lane = t % 32;
  const int ct = tid - 128;
  const int r = 64 * c + 16 * warp + lane / 4, shift = 4 * (lane % 4);  // smem rows r, r + 8
  int stage = 0;
  uint32_t phase = 0;
  const int chunks_per_unit = a.n_chunks / a.splits, groups = a.k_per_chunk / group;
  const int pairs = group / (2 * kStageK);  // stages per group, in pairs (group % 128 == 0)
  auto advance = [&] {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  };
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int tile = u / a.splits, split = u % a.splits;
    // This thread's weight rows (accumulators i with (i / 2) % 2 == h: row + 8 h), clamped to
    // a row that exists (past N: never stored).
    const int64_t n0 = half_row0(a, tile, c) + 16 * warp + lane / 4;
    const float* srow[2] = {scales + std::min<int64_t>(n0, a.N - 1) * gpr,
                            scales + std::min<int64_t>(n0 + 8, a.N - 1) * gpr};
    float d[32], e[32];
    uint32_t A[2][4][4];
    for (int cu = 0; cu < chunks_per_unit; ++cu) {
#pragma unroll
      for (int i = 0; i < 32; ++i) d[i] = 0.f;
      const int g0 = (split * a.k_per_split + cu * a.k_per_chunk) / group;
      for (int gi = 0; gi < groups; ++gi) {
        const float s0 = __ldg(srow[0] + g0 + gi), s1 = __ldg(srow[1] + g0 + gi);
#pragma unroll
        for (int i = 0; i < 32; ++i) e[i] = 0.f;
        int prev = -1;
        for (int p = 0; p < pairs; ++p) {
          // Stage 2p into buffer 0, 2p + 1 into buffer 1; after each commit, the stage before
          // (whose MMAs read the other buffer and that stage's x) is waited for and released.
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            mbar_wait(&full[stage], phase);
            stage_mma(e, A[b], sw + size_t(stage) * kStageW,
                      smem_addr(sx + size_t(stage) * kStageX), r, shift);
            if (prev >= 0) {
              wgmma_wait<1>();
              pin_regs(A[b ^ 1]);  // the retired stage's A: not reused before this point
              if (lane == 0) mbar_arrive(&empty[prev]);
            }
            prev = stage;
            advance();
          }
        }
        wgmma_wait<0>();
        pin_regs(A[1]);
        pin_regs(e);  // read e only after its MMAs completed
        if (lane == 0) mbar_arrive(&empty[prev]);
        for_each_acc(warp, lane,
                     [&](int i, int, int) { d[i] = fmaf(e[i], (i / 2) % 2 ? s1 : s0, d[i]); });
      }
      if (a.splits == 1) {  // chunks added in order: ((d0 + d1) + d2) + d3
#pragma unroll
        for (int i = 0; i < 32; ++i)
          totals[i * 256 + ct] = cu == 0 ? d[i] : totals[i * 256 + ct] + d[i];
        continue;
      }
      store_partial(a, tile, split * chunks_per_unit + cu, c, warp, lane, d);
    }
    float total[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) total[i] = a.splits == 1 ? totals[i * 256 + ct] : 0.f;
    finish_unit<false>(a, tile, c, warp, lane, ct, total, xchg, last_flag);
  }
#endif
}

}  // namespace

bool skinny_int4_sm90_supported(const void* x, int64_t ldx, const void* w, int64_t K, int64_t group,
                                int64_t M) {
  if (!(skinny_sm90_available() && M >= 1 && M <= kNX && K > 0 && K % 128 == 0 && group > 0 &&
        group % 128 == 0 && K % group == 0 && ldx % 8 == 0 &&
        reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0))
    return false;
  return (K / chunks_of(K, kStageK)) % group == 0;  // every chunk holds whole groups
}

void skinny_int4_sm90_init() {
  if (!skinny_sm90_available()) return;
  CUDA_CHECK(cudaFuncSetAttribute(skinny_int4_sm90_kernel,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
}

int skinny_int4_sm90_splits(int64_t N, int64_t K) {
  return splits_model(N, double(K) / 2, chunks_of(K, kStageK));
}

void launch_skinny_int4_sm90(const bf16* x, int64_t ldx, const uint32_t* w, const float* w_scales,
                             int64_t N, int K, int group, int M, const GemvOut& o, void* ws,
                             cudaStream_t st, int splits) {
  if (!skinny_int4_sm90_supported(x, ldx, w, K, group, M) || !w_scales ||
      (o.silu_pair && (N % 2 != 0 || o.nparts != 1 || o.f32))) {
    std::fprintf(stderr,
                 "%s:%d: int4 skinny GEMM unsupported: M = %d, K = %d, group = %d, N = %lld\n",
                 __FILE__, __LINE__, M, K, group, static_cast<long long>(N));
    std::abort();
  }
  SkinnyArgs a{};
  a.o = o;
  a.N = int(N);
  a.M = M;
  a.tiles = int(o.silu_pair ? (N / 2 + 63) / 64 : (N + kBM - 1) / kBM);
  a.n_chunks = chunks_of(K, kStageK);
  a.splits = splits > 0 ? splits : skinny_int4_sm90_splits(N, K);
  a.k_per_chunk = K / a.n_chunks;
  a.k_per_split = K / a.splits;
  const int box_rows = std::min(kNX, (M + 7) / 8 * 8);
  a.x_bytes = uint32_t(box_rows) * 128;
  if (a.n_chunks % a.splits != 0 ||
      (a.splits > 1 && int64_t(a.tiles) * a.n_chunks > int64_t(kMaxChunkTilesPerSm) * num_sms())) {
    std::fprintf(stderr, "%s:%d: %d K splits of a %lld x %d int4 weight (%d chunks) do not fit\n",
                 __FILE__, __LINE__, a.splits, static_cast<long long>(N), K, a.n_chunks);
    std::abort();
  }
  if (a.splits > 1) {
    a.counters = static_cast<int*>(ws);
    a.partial = reinterpret_cast<float*>(static_cast<char*>(ws) + counter_bytes(a.tiles));
  }
  const CUtensorMap tw =
      make_tma_map_2d(w, CU_TENSOR_MAP_DATA_TYPE_UINT8, N, K / 2, K / 2, kWRowBytes,
                      o.silu_pair ? 64 : kBM, CU_TENSOR_MAP_SWIZZLE_NONE);
  const CUtensorMap tx =
      make_tma_map_2d(x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, M, K, ldx * 2, kStageK, box_rows);
  const int grid = int(std::min<int64_t>(int64_t(a.tiles) * a.splits, num_sms()));
  launch_pdl(skinny_int4_sm90_kernel, dim3(grid), dim3(kThreads), kSmem, st, tw, tx, a, w_scales,
             int(K / group), group);
}

}  // namespace sala::cuda
