// W4A16 GEMM for prefill-sized runs on Hopper with the dequantization inside the mainloop:
// CUTLASS 3's sm_90 mixed-input collective (TMA + warp-specialized wgmma with the int4 operand
// converted in registers, "RS"), headers from the nvidia-cutlass wheel (cmake/cutlass.cmake).
//
//   y[m, n] = bf16( Σ_k bf16(q[n, k] · s[n, k / group]) · x[m, k] )     (fp32 sums)
//
// Each weight is converted in registers as int4 -> fp32, times its fp32 group scale (one fp32
// rounding), -> bf16 (nearest even), or with bf16 scales int4 -> bf16 times the scale in one
// bf16 rounding (the same value: q · s is exact in fp32 when s is a bf16 value): the values
// launch_int4_dequantize writes, so the sums are the dequantize + cuBLASLt path's up to the
// fp32 summation order (the GEMM contract against the CPU oracle, backend/cpu/cpu_int4.cpp).
// Why: that path writes and reads a bf16 copy of every weight per forward (2 bytes per
// weight; 63 ms of GEMMs per 9B forward of 2,048 rows on the H100 against 46.6 ms here).
//
// The narrow type must be the register (A) operand and K-major, and the scales MN-major, so
// the product is computed transposed (CUTLASS's example 55 does the same):
//   A = the weight's codes [N, K]: CUTLASS int4b_t (two's complement) in its "shuffled" order
//       (ShuffleAtom below), a copy that launch_int4_shuffle_codes writes once at upload from
//       the GEMV's device layout (cuda_gemv_int4.cuh);
//   S = scales transposed [K / group, N_total] (N contiguous; a stacked weight's part is a
//       column offset with the whole weight's leading dimension: launch_int4_scales_transposed);
//   B = x [M, K] row-major = K x M column-major;
//   D = yᵀ [N, M] column-major = y [M, N] row-major.
// TMA: 16-byte aligned bases and rows: K % 32 == 0, N % 8 == 0; group a multiple of the tile's
// K (64) dividing K; the shuffled order N % 16 == 0. The launcher or can_implement refuses
// anything else; the caller then dequantizes.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_gemm_int4_sm90.h"
#include "backend/cuda/cuda_cutlass_util.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/mixed_dtype_utils.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace sala::cuda {
namespace {

using namespace cute;

using ElementCode = cutlass::int4b_t;
using ElementX = cutlass::bfloat16_t;
using ElementOut = cutlass::bfloat16_t;
using LayoutX = cutlass::layout::ColumnMajor;  // K x M column-major = x [M, K] row-major
using LayoutD = cutlass::layout::ColumnMajor;  // yᵀ [N, M] column-major = y [M, N] row-major
constexpr int kAlignCodes = 32;                // int4 elements per 16 bytes
constexpr int kAlignX = 8;
constexpr int kAlignOut = 8;

// CUTLASS's recommended order of the int4 operand ("shuffled"): each thread's 8 codes of a
// wgmma fragment contiguous, in the order [0, 2, 4, 6, 1, 3, 5, 7], in atoms of 16 rows x 16 k
// (256 codes, 128 bytes); the atoms of a 16-row block follow each other along k (so a
// stacked weight's part of whole 16-row blocks starts at its row offset x K / 2 bytes).
using ShuffleAtom = decltype(cutlass::compute_memory_reordering_atom<
                             cutlass::bfloat16_t, Layout<Shape<_1, _1>>,
                             Layout<Shape<_2, _4>, Stride<_4, _1>>>());
using LayoutWShuffled = decltype(tile_to_shape(ShuffleAtom{}, make_shape(int{}, int{}, int{}),
                                               Step<_2, _1, _3>{}));

template <class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule,
          class ElementScale>
struct Int4Gemm {
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignOut,
      ElementOut, LayoutD, kAlignOut, EpilogueSchedule>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<ElementCode, ElementScale>,
      LayoutWShuffled, kAlignCodes, ElementX, LayoutX, kAlignX, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>,
                                                          CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static bool run(const bf16* x, const uint8_t* codes, const void* scales_t, int64_t ld_scales,
                  bf16* y, int m, int n, int k, int group, void* workspace,
                  size_t workspace_bytes, cudaStream_t st);
};

// Int4Sm90Config's tiles (cuda_gemm_int4_sm90.h: the measured alternatives).
using Tile = Shape<_128, _256, _64>;
using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using GemmF32Scales = Int4Gemm<Tile, Shape<_1, _1, _1>, Coop, CoopEpi, float>;
using GemmBf16Scales = Int4Gemm<Tile, Shape<_1, _1, _1>, Coop, CoopEpi, cutlass::bfloat16_t>;

// out (the shuffled order) from w (the GEMV's device layout, cuda_gemv_int4.cuh: word i of row
// n holds k = 8i + 2j in nibble j and 8i + 2j + 1 in nibble j + 4, each q + 8): one thread per
// output word of 8 codes; code p of the output is atom p / 256 (16-row block p / (16 K), k
// block the rest), position p % 256 in the atom, whose coordinate the atom's inverse gives.
__global__ void int4_shuffle_kernel(const uint32_t* __restrict__ w, int64_t N, int64_t K,
                                    uint32_t* __restrict__ out) {
  const int64_t words = N * K / 8, kblocks = K / 16;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < words;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t r = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t p = 8 * i + j, atom = p / 256;
      const int c = int(right_inverse(ShuffleAtom{})(int(p % 256)));  // (m_in, k_in) colex
      const int64_t n = (atom / kblocks) * 16 + c % 16, k = (atom % kblocks) * 16 + c / 16;
      const uint32_t src = w[n * (K / 8) + k / 8];
      const int kk = int(k % 8), nib = (kk & 1) * 4 + kk / 2;
      r |= (((src >> (4 * nib)) & 0xfu) ^ 8u) << (4 * j);
    }
    out[i] = r;
  }
}

