// CUDA backend, op dispatch: embedding, norms, element-wise ops, RoPE, logit-row gather and
// the device argmax launched here; GEMMs (GemmDispatch), lightning (LightningRunner) and
// sparse (SparseRunner) layers delegated, with Backend's default composition wherever the
// fused path does not serve the step. Activations are bf16 in bf16 mode and fp32 in fp32
// mode (the kernels' T; with_act_type picks it).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_argmax.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_host_util.h"
#include "backend/cuda/cuda_token_mask.h"
#include "core/check.h"

namespace sala {
using namespace sala::cuda;
using namespace sala::cuda_host;

// ---- ops -----------------------------------------------------------------------------

void CudaBackend::embedding(const Tensor& table, float scale, Tensor& out) {
  const auto& ids = plan_.meta()->token_ids;
  SALA_CHECK(out.rows == int64_t(ids.size()) && out.cols == table.cols && is_act(out) && is_act(table));
  for (int32_t id : ids) SALA_CHECK(id >= 0 && id < table.rows, "token id {} out of range", id);
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_embedding(ptr<T>(table), sd().token_ids, out.rows, table.cols, scale, ptr<T>(out), st());
  });
  tick("embedding");
}

Fp8Act CudaBackend::fp8_codes_for(const Tensor& out, int64_t n, const Weight* next) {
  if (!fp8_producer_codes_ || !next || next->format != WeightFormat::FP8_E4M3 || n != out.cols) {
    gemm_.forget_fp8_input();  // a new activation: no earlier one's codes stay prepared
    return {};
  }
  // `next` is out's only reader (Backend's contract), and it reads these codes: the kernel
  // may skip storing out itself.
  const GemmDispatch::Fp8Input in = gemm_.prepare_fp8_input(out, *next);
  return {in.codes, in.scales, true};
}

void CudaBackend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out,
                          const Weight* next) {
  const int64_t n = w.numel();
  SALA_CHECK(x.cols % n == 0 && out.rows == x.rows && out.cols == x.cols);
  SALA_CHECK(is_act(x) && is_act(w) && is_act(out));
  if (const Fp8Act q = fp8_codes_for(out, n, next); q.codes) {
    launch_rmsnorm_fp8(ptr<bf16>(x), nullptr, 0.f, ptr<bf16>(w), nullptr, int(n), x.rows, eps,
                       ptr<bf16>(out), q, st());
    tick("rmsnorm + fp8 codes");
    return;
  }
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_rmsnorm<T>(ptr<T>(x), nullptr, 0.f, ptr<T>(w), int(n), x.rows * (x.cols / n), eps,
                      ptr<T>(out), st());
  });
  tick("rmsnorm");
}

void CudaBackend::add_scaled_rmsnorm(Tensor& h, const Tensor& a, float alpha, const Tensor& w,
                                     float eps, Tensor& out, const Weight* next) {
  const int64_t n = w.numel();
  SALA_CHECK(h.numel() == a.numel() && h.cols % n == 0 && out.rows == h.rows && out.cols == h.cols);
  SALA_CHECK(is_act(h) && is_act(a) && is_act(w) && is_act(out));
  SALA_CHECK(out.data != h.data, "add_scaled_rmsnorm: out must not alias h");
  if (const Fp8Act q = fp8_codes_for(out, n, next); q.codes) {
    launch_rmsnorm_fp8(ptr<bf16>(h), ptr<bf16>(a), alpha, ptr<bf16>(w), nullptr, int(n), h.rows,
                       eps, ptr<bf16>(out), q, st());
    tick("add_scaled_rmsnorm + fp8 codes");
    return;
  }
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_rmsnorm<T>(ptr<T>(h), ptr<T>(a), alpha, ptr<T>(w), int(n), h.rows * (h.cols / n), eps,
                      ptr<T>(out), st());
  });
  tick("add_scaled_rmsnorm");
}

void CudaBackend::linear(const Tensor& x, const Weight& w, Tensor& y) { gemm_.linear(x, w, y); }

