// Skinny bf16 GEMM on Hopper: y[M, N] = x[M, K] · W[N, K]^T, M <= 64 (cuda_skinny_sm90.h).
//
// Why: the ring GEMV (cuda_gemv.cu, mma.sync) costs 1.7x its one-row time at 40 rows (a B=8
// verify step with 4 drafts, issue 21): mma.sync needs a W fragment load per 16 x 16 and an x
// fragment load per n8 tile from L2, so its instruction count grows with M. wgmma reads both
// operands from shared memory by descriptor: one m64n64k16 per 64 weight rows and 16 k
// whatever M. Used for speculative steps of 17..64 rows, bf16 and FP8 weights
// (GemmDispatch::skinny_step_rows); decode-only steps of 17..64 rows stay on cuBLASLt (faster
// at 64 rows: 9B decode step 8.88 vs 9.36 ms in bf16, 7.28 vs 8.43 with FP8 weights, H200).
//
// Structure: persistent CTAs (one per SM) walk units = (tile of 128 weight rows, K split) in
// round-robin. Warp 0 of warpgroup 0 issues TMA loads of W [128 x 64 k] (rows >= N zero-
// filled; silu_pair: two boxes of 64, gate and up rows) and x [M rounded up to 8 x 64 k]
// (128-byte swizzle) into a ring of kStages stages
// (full / empty mbarriers); warpgroups 1 and 2 each run 4 wgmma.m64n64k16 per stage on their
// 64 weight rows. The MMA always reads 64 x rows: rows past the box hold whatever the stage
// held, which only reaches output columns >= M (never stored). A 64-row box zero-filled by
// TMA cost 14 % at M = 1 (H200, session 20); 8 stages instead of 6 gained nothing. The weight
// loads of the first stages are issued before griddepcontrol.wait (weights are never written
// by the previous kernel), the x loads after it.
// Summation order: K is cut into n_chunks (kMaxChunks = 4, or fewer for K < 256 bf16 / 512
// FP8) chunks, each summed from zero by wgmma, and the chunk sums are added in order:
// ((c0 + c1) + c2) + c3. So a weight row's bits depend on neither M, nor N, nor the split (1,
// 2 or 4 units of whole chunks per tile): a stacked weight's parts equal its slices computed
// alone, bit for bit. Unsplit, the chunks are added in registers; split, each unit stores
// its chunks' fp32 sums [64 x rows][128] to the workspace and the CTA whose arrival completes
// a tile's count adds them in order.
// Outputs are rounded once to bf16; fp32 outputs (logits) hold the bf16-rounded values.
//
// Shared memory: kStages x (16 KB W + 8 KB x) + the silu_pair exchange (16 KB) + barriers =
// 161 KB, 1024-byte aligned stages.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_ring.cuh"  // store_gemv_out, silu_pair_value
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_skinny_sm90.h"
#include "backend/cuda/cuda_skinny_sm90.cuh"
#include "backend/cuda/cuda_tma_sm90.cuh"
#include "backend/cuda/cuda_smem_optin.h"

