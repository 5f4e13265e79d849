#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cache_layout.h"
#include "core/check.h"
#include "core/safetensors.h"

namespace sala {

CpuBackend::CpuBackend(const BackendOptions& opts)
    : bf16_(opts.mode == NumericMode::BF16),
      fp8_(opts.fp8_weights),
      int4_group_(opts.int4_group_size),
      kv_dtype_(opts.kv_cache_dtype) {
  // One thread pool: OpenMP. OpenBLAS runs single-threaded inside OpenMP work items; two
  // pools that both spin-wait starve each other (decode many times slower on 2 cores).
  openblas_set_num_threads(1);
  if (opts.threads > 0) omp_set_num_threads(opts.threads);
}

CpuBackend::~CpuBackend() {
  for (void* p : allocations_) std::free(p);
}

float CpuBackend::r(float x) const { return bf16_ ? round_bf16(x) : x; }

void CpuBackend::round_all(Tensor& t) const {
  if (!bf16_) return;
  float* p = static_cast<float*>(t.data);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = round_bf16(p[i]);
}

void* CpuBackend::alloc_bytes(size_t n) {
  const size_t bytes = std::max<size_t>(64, (n + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, bytes);
  SALA_CHECK(p, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes);
  allocations_.push_back(p);
  return p;
}

Tensor CpuBackend::alloc(int64_t rows, int64_t cols, DType dtype) {
  Tensor t{nullptr, dtype, rows, cols};
  t.data = alloc_bytes(t.nbytes());
  return t;
}

Tensor CpuBackend::upload_weight(const TensorView& src) {
  // Weights are bf16/fp16/fp32 in the checkpoint; the CPU reference upcasts exactly.
  const int64_t cols = src.shape.empty() ? 1 : src.shape.back();
  Tensor t = alloc(src.numel() / std::max<int64_t>(cols, 1), cols, DType::F32);
  src.to_f32(static_cast<float*>(t.data));
  return t;
}

void CpuBackend::set_kv_scales(const std::vector<KvScales>& per_sparse_layer) {
  for (const KvScales& s : per_sparse_layer)
    SALA_CHECK(s.k > 0.f && std::isfinite(s.k) && s.v > 0.f && std::isfinite(s.v),
               "KV scales ({}, {}) must be finite and > 0", s.k, s.v);
  kv_scales_ = per_sparse_layer;
}

void CpuBackend::init_caches(const ModelConfig& cfg, const CacheShape& shape) {
  cfg_ = cfg;
  cache_shape_ = shape;
  const auto& sp = cfg.sparse;
  SALA_CHECK(shape.page_size % sp.block_size == 0, "page size {} not a multiple of block {}",
             shape.page_size, sp.block_size);
  const size_t row = size_t(cfg.num_key_value_heads) * cfg.head_dim;
  const size_t pages = size_t(shape.num_pages), ps = size_t(shape.page_size);
  const size_t per_page1 = size_t(cache_layout::entries_per_page(shape.page_size, sp.kernel_stride));
  const size_t per_page2 = size_t(cache_layout::entries_per_page(shape.page_size, sp.level2_stride()));
  const size_t n_sparse = size_t(cfg.num_sparse_layers());
  SALA_CHECK(kv_scales_.empty() || kv_scales_.size() == n_sparse,
             "{} KV scales for {} sparse layers", kv_scales_.size(), n_sparse);
  sparse_.assign(n_sparse, {});
  for (size_t i = 0; i < n_sparse; ++i) {  // shapes: backend/cache_layout.h
    const KvScales sc = kv_scales_.empty() ? KvScales{} : kv_scales_[i];
    SparseLayerCache& c = sparse_[i];
    c.k.init(pages * ps * row, kv_dtype_, sc.k);
    c.v.init(pages * ps * row, kv_dtype_, sc.v);
    c.c1.init(pages * per_page1 * row, kv_dtype_, sc.k);  // means of keys: K's scale
    c.c2.init(pages * per_page2 * row, kv_dtype_, sc.k);
  }
  const size_t d = size_t(cfg.lightning_head_dim);
  states_.assign(size_t(shape.num_slots) * cfg.num_lightning_layers() * cfg.lightning_nh * d * d,
                 0.f);
  num_slots_ = shape.num_slots;
}

void CpuBackend::copy_state_slot(int32_t src, int32_t dst) {
  const size_t slot = num_slots_ > 0 ? states_.size() / size_t(num_slots_) : 0;
  SALA_CHECK(src >= 0 && src < num_slots_ && dst >= 0 && dst < num_slots_,
             "state slots {} -> {} of {}", src, dst, num_slots_);
  if (src != dst)
    std::memcpy(states_.data() + size_t(dst) * slot, states_.data() + size_t(src) * slot,
                slot * sizeof(float));
}

void CpuBackend::download_f32(const Tensor& src, float* dst) {
  SALA_CHECK(src.dtype == DType::F32);
  std::memcpy(dst, src.data, src.nbytes());
}

void CpuBackend::embedding(const Tensor& table, float scale, Tensor& out) {
  const auto& ids = meta_->token_ids;
  SALA_CHECK(out.rows == int64_t(ids.size()) && out.cols == table.cols);
  const float* tab = static_cast<const float*>(table.data);
  float* o = static_cast<float*>(out.data);
  for (size_t t = 0; t < ids.size(); ++t) {
    SALA_CHECK(ids[t] >= 0 && ids[t] < table.rows, "token id {} out of range", ids[t]);
    const float* e = tab + int64_t(ids[t]) * table.cols;
    for (int64_t c = 0; c < table.cols; ++c) o[int64_t(t) * out.cols + c] = r(e[c] * scale);
  }
}

void CpuBackend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out,
                         const Weight* /*next*/) {
  const int64_t n = w.numel();
  SALA_CHECK(x.cols % n == 0 && out.rows == x.rows && out.cols == x.cols);
  const float* wp = static_cast<const float*>(w.data);
  const int64_t groups = x.rows * (x.cols / n);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const float* xi = static_cast<const float*>(x.data) + g * n;
    float* oi = static_cast<float*>(out.data) + g * n;
    double ss = 0;
    for (int64_t c = 0; c < n; ++c) ss += double(xi[c]) * xi[c];
    const float inv = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
    for (int64_t c = 0; c < n; ++c) oi[c] = r(r(xi[c] * inv) * wp[c]);
  }
}

