// CUDA backend, op dispatch: embedding, norms, element-wise ops, RoPE, GEMMs (cuBLASLt with
// cached algorithms for many rows, the skinny tensor-core GEMM for <= 16 rows, one GEMM per
// sequence in steps that prefill), logit-row gather and the device argmax.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_argmax.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_host_util.h"
#include "core/check.h"

namespace sala {
using namespace sala::cuda;
using namespace sala::cuda_host;

// ---- ops -----------------------------------------------------------------------------

void CudaBackend::embedding(const Tensor& table, float scale, Tensor& out) {
  const auto& ids = meta_->token_ids;
  SALA_CHECK(out.rows == int64_t(ids.size()) && out.cols == table.cols && is_bf16(out) && is_bf16(table));
  for (int32_t id : ids) SALA_CHECK(id >= 0 && id < table.rows, "token id {} out of range", id);
  launch_embedding(ptr<bf16>(table), sd_.token_ids, out.rows, table.cols, scale, ptr<bf16>(out), stream_);
  tick("embedding");
}

void CudaBackend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  const int64_t n = w.numel();
  SALA_CHECK(x.cols % n == 0 && out.rows == x.rows && out.cols == x.cols);
  SALA_CHECK(is_bf16(x) && is_bf16(w) && is_bf16(out));
  launch_rmsnorm(ptr<bf16>(x), nullptr, 0.f, ptr<bf16>(w), int(n), x.rows * (x.cols / n), eps,
                 ptr<bf16>(out), stream_);
  tick("rmsnorm");
}

void CudaBackend::add_scaled_rmsnorm(Tensor& h, const Tensor& a, float alpha, const Tensor& w,
                                     float eps, Tensor& out) {
  const int64_t n = w.numel();
  SALA_CHECK(h.numel() == a.numel() && h.cols % n == 0 && out.rows == h.rows && out.cols == h.cols);
  SALA_CHECK(is_bf16(h) && is_bf16(a) && is_bf16(w) && is_bf16(out));
  SALA_CHECK(out.data != h.data, "add_scaled_rmsnorm: out must not alias h");
  launch_rmsnorm(ptr<bf16>(h), ptr<bf16>(a), alpha, ptr<bf16>(w), int(n), h.rows * (h.cols / n), eps,
                 ptr<bf16>(out), stream_);
  tick("add_scaled_rmsnorm");
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, Tensor& y) {
  // Batch invariance: cuBLASLt picks its kernel (and so its rounding) from the row count, so
  // in a step that prefills, each sequence's rows are multiplied as they would be alone —
  // rows of sequences longer than kSkinnyRows by one GEMM per sequence, shorter ones
  // (decode rows, short prompts) in groups of ≤ kSkinnyRows through the skinny GEMM, whose
  // rows do not depend on the group. All-decode steps keep one GEMM.
  constexpr int64_t kSkinnyRows = 16;
  const bool prefill_step =
      meta_ && x.rows > kSkinnyRows && x.rows == meta_->num_tokens() && meta_->seqs.size() > 1 &&
      std::any_of(meta_->seqs.begin(), meta_->seqs.end(),
                  [](const SeqSlice& s) { return s.num_tokens > 1; });
  if (!prefill_step) return linear_rows(x, w, y);
  int64_t run_begin = 0, run_rows = 0;
  auto flush = [&] {
    if (run_rows == 0) return;
    Tensor ys = y.slice_rows(run_begin, run_rows);
    linear_rows(x.slice_rows(run_begin, run_rows), w, ys);
    run_rows = 0;
  };
  for (const SeqSlice& s : meta_->seqs) {
    if (s.num_tokens > kSkinnyRows) {
      flush();
      Tensor ys = y.slice_rows(s.token_begin, s.num_tokens);
      linear_rows(x.slice_rows(s.token_begin, s.num_tokens), w, ys);
      continue;
    }
    if (run_rows > 0 && (run_begin + run_rows != s.token_begin || run_rows + s.num_tokens > kSkinnyRows))
      flush();
    if (run_rows == 0) run_begin = s.token_begin;
    run_rows += s.num_tokens;
  }
  flush();
}

