#include "backend/cuda/cuda_gemm.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_host_util.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_skinny_sm90.h"
#include "core/check.h"

namespace sala::cuda_host {
using namespace sala::cuda;

GemmDispatch::GemmDispatch(bool bf16_mode, cudaStream_t stream, DeviceArena& arena,
                           const StepPlan& plan, GraphCache& graphs, OpTimer& timer,
                           bool int4_prefill_gemm)
    : bf16_(bf16_mode), stream_(stream), arena_(arena), plan_(plan), graphs_(graphs),
      timer_(timer) {
  gemv_init();  // kernel attributes now, not inside a recorded step
  gemv_fp8_init();
  gemv_int4_init();
  skinny_ok_ = bf16_ && skinny_sm90_available();
  if (skinny_ok_) {
    skinny_sm90_init();
    skinny_int4_sm90_init();
    skinny_ws_ = arena_.device(skinny_sm90_workspace_bytes());
    CUDA_CHECK(cudaMemset(skinny_ws_, 0, skinny_sm90_workspace_bytes()));
  }
  int4_sm90_ok_ = skinny_ok_ && int4_prefill_gemm;  // skinny_ok_: bf16 mode on sm_90
  tail_sync_ = static_cast<unsigned*>(arena_.device(2 * sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(tail_sync_, 0, 2 * sizeof(unsigned)));
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  lt_workspace_ = arena_.device(lt_workspace_size_);
}

GemmDispatch::~GemmDispatch() {
  auto destroy = [](AlgoEntry& e) {
    cublasLtMatrixLayoutDestroy(e.a);
    cublasLtMatrixLayoutDestroy(e.b);
    cublasLtMatrixLayoutDestroy(e.d);
    cublasLtMatmulDescDestroy(e.op);
  };
  for (auto& [key, e] : algos_) destroy(e);
  for (auto& [key, f] : fp8_algos_) destroy(f.e);
  if (lt_) cublasLtDestroy(lt_);
}

void GemmDispatch::plan_stack_workspace(const ModelConfig& cfg) {
  // The stacked GEMM's output for the widest stacked weight at kStackMaxRows rows: gate_up
  // [2 I, H], or q/k/v/gate (≤ 4 H columns for the released shapes; a wider weight grows it
  // on first use, outside recordings: stacked_gemm).
  if (stack_ws_) return;
  const int64_t widest =
      std::max<int64_t>(2 * int64_t(cfg.intermediate_size), 4 * int64_t(cfg.hidden_size));
  stack_ws_elems_ = kStackMaxRows * widest;
  stack_ws_ = arena_.device(size_t(stack_ws_elems_) * 2);
}

void GemmDispatch::linear(const Tensor& x, const Weight& wt, Tensor& y) {
  if (wt.format == WeightFormat::FP8_E4M3) return linear_fp8(x, wt, {&y});
  fp8_prepared_ = {};  // FP8 codes prepared for x serve FP8 GEMMs only
  if (wt.format == WeightFormat::INT4_GROUPED) return linear_int4(x, wt, {&y});
  const Tensor w = dense_view(wt);  // bf16 / fp32 [N, K]
  for_each_run(x.rows, [&](int64_t r0, int64_t n) {
    Tensor ys = y.slice_rows(r0, n);
    linear_rows(x.slice_rows(r0, n), w, ys);
  });
}

bool GemmDispatch::linear_norm(const Tensor& x, const Weight& wt, Tensor& y,
                               const std::function<GemvRowTail()>& tail) {
  const int64_t T = x.rows, K = x.cols;
  if (!bf16_ || T < 1 || T > kGemvRowTailRows || !is_bf16(x) || !is_bf16(y) || y.rows != T ||
      y.cols != wt.rows || K != wt.cols || !gemv_norm_tail_fits(wt.rows) || !one_run(T) ||
      !gemv_rows(T) || skinny_step_rows(T))
    return false;
  GemvOut o = gemv_parts({&y});
  if (wt.format == WeightFormat::FP8_E4M3) {
    if (!(wt.scales && wt.group == wt.cols && K % 16 == 0 && gemv_fp8_supported(wt.data, K, T) &&
          gemv_fp8_row_tail_supported()))
      return false;
    // As linear_fp8's GEMV run: x's codes from its producer, else quantized here.
    const bool prepared = take_fp8_prepared(x);
    const Fp8Input in = fp8_input(T, K);
    if (!prepared) launch_quantize_rows_fp8(ptr<bf16>(x), T, K, K, in.codes, in.scales, stream_);
    // The tail may write out's codes where x's are (the workspace's start): only after every
    // CTA has finished its tiles, so after every read of x's.
    o.tail = tail();
    o.tail.sync = tail_sync_;
    launch_gemv_fp8(in.codes, K, in.scales, static_cast<const uint8_t*>(wt.data), wt.scales,
                    wt.rows, int(K), int(T), o, stream_);
    timer_.tick("gemv fp8 + add_scaled_rmsnorm");
    return true;
  }
  if (wt.format != WeightFormat::BF16 ||
      !gemv_supported(x.data, K, wt.data, K, T) || !gemv_row_tail_supported())
    return false;
  fp8_prepared_ = {};  // as linear: prepared codes serve FP8 GEMMs only
  o.tail = tail();
  o.tail.sync = tail_sync_;
  launch_gemv(ptr<bf16>(x), K, static_cast<const bf16*>(wt.data), wt.rows, int(K), int(T), o,
              stream_);
  timer_.tick("gemv + add_scaled_rmsnorm");
  return true;
}

// Batch invariance: cuBLASLt picks its kernel (and so its rounding) from the row count, so in a
// step that prefills, each sequence's rows are multiplied as they would be alone — rows of
// sequences longer than kSkinnyRows by one GEMM per sequence, shorter ones (verify rows, short
// prompts) in groups of ≤ kSkinnyRows (kGemvMaxRows in bf16 mode, 16 in fp32 mode, which has
// no skinny GEMM) through the skinny GEMM, whose rows do not depend on the group (one pass
// over the weights per group). All-decode steps keep one GEMM.
bool GemmDispatch::one_run(int64_t rows) const {
  int runs = 0;
  bool all = false;
  for_each_run(rows, [&](int64_t r0, int64_t n) { ++runs, all = r0 == 0 && n == rows; });
  return runs == 1 && all;
}

void GemmDispatch::for_each_run(int64_t rows,
                                const std::function<void(int64_t, int64_t)>& f) const {
  const int64_t kSkinnyRows = bf16_ ? kGemvMaxRows : 16;
  const StepMeta* meta = plan_.meta();
  const bool prefill_step =
      meta && rows > kSkinnyRows && rows == meta->num_tokens() && meta->seqs.size() > 1 &&
      std::any_of(meta->seqs.begin(), meta->seqs.end(),
                  [](const SeqSlice& s) { return s.num_tokens > 1; });
  if (!prefill_step) return f(0, rows);
  int64_t run_begin = 0, run_rows = 0;
  auto flush = [&] {
    if (run_rows == 0) return;
    f(run_begin, run_rows);
    run_rows = 0;
  };
  for (const SeqSlice& s : meta->seqs) {
    if (s.num_tokens > kSkinnyRows) {
      flush();
      f(s.token_begin, s.num_tokens);
      continue;
    }
    if (run_rows > 0 &&
        (run_begin + run_rows != s.token_begin || run_rows + s.num_tokens > kSkinnyRows))
      flush();
    if (run_rows == 0) run_begin = s.token_begin;
    run_rows += s.num_tokens;
  }
  flush();
}

GemvOut GemmDispatch::gemv_parts(const std::vector<Tensor*>& ys, int64_t r0) {
  SALA_CHECK(!ys.empty() && ys.size() <= 4, "{} GEMV outputs (1..4)", ys.size());
  GemvOut o{};
  int64_t end = 0;
  for (size_t i = 0; i < ys.size(); ++i) {
    end += ys[i]->cols;
    o.y[i] = static_cast<char*>(ys[i]->data) + r0 * ys[i]->cols * int64_t(dtype_size(ys[i]->dtype));
    o.end[i] = end;
    o.cols[i] = ys[i]->cols;
  }
  o.nparts = int(ys.size());
  o.f32 = ys[0]->dtype == DType::F32;
  return o;
}

GemvOut GemmDispatch::gemv_silu_pair(Tensor& g) {
  GemvOut o{};
  o.y[0] = g.data;
  o.end[0] = 2 * g.cols;
  o.cols[0] = g.cols;
  o.nparts = 1;
  o.silu_pair = true;
  return o;
}

void GemmDispatch::linear_rows(const Tensor& x, const Tensor& w, Tensor& y) {
  SALA_CHECK(x.cols == w.cols && y.rows == x.rows && y.cols == w.rows,
             "linear shapes x[{},{}] w[{},{}] y[{},{}]", x.rows, x.cols, w.rows, w.cols, y.rows,
             y.cols);
  SALA_CHECK(is_act(x) && is_act(w) && (is_act(y) || y.dtype == DType::F32));
  if (x.rows == 0) return;
  if (skinny_step_rows(x.rows) && is_act(w) &&
      skinny_sm90_supported(x.data, x.cols, w.data, x.cols, x.rows)) {
    Tensor yv = y;
    launch_skinny_sm90(ptr<bf16>(x), x.cols, ptr<bf16>(w), w.rows, int(x.cols), int(x.rows),
                       gemv_parts({&yv}), skinny_ws_, stream_);
    timer_.tick(y.dtype == DType::F32 ? "skinny lm_head" : "skinny gemm");
    return;
  }
  if (bf16_ && gemv_rows(x.rows) && gemv_supported(x.data, x.cols, w.data, x.cols, x.rows)) {
    Tensor yv = y;
    const GemvOut o = gemv_parts({&yv});
    launch_gemv(ptr<bf16>(x), x.cols, ptr<bf16>(w), w.rows, int(x.cols), int(x.rows), o, stream_);
    timer_.tick(y.dtype == DType::F32 ? "gemv lm_head" : "gemv");
    return;
  }
  // Row-major y[T,N] = x[T,K] W[N,K]^T. Column-major: A = W stored K x N (ld K), used
  // transposed; B = x stored K x T (ld K); D = y stored N x T (ld N).
  const int N = int(w.rows), T = int(x.rows), K = int(x.cols);
  // fp32 mode: fp32 A, B, D and CUBLAS_COMPUTE_32F, which is full fp32 arithmetic (TF32 only
  // with CUBLAS_COMPUTE_32F_FAST_TF32, never requested).
  const cudaDataType_t dt = y.dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  const cudaDataType_t in_t = bf16_ ? CUDA_R_16BF : CUDA_R_32F;
  const int align = std::min({ptr_alignment(x.data), ptr_alignment(w.data), ptr_alignment(y.data)});
  const auto key = std::make_tuple(N, T, K, (int(in_t) * 64 + int(dt)) * 1024 + align);
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    AlgoEntry e;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&e.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.a, in_t, K, N, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.b, in_t, K, T, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.d, dt, N, T, N));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt_workspace_size_, sizeof(lt_workspace_size_)));
    const uint32_t al = uint32_t(align);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, e.op, e.a, e.b, e.d, e.d, pref, 1, &res, &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    SALA_CHECK(found > 0, "cuBLASLt has no algorithm for N={} T={} K={} align {}", N, T, K, align);
    e.algo = res.algo;
    it = algos_.emplace(key, e).first;
  }
  const float one = 1.f, zero = 0.f;
  const AlgoEntry& e = it->second;
  CUBLAS_CHECK(cublasLtMatmul(lt_, e.op, &one, w.data, e.a, x.data, e.b, &zero, y.data, e.d, y.data,
                              e.d, &e.algo, lt_workspace_, lt_workspace_size_, stream_));
  // fp32 output (logits): the bf16 contract rounds the GEMM output to bf16 (SPEC §4.7).
  if (bf16_ && y.dtype == DType::F32) launch_round_f32(ptr<float>(y), y.numel(), stream_);
  timer_.tick(y.dtype == DType::F32 ? "gemm lm_head" : "gemm");
}

