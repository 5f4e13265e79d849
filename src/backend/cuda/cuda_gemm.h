// GemmDispatch: every GEMM of the CUDA backend, y[T, N] = x[T, K] · W[N, K]ᵀ. It owns the
// cuBLASLt handle, its 32 MB workspace and the algorithm cache (one heuristic query per
// (N, T, K, types, alignment)), and the stacked-GEMM workspace, and picks per call:
//  - bf16, ≤ kGemvMaxRows (16) rows: the skinny tensor-core GEMM (cuda_gemv.cu), which can
//    write several outputs (linear_multi) or silu(gate) * up (linear_silu_mul) directly;
//  - bf16 decode-only steps of 17..kStackMaxRows (64) rows, stacked weights: one cuBLASLt
//    GEMM into the stacked workspace, then a split / the SiLU product of its halves;
//  - otherwise cuBLASLt (fp32 mode: true fp32, CUBLAS_COMPUTE_32F on fp32 operands, no TF32).
// In steps that prefill, each sequence's rows are multiplied as they would be alone (batch
// invariance: linear()).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_graph_cache.h"
#include "backend/cuda/cuda_op_timer.h"
#include "backend/cuda/cuda_step_plan.h"

namespace sala::cuda_host {

class GemmDispatch {
 public:
  GemmDispatch(bool bf16_mode, cudaStream_t stream, DeviceArena& arena, const StepPlan& plan,
               GraphCache& graphs, OpTimer& timer);
  ~GemmDispatch();
  GemmDispatch(const GemmDispatch&) = delete;
  GemmDispatch& operator=(const GemmDispatch&) = delete;

  // The stacked workspace for the model's widest stacked weight (init_caches).
  void plan_stack_workspace(const ModelConfig& cfg);
  void linear(const Tensor& x, const Weight& w, Tensor& y);
  // One GEMM over all rows of x (skinny GEMM for ≤ 16 rows, cuBLASLt above).
  void linear_rows(const Tensor& x, const Tensor& w, Tensor& y);
  // false: no single-kernel path for these shapes; the caller runs Backend's default
  // composition (one linear() per part / linear_multi then silu_mul).
  bool linear_multi(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys);
  bool linear_silu_mul(const Tensor& x, const Weight& w, Tensor& g, Tensor& u);

 private:
  bool is_act(const Tensor& t) const { return t.dtype == (bf16_ ? DType::BF16 : DType::F32); }
  bool stacked_gemm(const Tensor& x, const Tensor& w);  // grows stack_ws_ outside recordings

  bool bf16_;
  cudaStream_t stream_;
  DeviceArena& arena_;
  const StepPlan& plan_;
  GraphCache& graphs_;
  OpTimer& timer_;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  size_t lt_workspace_size_ = 32u << 20;
  struct AlgoEntry {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int, int, int>, AlgoEntry> algos_;
  // Decode steps of 17..kStackMaxRows rows: a stacked weight's outputs from one cuBLASLt GEMM
  // into this [rows, N] bf16 buffer, then split (linear_multi) or combined (linear_silu_mul).
  static constexpr int64_t kStackMaxRows = 64;
  void* stack_ws_ = nullptr;
  int64_t stack_ws_elems_ = 0;
};

}  // namespace sala::cuda_host
