// W8A8 FP8 GEMM for prefill-sized runs on Hopper, with both scales in the epilogue: CUTLASS 3's
// sm_90 TMA + warp-specialized wgmma kernel (headers from the nvidia-cutlass wheel,
// cmake/cutlass.cmake) and an epilogue visitor tree
//   y[m, n] = bf16( (acc[m, n] · sx[m]) · sw[n] )      acc = Σ_k xq[m, k] · wq[n, k] (fp32)
// the CPU oracle's order of the two products (backend/cpu/cpu_fp8.cpp), rounded once.
//
// Why: cuBLASLt on the H200 has no per-token x per-channel scaled FP8 GEMM (its outer-vector
// scale mode is "not supported" for every shape we tried, session 8), so without this kernel
// an FP8 prefill GEMM writes fp32 sums [T, N] and a second kernel reads them back to scale:
// 8 bytes of extra traffic per output and a launch, 60 % of an FP8 4K prefill's GPU time was
// "fp8 gemm + scales" (docs/PERF.md). vLLM's cutlass_scaled_mm is the same construction.
//
// Layouts (CUTLASS's names): A = xq [M, K] row-major (the activation codes of
// launch_quantize_rows_fp8), B = wq [N, K] row-major = K x N column-major (the checkpoint's
// e4m3 weight), D = y [M, N] row-major. TMA needs 16-byte aligned bases and rows: K % 16 == 0,
// N % 8 == 0; can_implement refuses anything else and the caller falls back to cuBLASLt.
//
// Accumulation: prefill runs use CUTLASS's "FastAccum" FP8 mainloop: wgmma keeps the whole K
// sum in its accumulator, whose additions align the 32 products of a k = 32 step and the
// running sum to the largest and keep ~14 significant bits (the cooperative plain mainloop
// instead adds the partials into fp32 registers every few k-blocks, as cuBLASLt does by
// default). The outputs then differ from the CPU's sgemm by rel L2 0.0024 at K = 4096 and
// 0.0039 at K = 16384 (H100, session 41; tests/ops/fp8_gemm_test_util.h models it and bounds
// it), and the model's accuracy does not move: sala-tiny-chat's eval (160 questions) 86.72 %
// with FP8 weights and 85.94 % with FP8 weights and KV, each as with the plain mainloop, against
// 85.94 % in bf16; teacher-forced top-1 agreement with bf16 83.4 % vs 84.7 % (session 40).
// Decode steps of 32..64 rows (DecodeGemm) keep the plain mainloop.
//
// Shapes: runs of more than 64 rows (prefill), 128 x 256 x 128 tiles with the cooperative
// schedule (two consumer warpgroups per 128-row tile, 64 x 256 fp32 accumulators each),
// persistent over the tiles in clusters of 2 along M; decode-only steps of 32..64 rows whose
// output is at least twice as wide as the input, 64 x 128 x 128 tiles with the ping-pong
// schedule (DecodeGemm below). Other runs of up to 64 rows are not taken: the FP8 GEMV
// (row-invariant) or, in decode-only steps of 17..64 rows, cuBLASLt. A stream-K configuration
// of the prefill tiles for those decode steps was measured slower than cuBLASLt's fp32 output
// + scaling kernel (H200, FP8 decode at B=64: 9.99 vs 8.06 ms per step, session 11) and
// removed.
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_gemm_fp8_sm90.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_cutlass_util.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace sala::cuda {
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

using ElementCode = cutlass::float_e4m3_t;
using ElementOut = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignCodes = 16;  // elements per 16 bytes
constexpr int kAlignOut = 8;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// A kernel configuration: tile, cluster and tile scheduler. The epilogue tree is
// Mul1(Mul0(acc, sx[m]), sw[n]): sx broadcasts along N (a column vector of the tile: stride 1
// in M), sw along M (a row vector: stride 1 in N).
template <class TileShape, class ClusterShape, class Scheduler, class KernelSchedule,
          class EpilogueSchedule>
struct ScaledGemm {
  using Acc = fusion::Sm90AccFetch;
  using ScaleRows = fusion::Sm90ColBroadcast<0, TileShape, float, float,
                                             Stride<Int<1>, Int<0>, Int<0>>>;
  using ScaleCols = fusion::Sm90RowBroadcast<0, TileShape, float, float,
                                             Stride<Int<0>, Int<1>, Int<0>>>;
  using Mul0 = fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>;
  using Mul1 = fusion::Sm90Compute<cutlass::multiplies, ElementOut, float, kRound>;
  using Epilogue = fusion::Sm90EVT<Mul1, fusion::Sm90EVT<Mul0, Acc, ScaleRows>, ScaleCols>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignOut,
      ElementOut, LayoutD, kAlignOut, EpilogueSchedule, Epilogue>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementCode, LayoutA, kAlignCodes,
      ElementCode, LayoutB, kAlignCodes, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
      Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static bool run(const uint8_t* xq, const float* sx, const uint8_t* wq, const float* sw,
                  bf16* y, int m, int n, int k, void* workspace, size_t workspace_bytes,
                  cudaStream_t st);
};

// Prefill runs (M > 64): 128 x 256 x 128 tiles in clusters of 2 along M (the x tile is
// multicast to both), persistent over the tiles, FastAccum (above). The 4K prefill's 256 FP8
// GEMMs (H100, one command, session 42): plain mainloop on 128 x 128 tiles 66.3 ms, FastAccum
// 57.9, FastAccum on 128 x 256 52.6 (a 128K prefill's, the first vs the last: 2,101 vs 1,705).
using PrefillGemm = ScaledGemm<Shape<_128, _256, _128>, Shape<_2, _1, _1>,
                               cutlass::gemm::PersistentScheduler,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                               cutlass::epilogue::TmaWarpSpecializedCooperative>;
// Decode-only steps of 32..64 rows with wide outputs (N >= 2 K: the stacked q/k/v/gate and
// gate_up GEMMs of GemmDispatch::stack_fits): one 64-row tile along M (the ping-pong schedule,
// one consumer warpgroup per tile), 128-column tiles. H200 (CudaFp8.DecodeConfigsSpeed, with
// the quantize kernel), M = 64: 4096 -> 16384 27.1 vs cuBLASLt's 34.0 µs, 4096 -> 32768 45.1 vs
// 55.3, 4096 -> 8704 19.8 vs 21.0; but 16384 -> 4096 50.1 vs 35.2 and 4096 -> 4096 19.1 vs
// 16.6 (too few column tiles for the SMs), and at M = 17 cuBLASLt is as fast or faster. A
// 64 x 64 tile in clusters of 8 along N was measured too (4096 -> 4096: 15.3 µs, 4096 ->
// 16384: 31.5) and not kept.
using DecodeGemm = ScaledGemm<Shape<_64, _128, _128>, Shape<_1, _1, _1>,
                              cutlass::gemm::PersistentScheduler,
                              cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                              cutlass::epilogue::TmaWarpSpecialized>;

template <class TileShape, class ClusterShape, class Scheduler, class KernelSchedule,
          class EpilogueSchedule>
bool ScaledGemm<TileShape, ClusterShape, Scheduler, KernelSchedule, EpilogueSchedule>::run(const uint8_t* xq, const float* sx,
                                                         const uint8_t* wq, const float* sw,
                                                         bf16* y, int m, int n, int k,
                                                         void* workspace,
                                                         size_t workspace_bytes,
                                                         cudaStream_t st) {
  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  using StrideD = typename GemmKernel::StrideD;
  const StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, {m, k, 1});
  const StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, {n, k, 1});
  const StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, {m, n, 1});
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n, k, 1},
      {reinterpret_cast<const ElementCode*>(xq), sa, reinterpret_cast<const ElementCode*>(wq),
       sb},
      {{}, nullptr, sd, reinterpret_cast<ElementOut*>(y), sd}};
  // {Mul0's {acc, sx, op}, sw, Mul1's op}
  args.epilogue.thread = {{{}, {sx}, {}}, {sw}, {}};
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
  if (Gemm::get_workspace_size(args) > workspace_bytes) return false;
  check_cutlass(gemm.initialize(args, workspace, st), "initialize", __FILE__, __LINE__);
  check_cutlass(gemm.run(st), "run", __FILE__, __LINE__);
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace

