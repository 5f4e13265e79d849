// GemmDispatch's FP8 path: W8A8 with e4m3 weights (one fp32 scale per output channel) and
// activations quantized per token at every GEMM, the numbers of the CPU oracle
// (backend/cpu/cpu_fp8.cpp) up to the fp32 summation order:
//   xq [T, K], sx [T] = fp8_quantize_rows(x)          launch_quantize_rows_fp8 (bit for bit), or
//                                                     x's producer (prepare_fp8_input)
//   y[t, n] = (Σ_k xq[t, k] · wq[n, k]) · sx[t] · sw[n]   one FP8 GEMM per output part:
//   on Hopper, prefill runs into bf16 take CUTLASS's kernel with the scales in its epilogue
//   (cuda_gemm_fp8_sm90.cu); the rest cuBLASLt, as below
// The products of two e4m3 values are exact in fp32, so the GPU and the CPU differ only in how
// the fp32 sums are ordered (and where the two scales multiply); the bf16 output rounds once.
//
// cuBLASLt (column-major): A = the weight codes stored K x N (ld K) used transposed, B = the
// activation codes K x T (ld K), D = y stored N x T (ld N): the "TN" layout FP8 requires. The
// scales are outer vectors (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, cuBLAS 12.9+ on Hopper):
// A's N per-channel scales, B's T per-token ones. Where this cuBLASLt has no such kernel for a
// shape (the heuristic finds none, or cublasLtMatmul refuses it), that shape runs an unscaled
// GEMM into fp32 and launch_fp8_apply_scales (sum · sx · sw, the CPU's order); the choice is
// made at the shape's first call, which never runs inside a CUDA-graph recording (GraphCache
// runs every key once eagerly).
//
// FP8 kernels need 16-byte alignment everywhere: K % 16 == 0 (a code row's bytes), N % 8 == 0
// (a bf16 output row's bytes), and 16-byte aligned weight / code / output / scale pointers. The
// released model's shapes (K = 4096 or 16384; parts N = 4096, 256, 16384) all qualify; other
// shapes fail a SALA_CHECK that names them, and a shape cuBLASLt has no FP8 kernel for at all
// fails naming T, K, N.
#include <algorithm>
#include <cstdio>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_host_util.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_skinny_sm90.h"
#include "core/check.h"