void CpuBackend::row_sum_squares(const Tensor& a, Tensor& ss) {
  SALA_CHECK(ss.dtype == DType::F32 && ss.rows == a.rows && ss.cols == 1,
             "row sums of squares of [{}, {}] into [{}, {}]", a.rows, a.cols, ss.rows, ss.cols);
  const float* x = static_cast<const float*>(a.data);
  float* out = static_cast<float*>(ss.data);
  for (int64_t t = 0; t < a.rows; ++t) {
    double s = 0;
    for (int64_t c = 0; c < a.cols; ++c) s += double(x[t * a.cols + c]) * x[t * a.cols + c];
    out[t] = float(s);
  }
}

void CpuBackend::rmsnorm_mul_sigmoid_ss(const Tensor& a, const Tensor& ss, int64_t n,
                                        const Tensor& w, float eps, const Tensor& gate,
                                        Tensor& out) {
  SALA_CHECK(ss.rows == a.rows && ss.cols == 1 && w.numel() == a.cols && n >= a.cols &&
             gate.numel() == a.numel() && out.rows == a.rows && out.cols == a.cols &&
             gate.data != out.data);
  const float* x = static_cast<const float*>(a.data);
  const float* s = static_cast<const float*>(ss.data);
  const float* wp = static_cast<const float*>(w.data);
  const float* gp = static_cast<const float*>(gate.data);
  float* o = static_cast<float*>(out.data);
  for (int64_t t = 0; t < a.rows; ++t) {
    // rmsnorm's inv, from the whole row's sum; then mul_sigmoid's product.
    const float inv = float(1.0 / std::sqrt(double(s[t]) / double(n) + double(eps)));
    for (int64_t c = 0; c < a.cols; ++c) {
      const int64_t i = t * a.cols + c;
      const float y = r(r(x[i] * inv) * wp[c]);
      o[i] = r(y * r(1.f / (1.f + std::exp(-gp[i]))));
    }
  }
}