bool launch_fp8_scaled_gemm_sm90(const uint8_t* xq, const float* sx, const uint8_t* wq,
                                 const float* sw, bf16* y, int64_t M, int64_t N, int64_t K,
                                 void* workspace, size_t workspace_bytes, cudaStream_t st) {
  const Fp8Sm90Config c = M > 64                       ? Fp8Sm90Config::kPrefill
                         : M >= 32 && N >= 2 * K && K > 0 ? Fp8Sm90Config::kDecode
                                                          : Fp8Sm90Config::kNone;
  return launch_fp8_scaled_gemm_sm90_config(c, xq, sx, wq, sw, y, M, N, K, workspace,
                                            workspace_bytes, st);
}

bool launch_fp8_scaled_gemm_sm90_config(Fp8Sm90Config c, const uint8_t* xq, const float* sx,
                                        const uint8_t* wq, const float* sw, bf16* y, int64_t M,
                                        int64_t N, int64_t K, void* workspace,
                                        size_t workspace_bytes, cudaStream_t st) {
  if (!device_is_sm90() || M <= 0 || N <= 0 || K <= 0) return false;
  const int m = int(M), n = int(N), k = int(K);
  switch (c) {
    case Fp8Sm90Config::kPrefill:
      return PrefillGemm::run(xq, sx, wq, sw, y, m, n, k, workspace, workspace_bytes, st);
    case Fp8Sm90Config::kDecode:
      return DecodeGemm::run(xq, sx, wq, sw, y, m, n, k, workspace, workspace_bytes, st);
    case Fp8Sm90Config::kNone:
      return false;
  }
  return false;
}

}  // namespace sala::cuda