bool GemmDispatch::decode_only_step() const {
  const StepDev& sd = plan_.dev();
  return plan_.meta() && sd.S > 0 && sd.n_one_token == sd.S;
}

// The skinny GEMM costs 1.6x (32 rows) to 2.9x (64 rows) its one-row time on the H200
// (CudaOps.GemvSpeed), while cuBLASLt streams a 17..64-row decode step's weights faster: decode
// steps of more than kDecodeGemvRows rows take cuBLASLt (stacked_gemm). Verify and prefill
// runs of up to kGemvMaxRows rows keep the GEMV: one pass instead of one per 16 rows, and
// every row the bits of a decode row.
bool GemmDispatch::gemv_rows(int64_t rows) const {
  return rows <= kDecodeGemvRows || (rows <= kGemvMaxRows && !decode_only_step());
}

// The Hopper skinny GEMM streams a 17..64-row verify step's weights in about its one-row time
// (H200, session 20: 16384 x 4096 at 40 rows 46 µs, the GEMV 73; a B=8 K=4 verify step of
// the 9B 7.72 ms instead of 10.98; FP8 weights, session 21: 6.51 instead of 9.53); at <= 16
// rows the GEMV stays (up to 2 µs faster on small shapes, and the bits of every decode step
// of <= 16 rows). Decode-only steps of 17..64 rows keep cuBLASLt (B=64: 8.88 ms per step,
// 9.36 with the skinny GEMM; FP8 7.28, 8.43). Steps with prompt chunks
// keep the GEMV runs, whose rows equal the rows alone (batch invariance of prefill).
bool GemmDispatch::skinny_step_rows(int64_t rows) const {
  return skinny_ok_ && rows > kDecodeGemvRows && rows <= kStackMaxRows && plan_.meta() &&
         plan_.dev().S > 0 && plan_.dev().prompt_free && !decode_only_step();
}