void CpuBackend::add_scaled_rmsnorm(Tensor& h, const Tensor& a, float alpha, const Tensor& w,
                                    float eps, Tensor& out, const Weight* /*next*/) {
  SALA_CHECK(h.numel() == a.numel());
  float* hp = static_cast<float*>(h.data);
  const float* ap = static_cast<const float*>(a.data);
  for (int64_t i = 0; i < h.numel(); ++i) hp[i] = r(hp[i] + r(ap[i] * alpha));
  rmsnorm(h, w, eps, out);
}

void CpuBackend::linear(const Tensor& x, const Weight& wt, Tensor& y) {
  if (observer_) observer_(wt, x);
  if (wt.format == WeightFormat::FP8_E4M3) return linear_fp8(x, wt, y);
  if (wt.format == WeightFormat::INT4_GROUPED) return linear_int4(x, wt, y);
  SALA_CHECK(wt.format == WeightFormat::F32, "the CPU backend has no {} GEMM",
             weight_format_name(wt.format));
  const Tensor w = dense_view(wt);  // [N, K] fp32
  SALA_CHECK(x.cols == w.cols && y.rows == x.rows && y.cols == w.rows,
             "linear shapes x[{},{}] w[{},{}] y[{},{}]", x.rows, x.cols, w.rows, w.cols, y.rows,
             y.cols);
  if (x.rows == 0) return;
  // Split the output columns (weight rows) over the threads: y[:, n0:n1] = x · W[n0:n1]ᵀ.
  const int64_t N = w.rows;
  const int64_t parts = std::min<int64_t>(omp_get_max_threads(), std::max<int64_t>(1, N / 64));
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t n0 = N * p / parts, n1 = N * (p + 1) / parts;
    // Steps of up to 16 rows (decode steps, speculative verify rows): one GEMV per row, so a
    // row's result does not depend on what shares its step (batch invariance, and verify
    // rows bit-identical to decode rows: issue 21). Longer steps: sgemm.
    if (x.rows <= 16) {
      for (int64_t r = 0; r < x.rows; ++r)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, int(n1 - n0), int(x.cols), 1.f,
                    static_cast<const float*>(w.data) + n0 * w.cols, int(w.cols),
                    static_cast<const float*>(x.data) + r * x.cols, 1, 0.f,
                    static_cast<float*>(y.data) + r * y.cols + n0, 1);
      continue;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(x.rows), int(n1 - n0), int(x.cols),
                1.f, static_cast<const float*>(x.data), int(x.cols),
                static_cast<const float*>(w.data) + n0 * w.cols, int(w.cols), 0.f,
                static_cast<float*>(y.data) + n0, int(y.cols));
  }
  round_all(y);
}

void CpuBackend::silu_mul(const Tensor& g, const Tensor& u, Tensor& out) {
  const float* gp = static_cast<const float*>(g.data);
  const float* up = static_cast<const float*>(u.data);
  float* o = static_cast<float*>(out.data);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < g.numel(); ++i) {
    const float s = gp[i] / (1.f + std::exp(-gp[i]));
    o[i] = r(r(s) * up[i]);
  }
}

void CpuBackend::mul_sigmoid(const Tensor& a, const Tensor& gate, Tensor& out) {
  const float* ap = static_cast<const float*>(a.data);
  const float* gp = static_cast<const float*>(gate.data);
  float* o = static_cast<float*>(out.data);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < a.numel(); ++i) o[i] = r(ap[i] * r(1.f / (1.f + std::exp(-gp[i]))));
}

void CpuBackend::div_scalar(Tensor& x, float d) {
  float* p = static_cast<float*>(x.data);
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = r(p[i] / d);
}