namespace sala::cuda {
namespace {
using namespace skinny;

constexpr int kRowBytes = 128;  // a stage's k per row: one 128-byte swizzle row (bf16: 64 k,
                                // FP8 codes: 128 k)
constexpr int kBK = 64;         // bf16 k per stage
template <bool kFp8>
constexpr int kStageK = kFp8 ? 128 : 64;
constexpr int kStages = 6;
constexpr int kStageW = kBM * kRowBytes;  // 16 KB
constexpr int kStageX = kNX * kRowBytes;  // 8 KB
constexpr size_t kSmem = size_t(kStages) * (kStageW + kStageX) + kXchg + 1024 + 256;
#ifdef SALA_SM90A_DEVICE
// FP8 (e4m3 x e4m3): the same operand layout with 32 k (32 bytes) per instruction.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db));
}
#endif

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1)
    skinny_sm90_kernel(const __grid_constant__ CUtensorMap tm_w,
                       const __grid_constant__ CUtensorMap tm_x, const SkinnyArgs a) {
#ifdef SALA_SM90A_DEVICE
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~uintptr_t(1023));
  uint8_t* sw = smem;                             // [kStages][kStageW]
  uint8_t* sx = smem + size_t(kStages) * kStageW;  // [kStages][kStageX]
  float* xchg = reinterpret_cast<float*>(sx + size_t(kStages) * kStageX);  // [64][kNX]
  uint64_t* full = reinterpret_cast<uint64_t*>(sx + size_t(kStages) * kStageX + kXchg);
  uint64_t* empty = full + kStages;
  int* last_flag = reinterpret_cast<int*>(empty + kStages);
  const int tid = threadIdx.x, wg = tid / 128;
  init_ring<kStages>(full, empty);
  pdl_trigger();
  constexpr int SK = kStageK<kFp8>;
  const int units = a.tiles * a.splits, nk = a.k_per_split / SK;

  if (wg == 0) {
    if (tid != 0) return;
    produce<kStages>(a, units, nk, SK, kStageW, &tm_x, sx, kStageX, full, empty,
                     [&](int stage, int kc, int tile) {
                       if (a.o.silu_pair) {  // the map's box is 64 rows: gate half, up half
                         for (int c = 0; c < 2; ++c)
                           tma_load_2d(sw + size_t(stage) * kStageW + c * (kStageW / 2), &tm_w,
                                       kc, int(half_row0(a, tile, c)), &full[stage]);
                       } else {  // one box of 128 rows (two boxes of 64 cost ~2-3 µs per
                                 // launch, session 20)
                         tma_load_2d(sw + size_t(stage) * kStageW, &tm_w, kc, tile * kBM,
                                     &full[stage]);
                       }
                     });
    return;
  }

  // Consumers: warpgroup c = wg - 1 owns weight rows [64 c, 64 c + 64) of each tile.
  pdl_wait();
  const int c = wg - 1, t = tid - 128 * wg, warp = t / 32, lane = t % 32;
  const int ct = tid - 128;  // 0..255 over both consumer warpgroups
  int stage = 0;
  uint32_t phase = 0;
  const int chunks_per_unit = a.n_chunks / a.splits, nk_chunk = a.k_per_chunk / SK;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int tile = u / a.splits, split = u % a.splits;
    // Each K chunk is summed from zero in d (for_each_acc's layout); chunks are added in order
    // into total (or, split, summed in order by the tile's last CTA).
    // FP8: wgmma's e4m3 accumulation keeps fewer bits, so each stage sums into fresh registers
    // (e) that are added to d in fp32 (the promotion CUTLASS and the FP8 GEMV do per 128-256 k).
    float d[32], total[32], e[32];
    for (int cu = 0; cu < chunks_per_unit; ++cu) {
#pragma unroll
      for (int i = 0; i < 32; ++i) d[i] = 0.f;
      for (int kb = 0; kb < nk_chunk; ++kb) {
        mbar_wait(&full[stage], phase);
        const uint32_t aw = smem_addr(sw + size_t(stage) * kStageW + c * (kStageW / 2));
        const uint32_t ax = smem_addr(sx + size_t(stage) * kStageX);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        if constexpr (kFp8) {
#pragma unroll
          for (int i = 0; i < 32; ++i) e[i] = 0.f;
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            wgmma_m64n64k32_e4m3(e, smem_desc_sw128(aw + kk * 32), smem_desc_sw128(ax + kk * 32));
        } else {
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            wgmma_m64n64k16(d, smem_desc_sw128(aw + kk * 32), smem_desc_sw128(ax + kk * 32));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if constexpr (kFp8)  // the accumulators are read only after the wait
          pin_regs(e);
        else
          pin_regs(d);
        if constexpr (kFp8) {
#pragma unroll
          for (int i = 0; i < 32; ++i) d[i] += e[i];
        }
        if (lane == 0) mbar_arrive(&empty[stage]);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      if (a.splits == 1) {
#pragma unroll
        for (int i = 0; i < 32; ++i) total[i] = cu == 0 ? d[i] : total[i] + d[i];
        continue;
      }
      store_partial(a, tile, split * chunks_per_unit + cu, c, warp, lane, d);
    }
    finish_unit<kFp8>(a, tile, c, warp, lane, ct, total, xchg, last_flag);
  }
#endif
}


// 2-D tensor [rows, K] of bf16 (fp8: one-byte codes) with row pitch ld elements, boxes of
// [box_rows, 128 bytes].
CUtensorMap make_map(const void* base, bool fp8, int64_t rows, int64_t K, int64_t ld, int box_rows) {
  return fp8 ? make_tma_map_2d(base, CU_TENSOR_MAP_DATA_TYPE_UINT8, rows, K, ld, 128, box_rows)
             : make_tma_map_2d(base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rows, K, ld * 2, kBK,
                               box_rows);
}

}  // namespace

int skinny_sm90_splits(int64_t N, int64_t K, int elem_bytes) {
  return splits_model(N, double(K) * elem_bytes, chunks_of(K, kRowBytes / elem_bytes));
}