// Decode-only steps of 17..kStackMaxRows rows: a stacked weight's outputs come from one GEMM
// instead of one per output (cuBLAS kernels take no part in PDL, so every call costs a launch
// gap; an FP8 part of 256 or 4096 columns also spreads over too few SMs). Not in steps that
// prefill: there each sequence's rows are multiplied as they would be alone (linear). True when
// x's rows qualify and the workspace holds [x.rows, n].
bool GemmDispatch::stack_fits(const Tensor& x, int64_t n) {
  if (!(bf16_ && decode_only_step() && x.rows > kDecodeGemvRows && x.rows <= kStackMaxRows &&
        is_act(x)))
    return false;
  if (x.rows * n <= stack_ws_elems_) return true;
  // Wider than plan_stack_workspace planned (not the released shapes): grow, outside
  // recordings only (a recorded step's shapes ran eagerly first, so it never lands here).
  if (graphs_.capturing()) return false;
  graphs_.drop();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  arena_.release(stack_ws_);
  stack_ws_elems_ = kStackMaxRows * n;
  stack_ws_ = arena_.device(size_t(stack_ws_elems_) * 2);
  return true;
}

// bf16 weights: the stacked GEMM is cuBLASLt's (linear_rows).
bool GemmDispatch::stacked_gemm(const Tensor& x, const Tensor& w) {
  return is_act(w) && x.cols == w.cols && stack_fits(x, w.rows);
}