void CpuBackend::rope(Tensor& x, int head_dim, double theta) {
  // SPEC §7: inv_freq and angles in fp32 exactly as HF forms them; cos/sin of the fp32
  // angle; rotate-half pairs (j, j + d/2).
  const int half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int j = 0; j < half; ++j)
    inv_freq[size_t(j)] = 1.0f / std::pow(float(theta), float(2 * j) / float(head_dim));
  const int64_t heads = x.cols / head_dim;
  const auto& pos = meta_->positions;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < x.rows; ++t) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int j = 0; j < half; ++j) {
      const float ang = float(pos[size_t(t)]) * inv_freq[size_t(j)];
      c[size_t(j)] = float(std::cos(double(ang)));
      s[size_t(j)] = float(std::sin(double(ang)));
    }
    float* row = static_cast<float*>(x.data) + t * x.cols;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = row + h * head_dim;
      for (int j = 0; j < half; ++j) {
        const float x1 = v[j], x2 = v[j + half];
        v[j] = r(x1 * c[size_t(j)] - x2 * s[size_t(j)]);
        v[j + half] = r(x2 * c[size_t(j)] + x1 * s[size_t(j)]);
      }
    }
  }
}

void CpuBackend::gather_logit_rows(const Tensor& x, Tensor& out) {
  const auto& rows = meta_->logit_rows;
  SALA_CHECK(out.rows >= int64_t(rows.size()) && out.cols == x.cols);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<float*>(out.data) + int64_t(i) * x.cols,
                static_cast<const float*>(x.data) + int64_t(rows[i]) * x.cols,
                size_t(x.cols) * 4);
}

void CpuBackend::copy_cols(const Tensor& src, int64_t c0, Tensor& dst) {
  SALA_CHECK(src.dtype == dst.dtype && src.rows == dst.rows && c0 >= 0 &&
                 c0 + dst.cols <= src.cols,
             "columns {}..{} of [{}, {}] into [{}, {}]", c0, c0 + dst.cols, src.rows, src.cols,
             dst.rows, dst.cols);
  const size_t es = dtype_size(src.dtype);
  for (int64_t t = 0; t < src.rows; ++t)
    std::memcpy(static_cast<char*>(dst.data) + size_t(t * dst.cols) * es,
                static_cast<const char*>(src.data) + size_t(t * src.cols + c0) * es,
                size_t(dst.cols) * es);
}

void CpuBackend::argmax_rows(const Tensor& logits, int32_t* out) {
  for (int64_t r = 0; r < logits.rows; ++r) {
    const float* row = static_cast<const float*>(logits.data) + r * logits.cols;
    out[r] = int32_t(std::max_element(row, row + logits.cols) - row);  // first maximum
  }
}

void CpuBackend::mask_logits(Tensor& logits, const int32_t* rows, int64_t n, const uint32_t* masks,
                             int32_t words) {
  SALA_CHECK(logits.dtype == DType::F32, "mask_logits of {}", dtype_name(logits.dtype));
  for (int64_t i = 0; i < n; ++i) {
    SALA_CHECK(rows[i] >= 0 && rows[i] < logits.rows, "mask row {} of {}", rows[i], logits.rows);
    mask_logits_row(static_cast<float*>(logits.data) + rows[i] * logits.cols, logits.cols,
                    masks + i * words, words);
  }
}

// The logits are host memory: the rows are read in place, one thread per row.
void CpuBackend::logprobs_rows(const Tensor& logits, const int32_t* rows, const int32_t* targets,
                               int64_t n, int top_n, float* logprob, int32_t* top_ids,
                               float* top_logprobs) {
  SALA_CHECK(logits.dtype == DType::F32, "logprobs_rows of {}", dtype_name(logits.dtype));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    logprobs_of_row(static_cast<const float*>(logits.data) + int64_t(rows[i]) * logits.cols,
                    logits.cols, targets[i], top_n, logprob + i, top_ids + i * top_n,
                    top_logprobs + i * top_n);
}

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opts) {
  return std::make_unique<CpuBackend>(opts);
}

}  // namespace sala