template <class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule,
          class ElementScale>
bool Int4Gemm<TileShape, ClusterShape, KernelSchedule, EpilogueSchedule, ElementScale>::run(
    const bf16* x, const uint8_t* codes, const void* scales_t, int64_t ld_scales, bf16* y, int m,
    int n, int k, int group, void* workspace, size_t workspace_bytes, cudaStream_t st) {
  using StrideW = typename GemmKernel::StrideA;
  using StrideX = typename GemmKernel::StrideB;
  using StrideD = typename GemmKernel::StrideD;
  using StrideS = typename CollectiveMainloop::StrideScale;
  // The transposed problem: M' = n (weight rows), N' = m (x rows).
  const StrideW sw = tile_to_shape(ShuffleAtom{}, make_shape(n, k, 1), Step<_2, _1, _3>{});
  const StrideX sx = cutlass::make_cute_packed_stride(StrideX{}, {m, k, 1});
  const StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, {n, m, 1});
  StrideS ss{};
  get<1>(ss) = ld_scales;
  get<2>(ss) = ld_scales * (k / group);
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {n, m, k, 1},
      {reinterpret_cast<const ElementCode*>(codes), sw, reinterpret_cast<const ElementX*>(x), sx,
       static_cast<const ElementScale*>(scales_t), ss, group},
      {{}, nullptr, sd, reinterpret_cast<ElementOut*>(y), sd}};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
  if (Gemm::get_workspace_size(args) > workspace_bytes) return false;
  check_cutlass(gemm.initialize(args, workspace, st), "initialize", __FILE__, __LINE__);
  check_cutlass(gemm.run(st), "run", __FILE__, __LINE__);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s:%d: int4 GEMM launch: %s\n", __FILE__, __LINE__,
                 cudaGetErrorString(e));
    std::abort();
  }
  return true;
}

}  // namespace

bool launch_int4_gemm_sm90_config(Int4Sm90Config c, const bf16* x, const uint8_t* codes,
                                  const void* scales_t, int64_t ld_scales, bf16* y, int64_t M,
                                  int64_t N, int64_t K, int group, void* workspace,
                                  size_t workspace_bytes, cudaStream_t st) {
  if (!device_is_sm90() || M <= 0 || N <= 0 || N % 16 != 0 || K <= 0 || K % 16 != 0 ||
      group <= 0 || K % group != 0 || ld_scales < N || M >= (int64_t(1) << 31) ||
      N >= (int64_t(1) << 31))
    return false;
  const int m = int(M), n = int(N), k = int(K);
  switch (c) {
    case Int4Sm90Config::kF32Scales:
      return GemmF32Scales::run(x, codes, scales_t, ld_scales, y, m, n, k, group, workspace,
                                workspace_bytes, st);
    case Int4Sm90Config::kBf16Scales:
      return GemmBf16Scales::run(x, codes, scales_t, ld_scales, y, m, n, k, group, workspace,
                                 workspace_bytes, st);
  }
  return false;
}

void launch_int4_shuffle_codes(const uint32_t* w, int64_t N, int64_t K, uint32_t* out,
                               cudaStream_t st) {
  if (N <= 0) return;
  if (!(N % 16 == 0 && K % 16 == 0)) {
    std::fprintf(stderr, "%s:%d: int4 shuffle: N = %lld, K = %lld\n", __FILE__, __LINE__,
                 static_cast<long long>(N), static_cast<long long>(K));
    std::abort();
  }
  const int64_t words = N * K / 8;
  const int grid = int(std::min<int64_t>((words + 255) / 256, 132 * 16));
  int4_shuffle_kernel<<<grid, 256, 0, st>>>(w, N, K, out);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s:%d: int4 shuffle launch: %s\n", __FILE__, __LINE__,
                 cudaGetErrorString(e));
    std::abort();
  }
}

}  // namespace sala::cuda