bool GemmDispatch::linear_multi(const Tensor& x, const Weight& wt, const std::vector<Tensor*>& ys) {
  if (wt.format == WeightFormat::FP8_E4M3) {  // one quantization of x for all parts
    linear_fp8(x, wt, ys);
    return true;
  }
  fp8_prepared_ = {};
  if (wt.format == WeightFormat::INT4_GROUPED) {  // one GEMV (or one dequantization per part)
    linear_int4(x, wt, ys);
    return true;
  }
  const Tensor w = dense_view(wt);  // bf16 / fp32 [N, K]
  int64_t n = 0;
  // fp32 mode: one cuBLASLt GEMM per part (the skinny GEMM is bf16 only).
  bool parts_ok = bf16_ && ys.size() <= 4;  // bf16 parts GemvOut can hold
  for (Tensor* y : ys) {
    n += y->cols;
    parts_ok = parts_ok && is_bf16(*y) && y->rows == x.rows;
  }
  SALA_CHECK(n == w.rows && x.cols == w.cols && is_act(x) && is_act(w),
             "linear_multi: weight [{},{}] for {} output columns", w.rows, w.cols, n);
  if (parts_ok && skinny_step_rows(x.rows) &&
      skinny_sm90_supported(x.data, x.cols, w.data, x.cols, x.rows)) {
    launch_skinny_sm90(ptr<bf16>(x), x.cols, ptr<bf16>(w), w.rows, int(x.cols), int(x.rows),
                       gemv_parts(ys), skinny_ws_, stream_);
    timer_.tick("skinny gemm multi");
    return true;
  }
  const bool ok = parts_ok && gemv_rows(x.rows) && gemv_supported(x.data, x.cols, w.data, x.cols, x.rows);
  const bool stacked = !ok && parts_ok && stacked_gemm(x, w);
  if (!ok && !stacked) return false;  // one GEMM per row slice
  const GemvOut o = gemv_parts(ys);
  if (stacked) {
    Tensor ws{stack_ws_, DType::BF16, x.rows, w.rows};
    linear_rows(x, w, ws);
    launch_split_cols(ptr<bf16>(ws), x.rows, w.rows, o, stream_);
    timer_.tick("split stacked gemm");
    return true;
  }
  launch_gemv(ptr<bf16>(x), x.cols, ptr<bf16>(w), w.rows, int(x.cols), int(x.rows), o, stream_);
  timer_.tick("gemv multi");
  return true;
}