void CudaBackend::linear_rows(const Tensor& x, const Tensor& w, Tensor& y) {
  SALA_CHECK(x.cols == w.cols && y.rows == x.rows && y.cols == w.rows,
             "linear shapes x[{},{}] w[{},{}] y[{},{}]", x.rows, x.cols, w.rows, w.cols, y.rows,
             y.cols);
  SALA_CHECK(is_bf16(x) && is_bf16(w) && (is_bf16(y) || y.dtype == DType::F32));
  if (x.rows == 0) return;
  if (gemv_supported(x.data, x.cols, w.data, x.cols, x.rows)) {
    GemvOut o{};
    o.y[0] = y.data;
    o.end[0] = w.rows;
    o.cols[0] = y.cols;
    o.nparts = 1;
    o.f32 = y.dtype == DType::F32;
    launch_gemv(ptr<bf16>(x), x.cols, ptr<bf16>(w), w.rows, int(x.cols), int(x.rows), o, stream_);
    tick(y.dtype == DType::F32 ? "gemv lm_head" : "gemv");
    return;
  }
  // Row-major y[T,N] = x[T,K] W[N,K]^T. Column-major: A = W stored K x N (ld K), used
  // transposed; B = x stored K x T (ld K); D = y stored N x T (ld N).
  const int N = int(w.rows), T = int(x.rows), K = int(x.cols);
  const cudaDataType_t dt = y.dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  const int align = std::min({ptr_alignment(x.data), ptr_alignment(w.data), ptr_alignment(y.data)});
  const auto key = std::make_tuple(N, T, K, int(dt) * 1024 + align);
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    AlgoEntry e;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&e.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.a, CUDA_R_16BF, K, N, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e.b, CUDA_R_16BF, K, T, K));
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
  if (y.dtype == DType::F32) launch_round_f32(ptr<float>(y), y.numel(), stream_);
  tick(y.dtype == DType::F32 ? "gemm lm_head" : "gemm");
}

void CudaBackend::linear_multi(const Tensor& x, const Tensor& w, const std::vector<Tensor*>& ys) {
  int64_t n = 0;
  bool ok = ys.size() <= 4 && gemv_supported(x.data, x.cols, w.data, x.cols, x.rows);
  for (Tensor* y : ys) {
    n += y->cols;
    ok = ok && is_bf16(*y) && y->rows == x.rows;
  }
  SALA_CHECK(n == w.rows && x.cols == w.cols && is_bf16(x) && is_bf16(w),
             "linear_multi: weight [{},{}] for {} output columns", w.rows, w.cols, n);
  if (!ok) return Backend::linear_multi(x, w, ys);  // one GEMM per row slice
  GemvOut o{};
  int64_t end = 0;
  for (size_t i = 0; i < ys.size(); ++i) {
    end += ys[i]->cols;
    o.y[i] = ys[i]->data;
    o.end[i] = end;
    o.cols[i] = ys[i]->cols;
  }
  o.nparts = int(ys.size());
  launch_gemv(ptr<bf16>(x), x.cols, ptr<bf16>(w), w.rows, int(x.cols), int(x.rows), o, stream_);
  tick("gemv multi");
}

void CudaBackend::silu_mul(const Tensor& g, const Tensor& u, Tensor& out) {
  SALA_CHECK(g.numel() == u.numel() && out.numel() == g.numel() && is_bf16(g) && is_bf16(u) && is_bf16(out));
  launch_silu_mul(ptr<bf16>(g), ptr<bf16>(u), ptr<bf16>(out), g.numel(), stream_);
  tick("silu_mul");
}