// Decode rows: the GEMV's last CTAs apply the norm (GemmDispatch::linear_norm) where the
// unfused norm would run rmsnorm_vec8_kernel, whose bits the tail reproduces. FP8 weights
// whose GEMM leaves fp32 sums (cuBLASLt's unscaled GEMM: decode-only steps of 17..64 rows)
// have them scaled inside that norm kernel (launch_add_rmsnorm_sums: the scaling kernel's
// bits, one launch less).
void CudaBackend::linear_add_rmsnorm(const Tensor& x, const Weight& w, Tensor& y, Tensor& h,
                                     float alpha, const Tensor& norm_w, float eps, Tensor& out,
                                     const Weight* next) {
  const int64_t n = norm_w.numel();
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool fits = bf16_mode_ && h.cols == n && y.cols == n && out.cols == n &&
                    h.rows == x.rows && y.rows == x.rows && out.rows == x.rows && is_bf16(h) &&
                    is_bf16(y) && is_bf16(out) && is_bf16(norm_w) && out.data != h.data &&
                    aligned16(h.data) && aligned16(y.data) && aligned16(out.data) &&
                    aligned16(norm_w.data);
  if (fits && gemv_norm_tail_fits(n)) {
    // The callback captures one reference, so std::function keeps it without allocating.
    struct Tail {
      CudaBackend* be;
      const Tensor& out;
      const Weight* next;
      GemvRowTail t;
    } c{this, out, next, {}};
    c.t.h = ptr<bf16>(h);
    c.t.w = ptr<bf16>(norm_w);
    c.t.alpha = alpha;
    c.t.eps = eps;
    c.t.out = ptr<bf16>(out);
    c.t.n = int(n);
    if (gemm_.linear_norm(x, w, y, [&c] {
          GemvRowTail t = c.t;
          t.q = c.be->fp8_codes_for(c.out, c.out.cols, c.next);
          return t;
        }))
      return;
  }
  // out's codes go where x's were (n <= x.cols: they fit, so the FP8 workspace that holds the
  // sums' sx does not move).
  if (fits && w.format == WeightFormat::FP8_E4M3 && rmsnorm_vec8_fits(n) && n <= x.cols) {
    const Fp8Sums s = gemm_.linear_fp8_sums(x, w, y);
    if (!s.acc) return add_scaled_rmsnorm(h, y, alpha, norm_w, eps, out, next);
    const Fp8Act q = fp8_codes_for(out, n, next);  // after the GEMM took x's
    launch_add_rmsnorm_sums(ptr<bf16>(h), s, alpha, ptr<bf16>(norm_w), int(n), h.rows, eps,
                            ptr<bf16>(out), q, st());
    tick(q.codes ? "add_rmsnorm_sums + fp8 codes" : "add_rmsnorm_sums");
    return;
  }
  Backend::linear_add_rmsnorm(x, w, y, h, alpha, norm_w, eps, out, next);
}

void CudaBackend::linear_multi(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys) {
  if (!gemm_.linear_multi(x, w, ys)) Backend::linear_multi(x, w, ys);  // one GEMM per row slice
}

void CudaBackend::linear_silu_mul(const Tensor& x, const Weight& w, Tensor& g, Tensor& u,
                                  const Weight* next) {
  if (gemm_.linear_silu_mul(x, w, g, u, [&] { return fp8_codes_for(g, g.cols, next); })) return;
  if (!fp8_producer_codes_ || !next || next->format != WeightFormat::FP8_E4M3)
    return Backend::linear_silu_mul(x, w, g, u);
  linear_multi(x, w, {&g, &u});  // Backend's composition, its SiLU product with g's codes
  SALA_CHECK(g.numel() == u.numel() && is_act(g) && is_act(u));
  if (const Fp8Act q = fp8_codes_for(g, g.cols, next); q.codes) {
    launch_silu_mul_fp8(ptr<bf16>(g), ptr<bf16>(u), ptr<bf16>(g), g.rows, g.cols, q, st());
    tick("silu_mul + fp8 codes");
    return;
  }
  silu_mul(g, u, g);
}

void CudaBackend::silu_mul(const Tensor& g, const Tensor& u, Tensor& out) {
  SALA_CHECK(g.numel() == u.numel() && out.numel() == g.numel() && is_act(g) && is_act(u) && is_act(out));
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_silu_mul<T>(ptr<T>(g), ptr<T>(u), ptr<T>(out), g.numel(), st());
  });
  tick("silu_mul");
}

void CudaBackend::mul_sigmoid(const Tensor& a, const Tensor& gate, Tensor& out) {
  SALA_CHECK(a.numel() == gate.numel() && out.numel() == a.numel() && is_act(a) && is_act(gate) &&
             is_act(out));
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_mul_sigmoid<T>(ptr<T>(a), ptr<T>(gate), ptr<T>(out), a.numel(), st());
  });
  tick("mul_sigmoid");
}

void CudaBackend::rmsnorm_mul_sigmoid(const Tensor& a, const Tensor& w, float eps,
                                      const Tensor& gate, Tensor& out, const Weight* next) {
  const int64_t n = w.numel();
  SALA_CHECK(a.cols % n == 0 && out.rows == a.rows && out.cols == a.cols &&
             gate.numel() == a.numel());
  SALA_CHECK(is_act(a) && is_act(w) && is_act(gate) && is_act(out));
  SALA_CHECK(gate.data != out.data, "rmsnorm_mul_sigmoid: gate must not alias out");
  if (const Fp8Act q = fp8_codes_for(out, n, next); q.codes) {
    launch_rmsnorm_fp8(ptr<bf16>(a), nullptr, 0.f, ptr<bf16>(w), ptr<bf16>(gate), int(n), a.rows,
                       eps, ptr<bf16>(out), q, st());
    tick("rmsnorm_mul_sigmoid + fp8 codes");
    return;
  }
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_rmsnorm_mul_sigmoid<T>(ptr<T>(a), ptr<T>(w), ptr<T>(gate), int(n),
                                  a.rows * (a.cols / n), eps, ptr<T>(out), st());
  });
  tick("rmsnorm_mul_sigmoid");
}