namespace sala::cuda_host {
using namespace sala::cuda;

namespace {
constexpr size_t kWsAlign = 256;
size_t round_up(size_t n) { return (n + kWsAlign - 1) / kWsAlign * kWsAlign; }
}  // namespace

void GemmDispatch::reserve_fp8_input(int64_t rows, int64_t cols) {
  if (!fp8_weights_ || !bf16_) return;
  const size_t codes = size_t(rows) * size_t(cols);
  if (codes > fp8_codes_cap_ || rows > fp8_rows_cap_)
    grow_fp8_ws(std::max(codes, fp8_codes_cap_), std::max(rows, fp8_rows_cap_));
}

void GemmDispatch::grow_fp8_ws(size_t codes, int64_t rows) {
  SALA_CHECK(!graphs_.capturing(),
             "the FP8 workspace would grow to {} code bytes / {} rows inside a CUDA-graph "
             "recording (a recorded shape runs eagerly first)",
             codes, rows);
  graphs_.drop();  // recordings hold the old workspace's address
  fp8_prepared_ = {};  // codes a producer wrote there are gone: the next GEMM quantizes x itself
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  arena_.release(fp8_ws_);
  fp8_codes_cap_ = round_up(codes);
  fp8_rows_cap_ = rows;
  fp8_ws_ = arena_.device(fp8_codes_cap_ + size_t(rows) * sizeof(float));
}

GemmDispatch::Fp8Input GemmDispatch::fp8_input(int64_t rows, int64_t cols) {
  const size_t codes = size_t(rows) * size_t(cols);
  if (codes > fp8_codes_cap_ || rows > fp8_rows_cap_) {
    if (fp8_ws_)
      std::fprintf(stderr,
                   "warning: cuda backend: FP8 GEMM input of %lld x %lld exceeds the FP8 "
                   "workspace (%zu bytes, %lld rows); growing it\n",
                   (long long)rows, (long long)cols, fp8_codes_cap_, (long long)fp8_rows_cap_);
    grow_fp8_ws(std::max(codes, fp8_codes_cap_), std::max(rows, fp8_rows_cap_));
  }
  return {static_cast<uint8_t*>(fp8_ws_),
          reinterpret_cast<float*>(static_cast<char*>(fp8_ws_) + fp8_codes_cap_)};
}

GemmDispatch::Fp8Input GemmDispatch::prepare_fp8_input(const Tensor& x, const Weight& next) {
  SALA_CHECK(!fp8_prepared_.data, "FP8 codes prepared for [{},{}] at {} and never read",
             fp8_prepared_.rows, fp8_prepared_.cols, fp8_prepared_.data);
  // One run of rows, whose codes then start at the workspace as linear_fp8's own quantization
  // puts them: per-token codes, so the producer's equal the quantize kernel's at any row count
  // (H200, session 29: the separate quantize took 248 ms of a 128K FP8 prefill).
  if (!(bf16_ && next.format == WeightFormat::FP8_E4M3 && is_bf16(x) && x.rows >= 1 &&
        one_run(x.rows) && x.cols == next.cols && x.cols % 16 == 0))
    return {nullptr, nullptr};
  const Fp8Input in = fp8_input(x.rows, x.cols);
  fp8_prepared_ = {x.data, x.rows, x.cols};
  return in;
}

bool GemmDispatch::take_fp8_prepared(const Tensor& x) {
  const Fp8Prepared p = fp8_prepared_;
  fp8_prepared_ = {};
  if (!p.data) return false;
  // The producer may have left the prepared tensor's bf16 values unstored (Fp8Act::skip_out):
  // its codes are the only copy, and a GEMM on any other input is a broken `next` hint.
  SALA_CHECK(p.data == x.data && p.rows == x.rows && p.cols == x.cols,
             "FP8 codes prepared for an input [{},{}] at {} (its bf16 values not stored), but the "
             "next GEMM reads [{},{}] at {}",
             p.rows, p.cols, p.data, x.rows, x.cols, x.data);
  return true;
}

void GemmDispatch::linear_fp8(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys) {
  SALA_CHECK(bf16_, "FP8 weights on the CUDA backend need bf16 mode");
  SALA_CHECK(w.format == WeightFormat::FP8_E4M3 && w.scales && w.group == w.cols,
             "FP8 linear: a [{},{}] {} weight without one scale per output channel", w.rows,
             w.cols, weight_format_name(w.format));
  SALA_CHECK(is_bf16(x) && x.cols == w.cols, "FP8 linear: x [{},{}] {} for a weight [{},{}]",
             x.rows, x.cols, dtype_name(x.dtype), w.rows, w.cols);
  int64_t n = 0;
  for (const Tensor* y : ys) {
    SALA_CHECK(y->rows == x.rows && (is_bf16(*y) || y->dtype == DType::F32),
               "FP8 linear: output [{},{}] {} for x [{},{}]", y->rows, y->cols,
               dtype_name(y->dtype), x.rows, x.cols);
    n += y->cols;
  }
  SALA_CHECK(n == w.rows, "FP8 linear: weight [{},{}] for {} output columns", w.rows, w.cols, n);
  const int64_t K = x.cols;
  SALA_CHECK(K % 16 == 0,
             "FP8 linear x [{},{}] · w [{},{}]ᵀ: cuBLASLt's FP8 GEMM needs K % 16 == 0", x.rows,
             K, w.rows, w.cols);
  // Codes written by x's producer (prepare_fp8_input: one run, at the workspace's start).
  const bool prepared = take_fp8_prepared(x);
  if (x.rows == 0) return;
  const Fp8Input in = fp8_input(x.rows, K);
  uint8_t* xq = in.codes;  // [T, K] codes of the current run
  float* sx = in.scales;   // [T]
  // Each run is quantized into the start of the workspace (the scales stay 256-byte aligned);
  // the next run's quantization follows the previous run's GEMMs in stream order.
  // Runs of ≤ kGemvMaxRows rows (decode steps, short sequences of a prefill step): the FP8
  // skinny GEMV on the run's codes, whose rows do not depend on the run (batch invariance);
  // all parts in one launch.
  const bool gemv_ok = ys.size() <= 4 && (ys.size() == 1 || std::all_of(ys.begin(), ys.end(),
                                                 [](const Tensor* y) { return is_bf16(*y); }));
  for_each_run(x.rows, [&](int64_t r0, int64_t T) {
    SALA_CHECK(!prepared || (r0 == 0 && T == x.rows),
               "FP8 codes prepared for x [{},{}] but a run of rows [{}, {})", x.rows, K, r0,
               r0 + T);
    const bf16* xr = ptr<bf16>(x) + r0 * K;
    // Speculative steps of 17..64 rows on Hopper: the wgmma skinny GEMM (as bf16 weights).
    if (gemv_ok && skinny_step_rows(T) && skinny_fp8_sm90_supported(xq, K, w.data, K, T)) {
      const GemvOut o = gemv_parts(ys, r0);
      if (!prepared) launch_quantize_rows_fp8(xr, T, K, K, xq, sx, stream_);
      launch_skinny_fp8_sm90(xq, K, sx, static_cast<const uint8_t*>(w.data), w.scales, w.rows,
                             int(K), int(T), o, skinny_ws_, stream_);
      timer_.tick(o.f32 ? "skinny fp8 lm_head" : "skinny fp8");
      return;
    }
    if (gemv_ok && gemv_rows(T) && gemv_fp8_supported(w.data, K, T)) {
      const GemvOut o = gemv_parts(ys, r0);
      if (!prepared) launch_quantize_rows_fp8(xr, T, K, K, xq, sx, stream_);
      launch_gemv_fp8(xq, K, sx, static_cast<const uint8_t*>(w.data), w.scales, w.rows, int(K),
                      int(T), o, stream_);
      timer_.tick(o.f32 ? "gemv fp8 lm_head" : "gemv fp8");
      return;
    }
    if (!prepared) {
      launch_quantize_rows_fp8(ptr<bf16>(x) + r0 * K, T, K, K, xq, sx, stream_);
      timer_.tick("fp8 quantize");
    }
    // Decode-only steps of 17..64 rows: every part from one GEMM over the stacked weight, then
    // split (one GEMM of 16,384 columns instead of four of 4,096: H200, M = 64, 27 vs ~55 µs).
    if (ys.size() > 1 && gemv_ok && r0 == 0 && T == x.rows && stack_fits(x, w.rows)) {
      Tensor ws{stack_ws_, DType::BF16, T, w.rows};
      fp8_gemm(xq, sx, T, w, ws);
      launch_split_cols(ptr<bf16>(ws), T, w.rows, gemv_parts(ys), stream_);
      timer_.tick("fp8 split stacked gemm");
      return;
    }
    int64_t c0 = 0;
    for (Tensor* y : ys) {
      Tensor yr = y->slice_rows(r0, T);
      fp8_gemm(xq, sx, T, w.slice_rows(c0, y->cols), yr);
      c0 += y->cols;
    }
  });
}

bool GemmDispatch::plan_fp8(int N, int T, int K, cudaDataType_t dt, int align, bool scaled,
                            AlgoEntry& e) {
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&e.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (scaled) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    for (auto attr : {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_DESC_B_SCALE_MODE})
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.op, attr, &mode, sizeof(mode)));
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.a, CUDA_R_8F_E4M3, K, N, K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.b, CUDA_R_8F_E4M3, K, T, K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.d, dt, N, T, N));
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &lt_workspace_size_,
                                                    sizeof(lt_workspace_size_)));
  const uint32_t al = uint32_t(align);
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  // No algorithm is a status (NOT_SUPPORTED) or found == 0, not an error here.
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_, e.op, e.a, e.b, e.d, e.d, pref, 1, &res, &found);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  e.algo = res.algo;
  return true;
}

