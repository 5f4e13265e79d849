// CUDA backend, op dispatch: embedding, norms, element-wise ops, RoPE, GEMMs (cuBLASLt with
// cached algorithms for many rows, the skinny tensor-core GEMM for <= 16 rows, one GEMM per
// sequence in steps that prefill), logit-row gather and the device argmax. Activations are
// bf16 in bf16 mode and fp32 in fp32 mode (the kernels' T; with_act_type picks it); fp32
// mode's GEMMs are true-fp32 cuBLASLt (CUBLAS_COMPUTE_32F on fp32 operands, no TF32, no GEMV).
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
  SALA_CHECK(out.rows == int64_t(ids.size()) && out.cols == table.cols && is_act(out) && is_act(table));
  for (int32_t id : ids) SALA_CHECK(id >= 0 && id < table.rows, "token id {} out of range", id);
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_embedding(ptr<T>(table), sd_.token_ids, out.rows, table.cols, scale, ptr<T>(out), stream_);
  });
  tick("embedding");
}

void CudaBackend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  const int64_t n = w.numel();
  SALA_CHECK(x.cols % n == 0 && out.rows == x.rows && out.cols == x.cols);
  SALA_CHECK(is_act(x) && is_act(w) && is_act(out));
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_rmsnorm<T>(ptr<T>(x), nullptr, 0.f, ptr<T>(w), int(n), x.rows * (x.cols / n), eps,
                      ptr<T>(out), stream_);
  });
  tick("rmsnorm");
}

void CudaBackend::add_scaled_rmsnorm(Tensor& h, const Tensor& a, float alpha, const Tensor& w,
                                     float eps, Tensor& out) {
  const int64_t n = w.numel();
  SALA_CHECK(h.numel() == a.numel() && h.cols % n == 0 && out.rows == h.rows && out.cols == h.cols);
  SALA_CHECK(is_act(h) && is_act(a) && is_act(w) && is_act(out));
  SALA_CHECK(out.data != h.data, "add_scaled_rmsnorm: out must not alias h");
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_rmsnorm<T>(ptr<T>(h), ptr<T>(a), alpha, ptr<T>(w), int(n), h.rows * (h.cols / n), eps,
                      ptr<T>(out), stream_);
  });
  tick("add_scaled_rmsnorm");
}