void CudaBackend::row_sum_squares(const Tensor& a, Tensor& ss) {
  SALA_CHECK(is_act(a) && ss.dtype == DType::F32 && ss.rows == a.rows && ss.cols == 1,
             "row sums of squares of [{}, {}] into [{}, {}]", a.rows, a.cols, ss.rows, ss.cols);
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_row_sum_squares<T>(ptr<T>(a), int(a.cols), a.rows, ptr<float>(ss), st());
  });
  tick("row_sum_squares");
}

void CudaBackend::rmsnorm_mul_sigmoid_ss(const Tensor& a, const Tensor& ss, int64_t n,
                                         const Tensor& w, float eps, const Tensor& gate,
                                         Tensor& out) {
  SALA_CHECK(ss.dtype == DType::F32 && ss.rows == a.rows && ss.cols == 1 &&
             w.numel() == a.cols && n >= a.cols && gate.numel() == a.numel() &&
             out.rows == a.rows && out.cols == a.cols && gate.data != out.data);
  SALA_CHECK(is_act(a) && is_act(w) && is_act(gate) && is_act(out));
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_rmsnorm_mul_sigmoid_ss<T>(ptr<T>(a), ptr<float>(ss), int(a.cols), n, ptr<T>(w),
                                     ptr<T>(gate), a.rows, eps, ptr<T>(out), st());
  });
  tick("rmsnorm_mul_sigmoid_ss");
}

void CudaBackend::div_scalar(Tensor& x, float d) {
  if (!bf16_mode_) {  // fp32 mode: activations and logits fp32, not rounded
    SALA_CHECK(x.dtype == DType::F32);
    launch_div_scalar<float>(ptr<float>(x), d, x.numel(), st());
  } else if (x.dtype == DType::F32) {
    launch_div_scalar_f32(ptr<float>(x), d, x.numel(), st());
  } else {
    SALA_CHECK(is_bf16(x));
    launch_div_scalar<bf16>(ptr<bf16>(x), d, x.numel(), st());
  }
  tick("div_scalar");
}

void CudaBackend::rope(Tensor& x, int head_dim, double theta) {
  SALA_CHECK(is_act(x) && head_dim % 2 == 0 && x.cols % head_dim == 0 && x.rows <= sd().T);
  if (x.rows == 0) return;
  const float* inv = rope_.get(head_dim, theta);
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_rope<T>(ptr<T>(x), x.rows, x.cols, head_dim, sd().positions, inv, st());
  });
  tick("rope");
}

void CudaBackend::qk_norm_rope(Tensor& q, Tensor& k, const Tensor& qn, const Tensor& kn, float eps,
                               int head_dim, double theta) {
  SALA_CHECK(is_act(q) && is_act(k) && is_act(qn) && is_act(kn) && head_dim % 2 == 0);
  SALA_CHECK(q.rows == k.rows && q.cols == k.cols && q.cols % head_dim == 0 && q.rows <= sd().T &&
             qn.numel() == head_dim && kn.numel() == head_dim);
  if (q.rows == 0) return;
  const float* inv = rope_.get(head_dim, theta);
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    launch_qk_norm_rope<T>(ptr<T>(q), ptr<T>(k), ptr<T>(qn), ptr<T>(kn), q.rows, q.cols, head_dim,
                           eps, sd().positions, inv, st());
  });
  tick("qk_norm_rope");
}

void CudaBackend::gather_logit_rows(const Tensor& x, Tensor& out) {
  const int R = sd().R;
  SALA_CHECK(out.rows >= R && out.cols == x.cols && out.dtype == x.dtype);
  launch_gather_rows(x.data, x.cols, int(dtype_size(x.dtype)), sd().logit_rows, R, out.data, st());
  tick("gather_logit_rows");
}

