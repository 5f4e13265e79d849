// W4A16 GEMM for prefill-sized runs on Hopper with the dequantization inside the mainloop:
// CUTLASS 3's sm_90 mixed-input collective (TMA + warp-specialized wgmma with the int4 operand
// converted in registers, "RS"), headers from the nvidia-cutlass wheel (cmake/cutlass.cmake).
//
//   y[m, n] = bf16( Σ_k bf16(q[n, k] · s[n, k / group]) · x[m, k] )     (fp32 sums)
//
// Each weight is converted in registers as int4 -> fp32, times its fp32 group scale (one fp32
// rounding), -> bf16 (nearest even): the values launch_int4_dequantize writes, so the sums are
// the dequantize + cuBLASLt path's up to the fp32 summation order (the GEMM contract against
// the CPU oracle, backend/cpu/cpu_int4.cpp). Why: that path writes and reads a bf16 copy of
// every weight per forward (2 bytes per weight; 7.75 ms per 9B forward on the H200, 0.5 s of a
// 128K prefill in chunks of 2,048).
//
// The narrow type must be the register (A) operand and K-major, and the scales MN-major, so
// the product is computed transposed (CUTLASS's example 55 does the same):
//   A = the weight's codes [N, K] K-major: CUTLASS int4b_t (two's complement, k even in the low
//       nibble), not the GEMV's device layout (cuda_gemv_int4.cuh): launch_int4_cutlass_layout
//       writes this copy once at upload;
//   S = scales transposed [K / group, N_total] (N contiguous; a stacked weight's part is a
//       column offset with the whole weight's leading dimension);
//   B = x [M, K] row-major = K x M column-major;
//   D = yᵀ [N, M] column-major = y [M, N] row-major.
// TMA: 16-byte aligned bases and rows: K % 32 == 0, N % 8 == 0; group a multiple of the tile's
// K (64) dividing K. can_implement refuses anything else; the caller then dequantizes.
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_gemm_int4_sm90.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace sala::cuda {
namespace {

using namespace cute;

using ElementCode = cutlass::int4b_t;
using ElementX = cutlass::bfloat16_t;
using ElementOut = cutlass::bfloat16_t;
using LayoutW = cutlass::layout::RowMajor;     // [N, K]: K-major
using LayoutX = cutlass::layout::ColumnMajor;  // K x M column-major = x [M, K] row-major
using LayoutD = cutlass::layout::ColumnMajor;  // yᵀ [N, M] column-major = y [M, N] row-major
constexpr int kAlignCodes = 32;                // int4 elements per 16 bytes
constexpr int kAlignX = 8;
constexpr int kAlignOut = 8;

template <class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule,
          class ElementScale>
struct Int4Gemm {
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignOut,
      ElementOut, LayoutD, kAlignOut, EpilogueSchedule>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<ElementCode, ElementScale>,
      LayoutW, kAlignCodes, ElementX, LayoutX, kAlignX, float, TileShape, ClusterShape,
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

bool device_is_sm90() {
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
               cudaSuccess &&
           major == 9;
  }();
  return sm90;
}

void check_cutlass(cutlass::Status status, const char* what, int line) {
  if (status == cutlass::Status::kSuccess) [[likely]] return;
  std::fprintf(stderr, "%s:%d: CUTLASS %s failed: %s\n", __FILE__, line, what,
               cutlass::cutlassGetStatusString(status));
  std::fflush(stderr);
  std::abort();
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
  const StrideW sw = cutlass::make_cute_packed_stride(StrideW{}, {n, k, 1});
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
  check_cutlass(gemm.initialize(args, workspace, st), "initialize", __LINE__);
  check_cutlass(gemm.run(st), "run", __LINE__);
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
  if (!device_is_sm90() || M <= 0 || N <= 0 || K <= 0 || group <= 0 || K % group != 0 ||
      ld_scales < N || M >= (int64_t(1) << 31) || N >= (int64_t(1) << 31))
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

}  // namespace sala::cuda