void CudaBackend::linear(const Tensor& x, const Weight& wt, Tensor& y) {
  const Tensor w = dense_view(wt);  // bf16 / fp32 [N, K]
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
  SALA_CHECK(is_act(x) && is_act(w) && (is_act(y) || y.dtype == DType::F32));
  if (x.rows == 0) return;
  if (bf16_mode_ && gemv_supported(x.data, x.cols, w.data, x.cols, x.rows)) {
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
  // fp32 mode: fp32 A, B, D and CUBLAS_COMPUTE_32F, which is full fp32 arithmetic (TF32 only
  // with CUBLAS_COMPUTE_32F_FAST_TF32, never requested).
  const cudaDataType_t dt = y.dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  const cudaDataType_t in_t = bf16_mode_ ? CUDA_R_16BF : CUDA_R_32F;
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
  if (bf16_mode_ && y.dtype == DType::F32) launch_round_f32(ptr<float>(y), y.numel(), stream_);
  tick(y.dtype == DType::F32 ? "gemm lm_head" : "gemm");
}

// Decode-only steps of 17..kStackMaxRows rows (bf16): a stacked weight's outputs come from one
// cuBLASLt GEMM instead of one per output (cuBLAS kernels take no part in PDL, so every call
// costs a launch gap; the k / v GEMMs of a sparse layer are 2 MB each). Not in steps that
// prefill: there each sequence's rows are multiplied as they would be alone (linear).
bool CudaBackend::stacked_gemm(const Tensor& x, const Tensor& w) {
  if (!(bf16_mode_ && !unfuse_stack_ && meta_ && sd_.S > 0 && sd_.n_one_token == sd_.S &&
        x.rows > kGemvMaxRows && x.rows <= kStackMaxRows && is_act(x) && is_act(w) &&
        x.cols == w.cols))
    return false;
  if (x.rows * w.rows <= stack_ws_elems_) return true;
  // Wider than init_caches planned (not the released shapes): grow, outside recordings only
  // (a recorded step's shapes ran eagerly first, so it never lands here).
  if (capturing_) return false;
  drop_graphs();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (stack_ws_) {
    CUDA_CHECK(cudaFree(stack_ws_));
    auto& a = allocations_;
    a.erase(std::remove(a.begin(), a.end(), stack_ws_), a.end());
  }
  stack_ws_elems_ = kStackMaxRows * w.rows;
  stack_ws_ = dev_alloc(size_t(stack_ws_elems_) * 2);
  return true;
}

void CudaBackend::linear_multi(const Tensor& x, const Weight& wt, const std::vector<Tensor*>& ys) {
  const Tensor w = dense_view(wt);  // bf16 / fp32 [N, K]
  int64_t n = 0;
  // fp32 mode: one cuBLASLt GEMM per part (the skinny GEMM is bf16 only).
  bool parts_ok = bf16_mode_ && ys.size() <= 4;  // bf16 parts GemvOut can hold
  for (Tensor* y : ys) {
    n += y->cols;
    parts_ok = parts_ok && is_bf16(*y) && y->rows == x.rows;
  }
  SALA_CHECK(n == w.rows && x.cols == w.cols && is_act(x) && is_act(w),
             "linear_multi: weight [{},{}] for {} output columns", w.rows, w.cols, n);
  const bool ok = parts_ok && gemv_supported(x.data, x.cols, w.data, x.cols, x.rows);
  const bool stacked = !ok && parts_ok && stacked_gemm(x, w);
  if (!ok && !stacked) return Backend::linear_multi(x, w, ys);  // one GEMM per row slice
  GemvOut o{};
  int64_t end = 0;
  for (size_t i = 0; i < ys.size(); ++i) {
    end += ys[i]->cols;
    o.y[i] = ys[i]->data;
    o.end[i] = end;
    o.cols[i] = ys[i]->cols;
  }
  o.nparts = int(ys.size());
  if (stacked) {
    Tensor ws{stack_ws_, DType::BF16, x.rows, w.rows};
    linear_rows(x, w, ws);
    launch_split_cols(ptr<bf16>(ws), x.rows, w.rows, o, stream_);
    tick("split stacked gemm");
    return;
  }
  launch_gemv(ptr<bf16>(x), x.cols, ptr<bf16>(w), w.rows, int(x.cols), int(x.rows), o, stream_);
  tick("gemv multi");
}

// Skinny steps: one GEMV whose CTAs take a gate tile and then the up tile of the same
// columns and store only silu(g) * u (cuda_gemv.cu, GemvOut::silu_pair): one kernel less per
// layer and the same bits as the two-op default.
void CudaBackend::linear_silu_mul(const Tensor& x, const Weight& wt, Tensor& g, Tensor& u) {
  const Tensor w = dense_view(wt);  // bf16 / fp32 [N, K]
  const bool fused = !unfuse_silu_ && bf16_mode_ && is_bf16(g) && g.rows == x.rows && w.rows == 2 * g.cols &&
                     x.cols == w.cols && is_act(x) && is_act(w) &&
                     gemv_silu_pair_supported(w.rows) &&
                     gemv_supported(x.data, x.cols, w.data, x.cols, x.rows);
  if (!fused && !unfuse_silu_ && stacked_gemm(x, w) && is_bf16(g) && g.rows == x.rows &&
      w.rows == 2 * g.cols) {
    Tensor ws{stack_ws_, DType::BF16, x.rows, w.rows};
    linear_rows(x, w, ws);
    launch_silu_mul_halves(ptr<bf16>(ws), x.rows, g.cols, ptr<bf16>(g), stream_);
    tick("silu_mul halves");
    return;
  }
  if (!fused) return Backend::linear_silu_mul(x, w, g, u);
  GemvOut o{};
  o.y[0] = g.data;
  o.end[0] = w.rows;
  o.cols[0] = g.cols;
  o.nparts = 1;
  o.silu_pair = true;
  launch_gemv(ptr<bf16>(x), x.cols, ptr<bf16>(w), w.rows, int(x.cols), int(x.rows), o, stream_);
  tick("gemv gate_up+silu");
}

void CudaBackend::silu_mul(const Tensor& g, const Tensor& u, Tensor& out) {
  SALA_CHECK(g.numel() == u.numel() && out.numel() == g.numel() && is_act(g) && is_act(u) && is_act(out));
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_silu_mul<T>(ptr<T>(g), ptr<T>(u), ptr<T>(out), g.numel(), stream_);
  });
  tick("silu_mul");
}