void GemmDispatch::fp8_gemm(const uint8_t* xq, const float* sx, int64_t T, const Weight& w,
                            Tensor& y) {
  const int N = int(w.rows), K = int(w.cols), Ti = int(T);
  const bool f32_out = y.dtype == DType::F32;
  const cudaDataType_t dt = f32_out ? CUDA_R_32F : CUDA_R_16BF;
  SALA_CHECK(N % 8 == 0, "FP8 GEMM T={} K={} N={}: the output rows need N % 8 == 0 (16 bytes)",
             Ti, K, N);
  const int align = std::min({ptr_alignment(xq), ptr_alignment(w.data), ptr_alignment(y.data),
                              ptr_alignment(sx), ptr_alignment(w.scales)});
  SALA_CHECK(align >= 16,
             "FP8 GEMM T={} K={} N={}: needs 16-byte aligned operands (weight codes {}, scales "
             "{}; output {})",
             Ti, K, N, ptr_alignment(w.data), ptr_alignment(w.scales), ptr_alignment(y.data));
  // Prefill runs (more than 64 rows) and wide stacked decode-step GEMMs of 32..64 rows into
  // bf16: CUTLASS's Hopper kernels with both scales in the epilogue (cuda_gemm_fp8_sm90.cu), no
  // fp32 round trip; they decline off Hopper, for other runs of up to 64 rows (cuBLASLt was
  // faster there) and for shapes they refuse. fp32 logits stay on cuBLASLt.
  if (!f32_out &&
      launch_fp8_scaled_gemm_sm90(xq, sx, static_cast<const uint8_t*>(w.data), w.scales,
                                  ptr<bf16>(y), T, N, K, lt_workspace_, lt_workspace_size_,
                                  stream_)) {
    timer_.tick("fp8 gemm sm90");
    return;
  }
  const float one = 1.f, zero = 0.f;
  auto set_scales = [&](cublasLtMatmulDesc_t op) {
    const void* a_scale = w.scales;  // [N] per output channel
    const void* b_scale = sx;        // [T] per token
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                sizeof(a_scale)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                sizeof(b_scale)));
  };
  const auto key = std::make_tuple(N, Ti, K, int(dt) * 1024 + align);
  auto it = fp8_algos_.find(key);
  bool done = false;  // the first call's scaled GEMM ran (it decides the shape's path)
  if (it == fp8_algos_.end()) {
    Fp8Entry f;
    cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (plan_fp8(N, Ti, K, dt, align, true, f.e)) {
      set_scales(f.e.op);
      st = cublasLtMatmul(lt_, f.e.op, &one, w.data, f.e.a, xq, f.e.b, &zero, y.data, f.e.d,
                          y.data, f.e.d, &f.e.algo, lt_workspace_, lt_workspace_size_, stream_);
    }
    f.outer_vec = done = st == CUBLAS_STATUS_SUCCESS;
    if (!f.outer_vec) {
      cublasLtMatrixLayoutDestroy(f.e.a);
      cublasLtMatrixLayoutDestroy(f.e.b);
      cublasLtMatrixLayoutDestroy(f.e.d);
      cublasLtMatmulDescDestroy(f.e.op);
      f.e = AlgoEntry{};
      SALA_CHECK(plan_fp8(N, Ti, K, CUDA_R_32F, align, false, f.e),
                 "cuBLASLt has no FP8 GEMM for T={} K={} N={} (alignment {}), scaled or not", Ti,
                 K, N, align);
      if (!fp8_fallback_warned_)
        std::fprintf(stderr,
                     "warning: cuda backend: cuBLASLt has no per-token x per-channel scaled FP8 "
                     "GEMM for T=%d K=%d N=%d (%s); such shapes run an fp32-output GEMM and a "
                     "scaling kernel\n",
                     Ti, K, N, cublasLtGetStatusString(st));
      fp8_fallback_warned_ = true;
    }
    it = fp8_algos_.emplace(key, f).first;
  }
  const Fp8Entry& f = it->second;
  if (f.outer_vec && !done) {
    set_scales(f.e.op);
    CUBLAS_CHECK(cublasLtMatmul(lt_, f.e.op, &one, w.data, f.e.a, xq, f.e.b, &zero, y.data, f.e.d,
                                y.data, f.e.d, &f.e.algo, lt_workspace_, lt_workspace_size_,
                                stream_));
  } else if (!f.outer_vec) {
    // fp32 sums [T, N] (in y itself for an fp32 output), then y = sum · sx · sw.
    float* acc = f32_out ? ptr<float>(y) : nullptr;
    if (!acc) {
      const size_t elems = size_t(T) * size_t(N);
      if (elems > fp8_acc_elems_) {
        SALA_CHECK(!graphs_.capturing(),
                   "the FP8 fallback's fp32 buffer would grow to [{}, {}] inside a CUDA-graph "
                   "recording", T, N);
        graphs_.drop();
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        arena_.release(fp8_acc_);
        fp8_acc_ = static_cast<float*>(arena_.device(elems * sizeof(float)));
        fp8_acc_elems_ = elems;
      }
      acc = fp8_acc_;
    }
    CUBLAS_CHECK(cublasLtMatmul(lt_, f.e.op, &one, w.data, f.e.a, xq, f.e.b, &zero, acc, f.e.d,
                                acc, f.e.d, &f.e.algo, lt_workspace_, lt_workspace_size_,
                                stream_));
    if (defer_scales_ && !f32_out) {  // linear_fp8_sums: the caller's kernel scales
      SALA_CHECK(!deferred_.acc, "two FP8 GEMMs of one linear_fp8_sums call deferred scaling");
      deferred_ = {acc, sx, w.scales, ptr<bf16>(y)};
      timer_.tick("fp8 gemm (scales deferred)");
      return;
    }
    launch_fp8_apply_scales(acc, T, N, sx, w.scales, y.data, f32_out, stream_);
  }
  // fp32 output (logits): the bf16 contract rounds the GEMM output to bf16 (SPEC §4.7).
  if (f32_out) launch_round_f32(ptr<float>(y), y.numel(), stream_);
  timer_.tick(f.outer_vec ? "fp8 gemm" : "fp8 gemm + scales");
}

cuda::Fp8Sums GemmDispatch::linear_fp8_sums(const Tensor& x, const Weight& w, Tensor& y) {
  defer_scales_ = bf16_ && is_bf16(y) && one_run(x.rows);
  deferred_ = {};
  linear_fp8(x, w, {&y});
  defer_scales_ = false;
  const cuda::Fp8Sums s = deferred_;
  deferred_ = {};
  return s;
}

}  // namespace sala::cuda_host
