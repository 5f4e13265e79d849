// GemmDispatch: every GEMM of the CUDA backend, y[T, N] = x[T, K] · W[N, K]ᵀ. It owns the
// cuBLASLt handle, its 32 MB workspace and the algorithm cache (one heuristic query per
// (N, T, K, types, alignment)), and the stacked-GEMM workspace, and picks per call:
//  - bf16, decode steps of ≤ kDecodeGemvRows (16) rows and verify / prefill runs of ≤
//    kGemvMaxRows (64) rows (gemv_rows): the skinny tensor-core GEMM (cuda_gemv.cu), one pass
//    over the weights, row-invariant, which can write several outputs (linear_multi) or
//    silu(gate) * up (linear_silu_mul) directly;
//  - bf16 speculative steps (verify calls, no prompt chunk) of 17..kStackMaxRows (64) rows on
//    Hopper: the wgmma skinny GEMM (cuda_skinny_sm90.cu: about its one-row time at any row
//    count up to 64, row-invariant among themselves; not the bits of <= 16-row steps), which
//    writes the parts (linear_multi) or silu(gate) * up (linear_silu_mul) as the GEMV does;
//  - bf16 decode-only steps of 17..64 rows, stacked weights: one cuBLASLt GEMM into the
//    stacked workspace, then a split / the SiLU product of its halves (the GEMV costs 1.6-2.9x
//    its one-row time at 32-64 rows; the skinny GEMM was slower than cuBLASLt at 64 rows);
//  - otherwise cuBLASLt (fp32 mode: true fp32, CUBLAS_COMPUTE_32F on fp32 operands, no TF32).
// In steps that prefill, each sequence's rows are multiplied as they would be alone (batch
// invariance: linear()).
// FP8_E4M3 weights (W8A8, cuda_gemm_fp8.cpp): each run of rows is quantized per token into the
// FP8 workspace (launch_quantize_rows_fp8; or, for inputs multiplied as one run of rows whose
// producing norm / SiLU kernel was told this GEMM is next, by that kernel: prepare_fp8_input),
// then the FP8
// GEMV where gemv_rows allows, else
// one cuBLASLt FP8 GEMM per output part, which applies
// the per-token x per-channel scales itself (outer-vector scaling), or, where this cuBLASLt
// has no such kernel for the shape, writes fp32 sums that launch_fp8_apply_scales scales
// (or, for linear_add_rmsnorm's projections, the residual-norm kernel: linear_fp8_sums).
// INT4_GROUPED weights (W4A16, cuda_gemm_int4.cpp): runs of <= kGemvMaxRows rows (decode,
// verify, short prefill runs; decode-only steps of 17..64 rows too) through the int4 GEMV
// (cuda_gemv_int4.cu), row-invariant; longer runs dequantize each output part once per call
// into a bf16 (fp32 mode: fp32, exact) scratch matrix and run the dense path on it.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <functional>
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
  // int4_prefill_gemm: BackendOptions::int4_prefill_gemm (taken where the GPU is sm_90).
  GemmDispatch(bool bf16_mode, cudaStream_t stream, DeviceArena& arena, const StepPlan& plan,
               GraphCache& graphs, OpTimer& timer, bool int4_prefill_gemm);
  ~GemmDispatch();
  GemmDispatch(const GemmDispatch&) = delete;
  GemmDispatch& operator=(const GemmDispatch&) = delete;

  // The stacked workspace for the model's widest stacked weight (init_caches).
  void plan_stack_workspace(const ModelConfig& cfg);
  void linear(const Tensor& x, const Weight& w, Tensor& y);
  // One GEMM over all rows of x (GEMV for ≤ 16 rows, the Hopper skinny GEMM for 17..64 rows
  // of speculative steps, cuBLASLt otherwise).
  void linear_rows(const Tensor& x, const Tensor& w, Tensor& y);
  // false: no single-kernel path for these shapes; the caller runs Backend's default
  // composition (one linear() per part / linear_multi then silu_mul).
  bool linear_multi(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys);
  // codes (may be empty): called once x's own prepared FP8 codes are taken, on a path whose
  // SiLU product can write g's codes for the next GEMM (decode-only FP8 steps of 17..64 rows);
  // the Fp8Act it returns (no codes: none prepared) says where.
  bool linear_silu_mul(const Tensor& x, const Weight& w, Tensor& g, Tensor& u,
                       const std::function<cuda::Fp8Act()>& codes = {});
  // y = x · Wᵀ, then the residual norm that tail() describes (h, w, out, out's FP8 codes),
  // applied by the GEMV's last CTAs (cuda_gemv_row_tail.cuh): one run of at most
  // kGemvRowTailRows decode rows through the bf16 or FP8 ring GEMV. tail() is called after
  // x's own prepared FP8 codes are taken (it may prepare out's for the next GEMM; its sync is
  // set here). false: not this path and nothing done (the caller runs linear, then the norm).
  bool linear_norm(const Tensor& x, const Weight& w, Tensor& y,
                   const std::function<cuda::GemvRowTail()>& tail);
  // y = x · Wᵀ for FP8 weights, as linear(), except where x's rows are one run and its GEMM is
  // cuBLASLt's unscaled FP8 GEMM (decode-only steps of 17..64 rows: o_proj, down): there the
  // scaling is left to the caller's next kernel (launch_add_rmsnorm_sums), y is not written
  // here, and the sums, scales and y are returned; elsewhere acc == nullptr (y written). The
  // sums live in this dispatch's fp32 buffer until the next FP8 GEMM.
  cuda::Fp8Sums linear_fp8_sums(const Tensor& x, const Weight& w, Tensor& y);
  // FP8 weights exist (CudaBackend::upload_linear / upload_fp8).
  void note_fp8_weights() { fp8_weights_ = true; }
  // Once FP8 weights exist: the FP8 workspace for GEMM inputs of up to rows x cols
  // (CudaBackend::alloc; the model allocates its activations at start, after its weights, so the
  // workspace is sized at start too; a larger input grows it outside recordings).
  void reserve_fp8_input(int64_t rows, int64_t cols);
  // FP8 activation handoff (issue 17, item 5): the kernel that makes x (an RMSNorm) writes
  // x's per-token codes and scales itself when the next GEMM to read x is `next`, FP8, and
  // multiplies x's rows as one run (one_run: decode steps, one-sequence prefill chunks; not a
  // step that prefills several sequences, whose runs are per sequence). prepare_fp8_input
  // returns where to write them ({nullptr, nullptr}: not here, the GEMM quantizes x itself)
  // and remembers x; the next linear / linear_multi / linear_silu_mul, which must be on
  // exactly x (data, rows, cols; checked), then skips launch_quantize_rows_fp8. The producer
  // may leave x's bf16 values unstored (Fp8Act::skip_out): Backend's `next` hint says that
  // GEMM is x's only reader and nothing writes x in between.
  struct Fp8Input {
    uint8_t* codes;
    float* scales;
  };
  Fp8Input prepare_fp8_input(const Tensor& x, const Weight& next);
  // A step starts: nothing is prepared.
  void forget_fp8_input() { fp8_prepared_ = {}; }
  // An INT4_GROUPED weight exists (CudaBackend::upload_int4, in the device layout): the
  // dequantization scratch grows to hold it, at load, never in the step loop, and where the
  // sm_90 prefill GEMM runs, its copy of w is made (scales_bf16: every scale is a bf16 value,
  // so the copy keeps bf16 scales, CUTLASS's faster conversion, the same products).
  void note_int4_weight(const Weight& w, bool scales_bf16);
  // Copies of each int4 weight kept: 2 where the sm_90 prefill GEMM runs.
  int int4_weight_copies() const { return int4_sm90_ok_ ? 2 : 1; }

 private:
  // The skinny GEMMs' outputs: rows [r0, r0 + T) of each of ys (weight rows stacked in ys'
  // order; o.f32 for fp32 outputs), or silu(gate) * up of a stacked [2I, K] weight into g.
  static cuda::GemvOut gemv_parts(const std::vector<Tensor*>& ys, int64_t r0 = 0);
  static cuda::GemvOut gemv_silu_pair(Tensor& g);
  struct AlgoEntry {  // one cached cuBLASLt GEMM
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  bool is_act(const Tensor& t) const { return t.dtype == (bf16_ ? DType::BF16 : DType::F32); }
  bool stacked_gemm(const Tensor& x, const Tensor& w);  // grows stack_ws_ outside recordings
  // f(r0, n) for the row runs x[r0, r0 + n) that are multiplied as one GEMM: all rows, or in a
  // step that prefills, one run per sequence longer than 16 rows and groups of <= 16 rows of
  // consecutive short sequences (linear()).
  void for_each_run(int64_t rows, const std::function<void(int64_t, int64_t)>& f) const;
  // for_each_run(rows, ·) calls its function once, on all rows.
  bool one_run(int64_t rows) const;

  // ---- W4A16 (cuda_gemm_int4.cpp) ----
  // ys[i] = x · W_iᵀ for the row slices W_i of w, per run of rows (for_each_run).
  void linear_int4(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys);
  // The int4 GEMV takes the rows of x (all of a call's, or one run of them) into outputs of
  // these types.
  bool int4_gemv_ok(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys) const;
  // The W4A16 skinny GEMM (Hopper) takes them instead: a decode-only run of 17..64 rows.
  bool int4_skinny_ok(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys) const;
  // W (an INT4_GROUPED weight or a row slice of one) as a dense [rows, cols] matrix of the
  // activation type in the scratch (overwritten by the next call, in stream order).
  Tensor dequantize_int4(const Weight& w);
  // Decode-only steps up to this many rows take the int4 GEMV in runs of kGemvMaxRows (the
  // byte count favours it over dequantize + GEMM; not measured above 64 rows yet).
  static constexpr int64_t kInt4DecodeGemvRows = 256;
  void* int4_ws_ = nullptr;  // the dequantization scratch
  int64_t int4_ws_elems_ = 0;
  // The sm_90 prefill GEMM's copy of an int4 weight (cuda_gemm_int4_sm90.cu): codes in
  // CUTLASS's shuffled order [rows, cols / 8] words, scales transposed [cols / group, rows].
  struct Int4Sm90Copy {
    int64_t rows = 0, cols = 0;
    uint32_t* codes = nullptr;
    void* scales_t = nullptr;
    bool scales_bf16 = false;
  };
  bool int4_sm90_ok_ = false;                        // bf16 mode, sm_90, the option
  std::map<const char*, Int4Sm90Copy> int4_sm90_;    // by the weight's device codes
  // y = x · wᵀ through the copy of the weight w is a row slice of; false: no copy, or CUTLASS
  // refused the shapes (nothing launched).
  bool int4_sm90_gemm(const Tensor& x, const Weight& w, Tensor& y);

  // ---- FP8 (cuda_gemm_fp8.cpp) ----
  // ys[i] = x · W_iᵀ for the row slices W_i of w (one part: linear()), per run of rows.
  void linear_fp8(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys);
  // y [T, N] = (xq [T, K] · wᵀ) · sx[t] · sw[n]: one cuBLASLt FP8 GEMM (or the fallback's
  // unscaled GEMM and scaling kernel).
  void fp8_gemm(const uint8_t* xq, const float* sx, int64_t T, const Weight& w, Tensor& y);
  // Grows the FP8 workspace to `codes` bytes of codes and `rows` scales (outside recordings).
  void grow_fp8_ws(size_t codes, int64_t rows);
  // The workspace for the codes [rows, cols] and scales [rows] of an FP8 GEMM's input, grown
  // (with a warning: reserve_fp8_input sizes it ahead) when too small.
  Fp8Input fp8_input(int64_t rows, int64_t cols);
  // x's codes and scales are in the workspace already (prepare_fp8_input); forgets them either
  // way, so they serve one GEMM call.
  bool take_fp8_prepared(const Tensor& x);
  struct Fp8Prepared {
    const void* data = nullptr;
    int64_t rows = 0, cols = 0;
  };
  Fp8Prepared fp8_prepared_;
  // cuBLASLt plan of an FP8 GEMM [T, K] x [N, K]ᵀ -> D of type dt, with the outer-vector scales
  // (scaled) or none; false: the heuristic has no algorithm.
  bool plan_fp8(int N, int T, int K, cudaDataType_t dt, int align, bool scaled, AlgoEntry& e);

  bool bf16_;
  cudaStream_t stream_;
  DeviceArena& arena_;
  const StepPlan& plan_;
  GraphCache& graphs_;
  OpTimer& timer_;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  size_t lt_workspace_size_ = 32u << 20;
  std::map<std::tuple<int, int, int, int>, AlgoEntry> algos_;
  // FP8 GEMMs by (N, T, K, output type and alignment): outer_vec says whether the scaled
  // algorithm ran (decided at the shape's first call, which is never recorded); else `e` is the
  // unscaled fp32-output GEMM of the fallback.
  struct Fp8Entry {
    AlgoEntry e;
    bool outer_vec = false;
  };
  std::map<std::tuple<int, int, int, int>, Fp8Entry> fp8_algos_;
  bool fp8_weights_ = false;
  bool fp8_fallback_warned_ = false;
  // Activation codes [T, K] at fp8_ws_, then (256-byte aligned) the per-token scales [T].
  void* fp8_ws_ = nullptr;
  size_t fp8_codes_cap_ = 0;
  int64_t fp8_rows_cap_ = 0;
  // The fallback's fp32 sums [T, N] (bf16 outputs only), allocated on first use.
  float* fp8_acc_ = nullptr;
  size_t fp8_acc_elems_ = 0;
  // linear_fp8_sums' call: fp8_gemm's unscaled path records its sums in deferred_ instead of
  // launching the scaling kernel.
  bool defer_scales_ = false;
  cuda::Fp8Sums deferred_{};
  // Decode steps of 17..kStackMaxRows rows: a stacked weight's outputs from one cuBLASLt GEMM
  // into this [rows, N] bf16 buffer, then split (linear_multi) or combined (linear_silu_mul).
  static constexpr int64_t kStackMaxRows = 64;
  // Decode-only steps take the skinny GEMM up to this many rows (gemv_rows).
  static constexpr int64_t kDecodeGemvRows = 16;
  bool decode_only_step() const;  // every call of the step has one row
  // x's kDecodeGemvRows < rows <= kStackMaxRows go to the Hopper skinny GEMM in this step (bf16,
  // a speculative step: multi-row calls, none a prompt chunk: StepDev::prompt_free).
  bool skinny_step_rows(int64_t rows) const;
  // A GEMV of `rows` rows is the path for this step: <= kDecodeGemvRows rows, or (verify and
  // prefill runs) <= kGemvMaxRows rows outside decode-only steps (bf16 weights: unless the
  // skinny GEMM took them first, skinny_step_rows).
  bool gemv_rows(int64_t rows) const;
  // A decode-only step's x qualifies for a stacked GEMM of n output columns (stack_ws_ holds
  // [x.rows, n], grown if needed outside recordings).
  bool stack_fits(const Tensor& x, int64_t n);
  bool skinny_ok_ = false;        // skinny_sm90_available()
  unsigned* tail_sync_ = nullptr;  // GemvRowTail::sync: arrival count and generation
  void* skinny_ws_ = nullptr;     // its split-K workspace (counters zeroed)
  void* stack_ws_ = nullptr;
  int64_t stack_ws_elems_ = 0;
};

}  // namespace sala::cuda_host
