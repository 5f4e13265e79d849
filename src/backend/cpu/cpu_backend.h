// The CPU backend: the readable reference implementation of every op and the oracle the
// CUDA backend is tested against. Activations are fp32. In NumericMode::BF16 every op
// rounds its outputs to bf16 at the points of the golden README §4 (the HF bf16 rounding
// points), so the same code also defines what the bf16 GPU path must compute.
#pragma once
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_kv_store.h"
#include "core/check.h"

namespace sala {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& opts);
  ~CpuBackend() override;
  std::string name() const override { return bf16_ ? "cpu-bf16" : "cpu"; }
  DType act_dtype() const override { return DType::F32; }

  Tensor alloc(int64_t rows, int64_t cols, DType dtype) override;
  Tensor upload_weight(const TensorView& src) override;
  WeightFormat linear_format() const override {
    return fp8_ ? WeightFormat::FP8_E4M3
                : int4_group_ > 0 ? WeightFormat::INT4_GROUPED : WeightFormat::F32;
  }
  // FP8_E4M3: quantized per output channel (cpu_fp8.cpp); INT4_GROUPED: RTN with
  // BackendOptions::int4_group_size (cpu_int4.cpp); F32: upload_weight.
  Weight upload_linear(const TensorView& src, WeightFormat format) override;
  Weight upload_fp8(const TensorView& codes, const std::vector<float>& scales) override;
  Weight upload_int4(const TensorView& packed, const std::vector<float>& scales,
                     int32_t group) override;
  void set_linear_observer(LinearInputObserver observer) override {
    observer_ = std::move(observer);
  }
  void set_kv_scales(const std::vector<KvScales>& per_sparse_layer) override;
  void init_caches(const ModelConfig& cfg, const CacheShape& shape) override;
  void copy_state_slot(int32_t src, int32_t dst) override;
  void advance_lightning_states(const Tensor& k, const Tensor& v, int64_t layer_rows,
                                const std::vector<StateAdvance>& calls,
                                const std::vector<float>& slopes) override;
  size_t kv_element_bytes() const override { return kv_is_fp8(kv_dtype_) ? 1 : 4; }
  void download_f32(const Tensor& src, float* dst) override;
  void begin_step(const StepMeta& meta) override { meta_ = &meta; }

  void embedding(const Tensor& table, float scale, Tensor& out) override;
  // `next` (a hint for backends that prepare a GEMM's input) is not used here.
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out,
               const Weight* next = nullptr) override;
  void add_scaled_rmsnorm(Tensor& h, const Tensor& a, float alpha, const Tensor& w, float eps,
                          Tensor& out, const Weight* next = nullptr) override;
  void linear(const Tensor& x, const Weight& w, Tensor& y) override;
  void silu_mul(const Tensor& g, const Tensor& u, Tensor& out) override;
  void mul_sigmoid(const Tensor& a, const Tensor& gate, Tensor& out) override;
  void div_scalar(Tensor& x, float d) override;
  void rope(Tensor& x, int head_dim, double theta) override;
  void lightning_attention(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                           const std::vector<float>& slopes, float scale, Tensor& out) override;
  void sparse_attention(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                        Tensor& out) override;
  void gather_logit_rows(const Tensor& x, Tensor& out) override;
  void copy_cols(const Tensor& src, int64_t c0, Tensor& dst) override;
  // Σ x² in double per row (as rmsnorm's), stored as fp32.
  void row_sum_squares(const Tensor& a, Tensor& ss) override;
  void rmsnorm_mul_sigmoid_ss(const Tensor& a, const Tensor& ss, int64_t n, const Tensor& w,
                              float eps, const Tensor& gate, Tensor& out) override;
  void argmax_rows(const Tensor& logits, int32_t* out) override;
  void mask_logits(Tensor& logits, const int32_t* rows, int64_t n, const uint32_t* masks,
                   int32_t words) override;
  void logprobs_rows(const Tensor& logits, const int32_t* rows, const int32_t* targets, int64_t n,
                     int top_n, float* logprob, int32_t* top_ids, float* top_logprobs) override;
  // The host sampler (backend/sampling.h) on the rows in place: the oracle of the CUDA kernel.
  void sample_rows(const Tensor& logits, const int32_t* rows, int64_t n, const RowSampling* params,
                   const LogitEdit* edits, int32_t* out) override {
    SALA_CHECK(logits.dtype == DType::F32, "sample_rows of {}", dtype_name(logits.dtype));
    for (int64_t i = 0; i < n; ++i)
      SALA_CHECK(rows[i] >= 0 && rows[i] < logits.rows, "sample row {} of {}", rows[i], logits.rows);
    sampler_.sample_rows(static_cast<const float*>(logits.data), int32_t(logits.cols), rows, n,
                         params, edits, out);
  }
  void load_penalties(int32_t slot, int32_t vocab, const int32_t* prompt, int64_t n_prompt,
                      const int32_t* generated, int64_t n_generated) override {
    sampler_.load_penalties(slot, vocab, prompt, n_prompt, generated, n_generated);
  }
  bool samples_rows() const override { return true; }

  // Paged sparse-layer cache of one layer: fp32 (bf16-representable values in BF16 mode), or
  // FP8 codes with the layer's scales (K's for the compressed keys) under an FP8 KV cache.
  struct SparseLayerCache {
    CpuKvArray k, v;  // [num_pages, page_size, kvh, d]
    CpuKvArray c1;    // [num_pages, page_size / s1, kvh, d] level-1 compressed keys
    CpuKvArray c2;    // [num_pages, page_size / s2, kvh, d] level-2 compressed keys
  };
  // Sparse layer si's caches (tests read the stored codes).
  const SparseLayerCache& sparse_cache(int si) const { return sparse_.at(size_t(si)); }

 private:
  float r(float x) const;  // rounds to bf16 in BF16 mode
  void round_all(Tensor& t) const;
  void* alloc_bytes(size_t bytes);  // zeroed, 64-byte aligned, freed with the backend
  // linear() of an FP8_E4M3 weight: the W8A8 recipe of cpu_fp8.cpp.
  void linear_fp8(const Tensor& x, const Weight& w, Tensor& y);
  // linear() of an INT4_GROUPED weight: dequantized exactly to fp32, then sgemm (cpu_int4.cpp).
  void linear_int4(const Tensor& x, const Weight& w, Tensor& y);
  // upload_linear's RTN quantization of one fp32 matrix [rows, cols] with `group`.
  Weight int4_weight_rtn(const std::string& name, const float* w, int64_t rows, int64_t cols,
                         int32_t group);

  bool bf16_;
  bool fp8_;  // BackendOptions::fp8_weights
  int32_t int4_group_;  // BackendOptions::int4_group_size
  LinearInputObserver observer_;  // set_linear_observer (calibration)
  KvCacheDtype kv_dtype_;  // BackendOptions::kv_cache_dtype
  std::vector<KvScales> kv_scales_;  // per sparse layer (set_kv_scales); empty: defaults
  std::vector<void*> allocations_;
  const StepMeta* meta_ = nullptr;
  ModelConfig cfg_;
  CacheShape cache_shape_;
  std::vector<SparseLayerCache> sparse_;  // per sparse layer
  std::vector<float> states_;  // [num_slots, n_lightning, nh, d, d] fp32
  int32_t num_slots_ = 0;
  HostSampler sampler_;  // sample_rows, load_penalties
};

}  // namespace sala