void CudaBackend::mul_sigmoid(const Tensor& a, const Tensor& gate, Tensor& out) {
  SALA_CHECK(a.numel() == gate.numel() && out.numel() == a.numel() && is_act(a) && is_act(gate) &&
             is_act(out));
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_mul_sigmoid<T>(ptr<T>(a), ptr<T>(gate), ptr<T>(out), a.numel(), stream_);
  });
  tick("mul_sigmoid");
}

void CudaBackend::rmsnorm_mul_sigmoid(const Tensor& a, const Tensor& w, float eps,
                                      const Tensor& gate, Tensor& out) {
  const int64_t n = w.numel();
  SALA_CHECK(a.cols % n == 0 && out.rows == a.rows && out.cols == a.cols &&
             gate.numel() == a.numel());
  SALA_CHECK(is_act(a) && is_act(w) && is_act(gate) && is_act(out));
  SALA_CHECK(gate.data != out.data, "rmsnorm_mul_sigmoid: gate must not alias out");
  if (unfuse_gate_) return Backend::rmsnorm_mul_sigmoid(a, w, eps, gate, out);
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_rmsnorm_mul_sigmoid<T>(ptr<T>(a), ptr<T>(w), ptr<T>(gate), int(n),
                                  a.rows * (a.cols / n), eps, ptr<T>(out), stream_);
  });
  tick("rmsnorm_mul_sigmoid");
}

void CudaBackend::div_scalar(Tensor& x, float d) {
  if (!bf16_mode_) {  // fp32 mode: activations and logits fp32, not rounded
    SALA_CHECK(x.dtype == DType::F32);
    launch_div_scalar<float>(ptr<float>(x), d, x.numel(), stream_);
  } else if (x.dtype == DType::F32) {
    launch_div_scalar_f32(ptr<float>(x), d, x.numel(), stream_);
  } else {
    SALA_CHECK(is_bf16(x));
    launch_div_scalar<bf16>(ptr<bf16>(x), d, x.numel(), stream_);
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
  SALA_CHECK(is_act(x) && head_dim % 2 == 0 && x.cols % head_dim == 0 && x.rows <= sd_.T);
  if (x.rows == 0) return;
  const float* inv = inv_freq(head_dim, theta);
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_rope<T>(ptr<T>(x), x.rows, x.cols, head_dim, sd_.positions, inv, stream_);
  });
  tick("rope");
}

void CudaBackend::qk_norm_rope(Tensor& q, Tensor& k, const Tensor& qn, const Tensor& kn, float eps,
                               int head_dim, double theta) {
  SALA_CHECK(is_act(q) && is_act(k) && is_act(qn) && is_act(kn) && head_dim % 2 == 0);
  SALA_CHECK(q.rows == k.rows && q.cols == k.cols && q.cols % head_dim == 0 && q.rows <= sd_.T &&
             qn.numel() == head_dim && kn.numel() == head_dim);
  if (q.rows == 0) return;
  const float* inv = inv_freq(head_dim, theta);
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_qk_norm_rope<T>(ptr<T>(q), ptr<T>(k), ptr<T>(qn), ptr<T>(kn), q.rows, q.cols, head_dim,
                           eps, sd_.positions, inv, stream_);
  });
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