void CudaBackend::mul_sigmoid(const Tensor& a, const Tensor& gate, Tensor& out) {
  SALA_CHECK(a.numel() == gate.numel() && out.numel() == a.numel() && is_bf16(a) && is_bf16(gate) &&
             is_bf16(out));
  launch_mul_sigmoid(ptr<bf16>(a), ptr<bf16>(gate), ptr<bf16>(out), a.numel(), stream_);
  tick("mul_sigmoid");
}

void CudaBackend::div_scalar(Tensor& x, float d) {
  if (x.dtype == DType::F32) {
    launch_div_scalar_f32(ptr<float>(x), d, x.numel(), stream_);
  } else {
    SALA_CHECK(is_bf16(x));
    launch_div_scalar(ptr<bf16>(x), d, x.numel(), stream_);
  }
  tick("div_scalar");
}

const float* CudaBackend::inv_freq(int head_dim, double theta) {
  auto it = inv_freq_.find({head_dim, theta});
  if (it == inv_freq_.end()) {
    // Not the model's own table (tests): build it once, as init_caches does.
    SALA_CHECK(!capturing_, "RoPE table built while recording a step");
    it = inv_freq_.emplace(std::make_pair(head_dim, theta), make_inv_freq(head_dim, theta)).first;
  }
  return it->second;
}

void CudaBackend::rope(Tensor& x, int head_dim, double theta) {
  SALA_CHECK(is_bf16(x) && head_dim % 2 == 0 && x.cols % head_dim == 0 && x.rows <= sd_.T);
  if (x.rows == 0) return;
  launch_rope(ptr<bf16>(x), x.rows, x.cols, head_dim, sd_.positions, inv_freq(head_dim, theta), stream_);
  tick("rope");
}

void CudaBackend::qk_norm_rope(Tensor& q, Tensor& k, const Tensor& qn, const Tensor& kn, float eps,
                               int head_dim, double theta) {
  SALA_CHECK(is_bf16(q) && is_bf16(k) && is_bf16(qn) && is_bf16(kn) && head_dim % 2 == 0);
  SALA_CHECK(q.rows == k.rows && q.cols == k.cols && q.cols % head_dim == 0 && q.rows <= sd_.T &&
             qn.numel() == head_dim && kn.numel() == head_dim);
  if (q.rows == 0) return;
  launch_qk_norm_rope(ptr<bf16>(q), ptr<bf16>(k), ptr<bf16>(qn), ptr<bf16>(kn), q.rows, q.cols,
                      head_dim, eps, sd_.positions, inv_freq(head_dim, theta), stream_);
  tick("qk_norm_rope");
}

void CudaBackend::gather_logit_rows(const Tensor& x, Tensor& out) {
  const int R = sd_.R;
  SALA_CHECK(out.rows >= R && out.cols == x.cols && out.dtype == x.dtype);
  launch_gather_rows(x.data, x.cols, int(dtype_size(x.dtype)), sd_.logit_rows, R, out.data, stream_);
  tick("gather_logit_rows");
}

void CudaBackend::argmax_rows(const Tensor& logits, int32_t* out) {
  SALA_CHECK(logits.dtype == DType::F32, "argmax_rows of {}", dtype_name(logits.dtype));
  if (logits.rows == 0) return;
  if (logits.rows > argmax_cap_) {  // grows to max_logit_rows once, at the first steps
    if (argmax_host_) CUDA_CHECK(cudaFreeHost(argmax_host_));
    argmax_cap_ = std::max<int64_t>(logits.rows, 64);
    argmax_dev_ = static_cast<int32_t*>(dev_alloc(size_t(argmax_cap_) * 4));
    CUDA_CHECK(cudaMallocHost(&argmax_host_, size_t(argmax_cap_) * 4));
  }
  cuda::launch_argmax_rows(ptr<float>(logits), logits.rows, logits.cols, argmax_dev_, stream_);
  CUDA_CHECK(cudaMemcpyAsync(argmax_host_, argmax_dev_, size_t(logits.rows) * 4,
                             cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(out, argmax_host_, size_t(logits.rows) * 4);
  tick("argmax_rows");
}

}  // namespace sala