void CudaBackend::copy_cols(const Tensor& src, int64_t c0, Tensor& dst) {
  SALA_CHECK(src.dtype == dst.dtype && src.rows == dst.rows && c0 >= 0 &&
                 c0 + dst.cols <= src.cols,
             "columns {}..{} of [{}, {}] into [{}, {}]", c0, c0 + dst.cols, src.rows, src.cols,
             dst.rows, dst.cols);
  if (src.rows == 0 || dst.cols == 0) return;
  const size_t es = dtype_size(src.dtype);
  CUDA_CHECK(cudaMemcpy2DAsync(dst.data, size_t(dst.cols) * es,
                               static_cast<const char*>(src.data) + size_t(c0) * es,
                               size_t(src.cols) * es, size_t(dst.cols) * es, size_t(src.rows),
                               cudaMemcpyDeviceToDevice, st()));
  tick("copy_cols");
}

void CudaBackend::argmax_rows(const Tensor& logits, int32_t* out) {
  SALA_CHECK(logits.dtype == DType::F32, "argmax_rows of {}", dtype_name(logits.dtype));
  if (logits.rows == 0) return;
  if (logits.rows > argmax_cap_) {  // grows to max_logit_rows once, at the first steps
    arena_.release_pinned(argmax_host_);
    argmax_cap_ = std::max<int64_t>(logits.rows, 64);
    argmax_dev_ = static_cast<int32_t*>(arena_.device(size_t(argmax_cap_) * 4));
    argmax_host_ = static_cast<int32_t*>(arena_.pinned(size_t(argmax_cap_) * 4));
  }
  cuda::launch_argmax_rows(ptr<float>(logits), logits.rows, logits.cols, argmax_dev_, st());
  CUDA_CHECK(cudaMemcpyAsync(argmax_host_, argmax_dev_, size_t(logits.rows) * 4,
                             cudaMemcpyDeviceToHost, st()));
  stream_.sync();
  std::memcpy(out, argmax_host_, size_t(logits.rows) * 4);
  tick("argmax_rows");
}

void CudaBackend::mask_logits(Tensor& logits, const int32_t* rows, int64_t n, const uint32_t* masks,
                              int32_t words) {
  SALA_CHECK(logits.dtype == DType::F32, "mask_logits of {}", dtype_name(logits.dtype));
  if (n == 0) return;
  for (int64_t i = 0; i < n; ++i)
    SALA_CHECK(rows[i] >= 0 && rows[i] < logits.rows, "mask row {} of {}", rows[i], logits.rows);
  if (n > mask_cap_ || words > mask_words_) {  // grows to max_logit_rows x the vocab's words once
    // Nothing in flight reads the old buffer: every step ends with a synchronizing download
    // (argmax_rows / download_f32), and recorded steps never read it.
    if (mask_dev_) arena_.release(mask_dev_);
    mask_cap_ = std::max<int64_t>({n, mask_cap_, 64});
    mask_words_ = std::max(words, mask_words_);
    mask_dev_ = arena_.device(size_t(mask_cap_) * 4 * (1 + size_t(mask_words_)));
  }
  auto* rows_dev = static_cast<int32_t*>(mask_dev_);
  auto* masks_dev = reinterpret_cast<uint32_t*>(rows_dev + mask_cap_);
  // From pageable memory: the call returns once the host arrays are staged, so the caller may
  // reuse them at once, and it does not wait for the step's queued work.
  CUDA_CHECK(cudaMemcpyAsync(rows_dev, rows, size_t(n) * 4, cudaMemcpyHostToDevice, st()));
  CUDA_CHECK(cudaMemcpyAsync(masks_dev, masks, size_t(n) * size_t(words) * 4,
                             cudaMemcpyHostToDevice, st()));
  cuda::launch_mask_logits(ptr<float>(logits), logits.cols, rows_dev, n, masks_dev, words, st());
  tick("mask_logits");
}

// ---- mixers ------------------------------------------------------------------------------

void CudaBackend::lightning_attention(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const std::vector<float>& slopes, float scale, Tensor& out) {
  lightning_.attention(li, q, k, v, slopes, scale, out);
}

void CudaBackend::lightning_qk_attention(int li, Tensor& q, Tensor& k, const Tensor& v,
                                         const Tensor& qn, const Tensor& kn, float eps,
                                         int head_dim, double theta,
                                         const std::vector<float>& slopes, float scale,
                                         Tensor& out) {
  if (!lightning_.qk_attention(li, q, k, v, qn, kn, eps, head_dim, theta, slopes, scale, out))
    Backend::lightning_qk_attention(li, q, k, v, qn, kn, eps, head_dim, theta, slopes, scale, out);
}

void CudaBackend::sparse_attention(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                                   Tensor& out) {
  sparse_.attention(si, q, k, v, out);
}

void CudaBackend::sparse_attention_mul_sigmoid(int si, const Tensor& q, const Tensor& k,
                                               const Tensor& v, const Tensor& gate, Tensor& out) {
  if (!sparse_.attention_mul_sigmoid(si, q, k, v, gate, out))
    Backend::sparse_attention_mul_sigmoid(si, q, k, v, gate, out);
}

}  // namespace sala