size_t skinny_sm90_workspace_bytes() {
  const int64_t chunk_tiles = int64_t(kMaxChunkTilesPerSm) * num_sms();
  return size_t(counter_bytes(chunk_tiles)) + size_t(chunk_tiles) * kNX * kBM * sizeof(float);
}

bool skinny_sm90_available() {
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    return major == 9 && tma_encode_fn() != nullptr;
  }();
  return sm90;
}

void skinny_sm90_init() {
  if (!skinny_sm90_available()) return;
  static OncePerDevice attributes;  // kernel attributes are per device (TP ranks on several GPUs)
  attributes([] {
    CUDA_CHECK(cudaFuncSetAttribute(skinny_sm90_kernel<false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    CUDA_CHECK(cudaFuncSetAttribute(skinny_sm90_kernel<true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  });
  (void)num_sms();
}

bool skinny_sm90_supported(const void* x, int64_t ldx, const void* w, int64_t K, int64_t M) {
  return skinny_sm90_available() && M >= 1 && M <= kNX && K % kBK == 0 && ldx % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

bool skinny_fp8_sm90_supported(const void* xq, int64_t ldq, const void* w, int64_t K, int64_t M) {
  return skinny_sm90_available() && M >= 1 && M <= kNX && K % kStageK<true> == 0 &&
         ldq % 16 == 0 && reinterpret_cast<uintptr_t>(xq) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

namespace {

// x [M, ldx] (bf16, or FP8 codes with their scales sx), W [N, K] (FP8: codes, scales sw).
void launch_skinny(bool fp8, const void* x, int64_t ldx, const float* sx, const void* w,
                   const float* sw, int64_t N, int K, int M, const GemvOut& o, void* ws,
                   cudaStream_t st, int splits) {
  SkinnyArgs a{};
  a.o = o;
  a.sx = sx;
  a.sw = sw;
  a.N = int(N);
  a.M = M;
  a.tiles = int(o.silu_pair ? (N / 2 + 63) / 64 : (N + kBM - 1) / kBM);
  a.splits = splits > 0 ? splits : skinny_sm90_splits(N, K, fp8 ? 1 : 2);
  a.n_chunks = chunks_of(K, fp8 ? kStageK<true> : kStageK<false>);
  a.k_per_chunk = K / a.n_chunks;
  a.k_per_split = K / a.splits;
  const int box_rows = std::min(kNX, (M + 7) / 8 * 8);
  a.x_bytes = uint32_t(box_rows) * kRowBytes;
  if (a.splits > 1) {
    if (a.n_chunks % a.splits != 0 ||
        int64_t(a.tiles) * a.n_chunks > int64_t(kMaxChunkTilesPerSm) * num_sms()) {
      std::fprintf(stderr, "%s:%d: %d K splits of a %lld x %d weight (%d chunks) do not fit\n",
                   __FILE__, __LINE__, a.splits, (long long)N, K, a.n_chunks);
      std::abort();
    }
    a.counters = static_cast<int*>(ws);
    a.partial = reinterpret_cast<float*>(static_cast<char*>(ws) + counter_bytes(a.tiles));
  }
  if (o.silu_pair && (N % 2 != 0 || o.nparts != 1 || o.f32)) {
    std::fprintf(stderr, "%s:%d: silu_pair of %lld rows\n", __FILE__, __LINE__, (long long)N);
    std::abort();
  }
  const CUtensorMap tw = make_map(w, fp8, N, K, K, o.silu_pair ? 64 : kBM);
  const CUtensorMap tx = make_map(x, fp8, M, K, ldx, box_rows);
  const int grid = int(std::min<int64_t>(int64_t(a.tiles) * a.splits, num_sms()));
  if (fp8)
    launch_pdl(skinny_sm90_kernel<true>, dim3(grid), dim3(kThreads), kSmem, st, tw, tx, a);
  else
    launch_pdl(skinny_sm90_kernel<false>, dim3(grid), dim3(kThreads), kSmem, st, tw, tx, a);
}

}  // namespace

void launch_skinny_sm90(const bf16* x, int64_t ldx, const bf16* w, int64_t N, int K, int M,
                        const GemvOut& o, void* ws, cudaStream_t st, int splits) {
  launch_skinny(false, x, ldx, nullptr, w, nullptr, N, K, M, o, ws, st, splits);
}

void launch_skinny_fp8_sm90(const uint8_t* xq, int64_t ldq, const float* sx, const uint8_t* w,
                            const float* w_scales, int64_t N, int K, int M, const GemvOut& o,
                            void* ws, cudaStream_t st, int splits) {
  launch_skinny(true, xq, ldq, sx, w, w_scales, N, K, M, o, ws, st, splits);
}

}  // namespace sala::cuda