// Skinny steps: one GEMV whose CTAs take a gate tile and then the up tile of the same
// columns and store only silu(g) * u (cuda_gemv.cu, GemvOut::silu_pair): one kernel less per
// layer and the same bits as the two-op default. Stacked steps: the SiLU product of the
// stacked GEMM's halves.
bool GemmDispatch::linear_silu_mul(const Tensor& x, const Weight& wt, Tensor& g, Tensor& /*u*/,
                                   const std::function<cuda::Fp8Act()>& codes) {
  // FP8: ≤ 16 rows, the FP8 GEMV's silu_pair epilogue (one kernel); decode-only steps of
  // 17..64 rows, one GEMM over both halves and their SiLU product (with g's codes for the
  // next GEMM when `codes` prepares them: no quantize kernel before it); otherwise Backend's
  // composition, linear_multi (one quantization, a GEMM per half) then silu_mul. Codes that
  // x's producer wrote (prepare_fp8_input) are used here, or kept for that linear_multi.
  if (wt.format == WeightFormat::FP8_E4M3) {
    const bool shaped = bf16_ && is_bf16(g) && g.rows == x.rows && wt.rows == 2 * g.cols &&
                        is_act(x) && x.cols == wt.cols;
    if (shaped && !gemv_rows(x.rows) && stack_fits(x, wt.rows)) {
      const bool prepared = take_fp8_prepared(x);
      const Fp8Input in = fp8_input(x.rows, x.cols);
      if (!prepared)
        launch_quantize_rows_fp8(ptr<bf16>(x), x.rows, x.cols, x.cols, in.codes, in.scales,
                                 stream_);
      Tensor ws{stack_ws_, DType::BF16, x.rows, wt.rows};
      fp8_gemm(in.codes, in.scales, x.rows, wt, ws);
      if (const cuda::Fp8Act q = codes ? codes() : cuda::Fp8Act{}; q.codes) {
        launch_silu_mul_halves_fp8(ptr<bf16>(ws), x.rows, g.cols, ptr<bf16>(g), q, stream_);
        timer_.tick("fp8 silu_mul halves + fp8 codes");
        return true;
      }
      launch_silu_mul_halves(ptr<bf16>(ws), x.rows, g.cols, ptr<bf16>(g), stream_);
      timer_.tick("fp8 silu_mul halves");
      return true;
    }
    if (shaped && skinny_step_rows(x.rows)) {  // speculative steps of 17..64 rows on Hopper
      const Fp8Input in = fp8_input(x.rows, x.cols);
      if (!skinny_fp8_sm90_supported(in.codes, x.cols, wt.data, x.cols, x.rows)) return false;
      const bool prepared = take_fp8_prepared(x);
      if (!prepared)
        launch_quantize_rows_fp8(ptr<bf16>(x), x.rows, x.cols, x.cols, in.codes, in.scales,
                                 stream_);
      launch_skinny_fp8_sm90(in.codes, x.cols, in.scales, static_cast<const uint8_t*>(wt.data),
                             wt.scales, wt.rows, int(x.cols), int(x.rows), gemv_silu_pair(g),
                             skinny_ws_, stream_);
      timer_.tick("skinny fp8 gate_up+silu");
      return true;
    }
    if (!(shaped && gemv_rows(x.rows) && gemv_fp8_silu_pair_supported(wt.rows) &&
          gemv_fp8_supported(wt.data, x.cols, x.rows)))
      return false;
    const GemvOut o = gemv_silu_pair(g);
    const bool prepared = take_fp8_prepared(x);
    const Fp8Input in = fp8_input(x.rows, x.cols);  // x quantized once, as in linear_fp8
    if (!prepared)
      launch_quantize_rows_fp8(ptr<bf16>(x), x.rows, x.cols, x.cols, in.codes, in.scales, stream_);
    launch_gemv_fp8(in.codes, x.cols, in.scales, static_cast<const uint8_t*>(wt.data), wt.scales,
                    wt.rows, int(x.cols), int(x.rows), o, stream_);
    timer_.tick("gemv fp8 gate_up+silu");
    return true;
  }
  fp8_prepared_ = {};
  // W4A16: the int4 GEMV's silu_pair epilogue where the GEMV takes the rows; otherwise
  // Backend's composition (linear_multi: one dequantization per half, then silu_mul).
  if (wt.format == WeightFormat::INT4_GROUPED) {
    if (!(is_bf16(g) && g.rows == x.rows && wt.rows == 2 * g.cols)) return false;
    if (int4_skinny_ok(x, wt, {&g})) {
      launch_skinny_int4_sm90(ptr<bf16>(x), x.cols, static_cast<const uint32_t*>(wt.data),
                              wt.scales, wt.rows, int(x.cols), wt.group, int(x.rows),
                              gemv_silu_pair(g), skinny_ws_, stream_);
      timer_.tick("skinny int4 gate_up+silu");
      return true;
    }
    if (!(gemv_int4_silu_pair_supported(wt.rows) && int4_gemv_ok(x, wt, {&g}))) return false;
    launch_gemv_int4(ptr<bf16>(x), x.cols, static_cast<const uint32_t*>(wt.data), wt.scales,
                     wt.rows, int(x.cols), wt.group, int(x.rows), gemv_silu_pair(g), stream_);
    timer_.tick("gemv int4 gate_up+silu");
    return true;
  }
  const Tensor w = dense_view(wt);  // bf16 / fp32 [N, K]
  if (bf16_ && is_bf16(g) && g.rows == x.rows && w.rows == 2 * g.cols && x.cols == w.cols &&
      is_act(x) && is_act(w) && skinny_step_rows(x.rows) &&
      skinny_sm90_supported(x.data, x.cols, w.data, x.cols, x.rows)) {
    launch_skinny_sm90(ptr<bf16>(x), x.cols, ptr<bf16>(w), w.rows, int(x.cols), int(x.rows),
                       gemv_silu_pair(g), skinny_ws_, stream_);
    timer_.tick("skinny gate_up+silu");
    return true;
  }
  const bool fused = bf16_ && is_bf16(g) && g.rows == x.rows && w.rows == 2 * g.cols &&
                     x.cols == w.cols && is_act(x) && is_act(w) &&
                     gemv_silu_pair_supported(w.rows) && gemv_rows(x.rows) &&
                     gemv_supported(x.data, x.cols, w.data, x.cols, x.rows);
  if (!fused && stacked_gemm(x, w) && is_bf16(g) && g.rows == x.rows && w.rows == 2 * g.cols) {
    Tensor ws{stack_ws_, DType::BF16, x.rows, w.rows};
    linear_rows(x, w, ws);
    launch_silu_mul_halves(ptr<bf16>(ws), x.rows, g.cols, ptr<bf16>(g), stream_);
    timer_.tick("silu_mul halves");
    return true;
  }
  if (!fused) return false;
  const GemvOut o = gemv_silu_pair(g);
  launch_gemv(ptr<bf16>(x), x.cols, ptr<bf16>(w), w.rows, int(x.cols), int(x.rows), o, stream_);
  timer_.tick("gemv gate_up+silu");
  return true;
}

}  // namespace sala::cuda_host
