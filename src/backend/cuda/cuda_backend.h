// The CUDA backend: bf16 activations and weights in device memory, one stream, cuBLASLt
// GEMMs, and kernels that round at exactly the points of the golden README §4 (the CPU
// backend in NumericMode::BF16 is the oracle; tests/ops compares every op with it). In fp32
// mode (NumericMode::F32) weights (exact upcasts), activations, KV cache and compressed keys
// are fp32 and nothing rounds to bf16: the same kernels instantiated for float, true-fp32
// GEMMs, and CUDA-core kernels in place of the bf16 tensor-core ones (flash prefill, GEMV,
// InfLLM-v2 selection and stage 2); the CPU backend in fp32 mode is that oracle.
//
// CudaBackend is a facade: it implements the Backend virtuals by launching the element-wise
// kernels itself (cuda_backend_ops.cpp) and delegating the rest to the classes it owns, each
// with one job (docs/ARCHITECTURE.md, "The GPU backend"):
//   DeviceArena      every device / pinned allocation, freed in its destructor
//   GraphCache       CUDA graphs of all-decode steps by batch bucket
//   OpTimer          per-op GPU time (BackendOptions::profile_ops)
//   StepPlan         the step metadata in one device buffer (StepDev views)
//   GemmDispatch     skinny GEMM / stacked GEMM / cuBLASLt, the algorithm cache
//   RopeTables       RoPE inverse frequencies
//   SparseRunner     KV and compressed-key caches, selection, attention of the sparse layers
//   LightningRunner  state slots, decay tables, recurrent / chunked lightning kernels
// Memory: weights, caches and workspaces are allocated at start (upload_weight, alloc,
// init_caches); a workspace grows in the step loop only past every earlier size, with a
// warning, dropping the graphs first.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_graph_cache.h"
#include "backend/cuda/cuda_lightning_runner.h"
#include "backend/cuda/cuda_op_timer.h"
#include "backend/cuda/cuda_rope_tables.h"
#include "backend/cuda/cuda_sparse_runner.h"
#include "backend/cuda/cuda_step_plan.h"
#include "backend/cuda/cuda_stream.h"

namespace sala {

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opts);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  // bf16 (fp32 mode: fp32) KV and compressed keys, or 1-byte FP8 codes
  // (BackendOptions::kv_cache_dtype, bf16 mode only)
  size_t kv_element_bytes() const override {
    return kv_fmt_ != cuda::kKvAct ? 1 : bf16_mode_ ? 2 : 4;
  }
  // FP8 KV caches: the K / V scales of every sparse layer, used by init_caches.
  void set_kv_scales(const std::vector<KvScales>& per_sparse_layer) override {
    kv_scales_ = per_sparse_layer;
  }
  size_t device_memory_total() const override;
  int int4_weight_copies() const override { return gemm_.int4_weight_copies(); }
  DType act_dtype() const override { return bf16_mode_ ? DType::BF16 : DType::F32; }

  Tensor alloc(int64_t rows, int64_t cols, DType dtype) override;
  Tensor upload_weight(const TensorView& src) override;
  // BackendOptions::fp8_weights: the projections are FP8_E4M3 (W8A8, GemmDispatch's FP8 path).
  // BackendOptions::int4_group_size: INT4_GROUPED (W4A16, GemmDispatch's int4 path).
  WeightFormat linear_format() const override {
    return fp8_ ? WeightFormat::FP8_E4M3
                : int4_group_ > 0 ? WeightFormat::INT4_GROUPED : weight_format();
  }
  // FP8_E4M3: quantized on the host with core/fp8.h's fp8_quantize_rows (the bits of the CPU
  // backend and `sala quantize`), then uploaded: codes [out, in] + scales [out].
  // INT4_GROUPED: core/int4.h's RTN on the host (the CPU backend's bits), then upload_int4's way.
  Weight upload_linear(const TensorView& src, WeightFormat format) override;
  // A compressed-tensors FP8 checkpoint's codes and per-channel scales, uploaded as they are.
  Weight upload_fp8(const TensorView& codes, const std::vector<float>& scales) override;
  // A pack-quantized W4A16 checkpoint's words [out, in / 8] and scales [out, in / group]:
  // uploaded, then repacked in place into the GEMV's nibble order (launch_int4_repack).
  Weight upload_int4(const TensorView& packed, const std::vector<float>& scales,
                     int32_t group) override;
  void init_caches(const ModelConfig& cfg, const CacheShape& shape) override;
  void copy_state_slot(int32_t src, int32_t dst) override { lightning_.copy_slot(src, dst); }
  void advance_lightning_states(const Tensor& k, const Tensor& v, int64_t layer_rows,
                                const std::vector<StateAdvance>& calls,
                                const std::vector<float>& slopes) override {
    lightning_.advance(k, v, layer_rows, calls, slopes);
  }
  void download_f32(const Tensor& src, float* dst) override;

  void begin_step(const StepMeta& meta) override;

  void embedding(const Tensor& table, float scale, Tensor& out) override;
  // With `next` an FP8 weight that takes out's rows in one run (GemmDispatch::
  // prepare_fp8_input), the norm kernel also writes out's FP8 codes and scales, and next's GEMM
  // launches no quantize kernel (launch_rmsnorm_fp8; the same bits).
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out,
               const Weight* next = nullptr) override;
  void add_scaled_rmsnorm(Tensor& h, const Tensor& a, float alpha, const Tensor& w, float eps,
                          Tensor& out, const Weight* next = nullptr) override;
  void linear_add_rmsnorm(const Tensor& x, const Weight& w, Tensor& y, Tensor& h, float alpha,
                          const Tensor& norm_w, float eps, Tensor& out,
                          const Weight* next = nullptr) override;
  void linear(const Tensor& x, const Weight& w, Tensor& y) override;
  void linear_multi(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys) override;
  void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& qn, const Tensor& kn, float eps,
                    int head_dim, double theta) override;
  // Where GemmDispatch has no one-kernel path (FP8 decode-only steps of 17..64 rows), the
  // composition's SiLU product also writes g's FP8 codes for an FP8 `next`
  // (launch_silu_mul_fp8); the GEMV's silu_pair epilogue cannot (a row spans its CTAs).
  void linear_silu_mul(const Tensor& x, const Weight& w, Tensor& g, Tensor& u,
                       const Weight* next = nullptr) override;
  void silu_mul(const Tensor& g, const Tensor& u, Tensor& out) override;
  void mul_sigmoid(const Tensor& a, const Tensor& gate, Tensor& out) override;
  // One kernel: the rmsnorm kernel of the row width with the gate applied before the store
  // (and out's FP8 codes as rmsnorm's, for an FP8 `next`).
  void rmsnorm_mul_sigmoid(const Tensor& a, const Tensor& w, float eps, const Tensor& gate,
                           Tensor& out, const Weight* next = nullptr) override;
  void div_scalar(Tensor& x, float d) override;
  void rope(Tensor& x, int head_dim, double theta) override;
  void lightning_attention(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                           const std::vector<float>& slopes, float scale, Tensor& out) override;
  // One kernel in steps whose calls all have < 64 tokens (LightningRunner::qk_attention).
  void lightning_qk_attention(int li, Tensor& q, Tensor& k, const Tensor& v, const Tensor& qn,
                              const Tensor& kn, float eps, int head_dim, double theta,
                              const std::vector<float>& slopes, float scale, Tensor& out) override;
  void sparse_attention(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                        Tensor& out) override;
  // Decode-only steps: the gate inside the combine kernel (SparseRunner).
  void sparse_attention_mul_sigmoid(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& gate, Tensor& out) override;
  void gather_logit_rows(const Tensor& x, Tensor& out) override;
  void copy_cols(const Tensor& src, int64_t c0, Tensor& dst) override;  // one 2-D async copy
  void row_sum_squares(const Tensor& a, Tensor& ss) override;
  void rmsnorm_mul_sigmoid_ss(const Tensor& a, const Tensor& ss, int64_t n, const Tensor& w,
                              float eps, const Tensor& gate, Tensor& out) override;
  void argmax_rows(const Tensor& logits, int32_t* out) override;
  void mask_logits(Tensor& logits, const int32_t* rows, int64_t n, const uint32_t* masks,
                   int32_t words) override;
  // cuda_sample.cu: one block per row; params, edits and rows go up in one copy, ids come
  // back in one (cuda_backend_sample.cpp).
  void sample_rows(const Tensor& logits, const int32_t* rows, int64_t n, const RowSampling* params,
                   const LogitEdit* edits, int32_t* out) override;
  void load_penalties(int32_t slot, int32_t vocab, const int32_t* prompt, int64_t n_prompt,
                      const int32_t* generated, int64_t n_generated) override;
  // cuda_logprobs.cu: one block per row; rows and targets go up in one copy, the
  // n * (1 + 2 * top_n) results come back in one (cuda_backend_sample.cpp). Backend's default
  // (download each row, logprobs_of_row on the host) stays callable as Backend::logprobs_rows.
  void logprobs_rows(const Tensor& logits, const int32_t* rows, const int32_t* targets, int64_t n,
                     int top_n, float* logprob, int32_t* top_ids, float* top_logprobs) override;
  bool samples_rows() const override { return true; }
  void synchronize() override;
  void bind_thread() override { device_.bind(); }
  // The GPU and the stream of every op (tensor parallelism's communicators, cuda_comm.h).
  int cuda_device() const { return device_.device(); }
  // Tensor-parallel ranks sharing this GPU (the tests on one GPU): a workspace that grows keeps
  // its old buffer until the backend goes, since cudaFree waits for the whole device, where
  // another rank's collective spins until this rank's next kernel (a deadlock).
  void share_device_with_ranks() { arena_.retain_released(); }
  cudaStream_t stream() const { return stream_.get(); }
  void report_op_profile(const std::string& label) override;

  bool graphs_enabled() const override { return graphs_.enabled(); }
  bool graph_launch(int key) override { return graphs_.launch(key); }
  bool graph_capture_begin(int key) override { return graphs_.capture_begin(key); }
  void graph_capture_end(int key) override { graphs_.capture_end(key); }

 private:
  bool is_act(const Tensor& t) const { return t.dtype == act_dtype(); }
  // Where a whole-row norm (n == out.cols) should write out's FP8 codes for `next`, or
  // {nullptr, nullptr} (GemmDispatch::prepare_fp8_input).
  cuda::Fp8Act fp8_codes_for(const Tensor& out, int64_t n, const Weight* next);
  cudaStream_t st() const { return stream_.get(); }
  void tick(const char* op) { timer_.tick(op); }
  const cuda_host::StepDev& sd() const { return plan_.dev(); }

  // A bf16 [rows, cols] weight quantized to FP8_E4M3 on the device (upload_linear's FP8 path
  // for bf16 checkpoints): fp8_quantize_rows's codes and scales.
  Weight quantize_fp8_on_device(const TensorView& src);
  // An FP8_E4M3 weight's device codes [rows, cols] and scales [rows], not yet filled; refuses
  // fp32 mode and input widths the FP8 GEMMs cannot read (cols % 16 != 0).
  Weight alloc_fp8_weight(const std::string& name, int64_t rows, int64_t cols);
  // Codes [rows, cols] and scales [rows] in device memory as an FP8_E4M3 weight.
  Weight upload_fp8_codes(const std::string& name, int64_t rows, int64_t cols,
                          const uint8_t* codes, const float* scales);
  // Packed words [rows, cols / 8] (checkpoint order, any alignment on the host) and scales [rows, cols / group] in device
  // memory as an INT4_GROUPED weight in the device layout.
  Weight upload_int4_words(const std::string& name, int64_t rows, int64_t cols, int32_t group,
                           const void* words, const float* scales);

  // The GPU of every member: declared first, so made first and destroyed last.
  cuda_host::DeviceSelect device_;
  bool bf16_mode_;
  bool fp8_;  // BackendOptions::fp8_weights
  bool fp8_producer_codes_;  // BackendOptions::fp8_producer_codes
  int kv_fmt_;  // BackendOptions::kv_cache_dtype as cuda::kKvAct / kKvE4m3 / kKvE5m2
  std::vector<KvScales> kv_scales_;  // set_kv_scales (empty: kDefaultKvScale)
  int32_t int4_group_;  // BackendOptions::int4_group_size
  int max_smem_optin_ = 0;
  // Members are destroyed in reverse order: the stream last, the arena's memory after every
  // class that refers to it.
  cuda_host::CudaStream stream_;
  cuda_host::DeviceArena arena_;
  cuda_host::GraphCache graphs_;
  cuda_host::OpTimer timer_;
  cuda_host::StepPlan plan_;
  cuda_host::GemmDispatch gemm_;
  cuda_host::RopeTables rope_;
  cuda_host::SparseRunner sparse_;
  cuda_host::LightningRunner lightning_;

  // Transfers to the host: argmax_rows' ids and the staging buffer of large download_f32s.
  int32_t* argmax_dev_ = nullptr;   // [argmax_cap_] device ids of argmax_rows
  int32_t* argmax_host_ = nullptr;  // pinned copy
  int64_t argmax_cap_ = 0;
  void* pinned_dl_ = nullptr;  // staging buffer of large download_f32 calls
  // mask_logits' rows and bitmasks on the device: [mask_cap_] int32 rows, then
  // [mask_cap_, mask_words_] uint32 masks.
  void* mask_dev_ = nullptr;
  int64_t mask_cap_ = 0;
  int32_t mask_words_ = 0;
  size_t pinned_dl_bytes_ = 0;
  // sample_rows: [params | edits | rows | ids] in one device buffer and its pinned twin
  // (capacities sample_cap_ rows, edit_cap_ edits); scratch rows [scratch_rows_, vocab] fp32;
  // penalty tables [pen_slots_, pen_vocab_] int32. Each grows on demand (sampling is never
  // recorded in a graph).
  void* sample_dev_ = nullptr;
  void* sample_host_ = nullptr;
  int64_t sample_cap_ = 0, edit_cap_ = 0;
  float* sample_scratch_ = nullptr;
  int64_t scratch_elems_ = 0;
  int32_t* pen_table_ = nullptr;
  int32_t pen_slots_ = 0, pen_vocab_ = 0;
  // logprobs_rows: [rows | targets] (2 * n int32) and [logprob | top_ids | top_logprobs]
  // (n * (1 + 2 * kMaxTopLogprobs) words at most), each in one device buffer and a pinned twin,
  // for lp_cap_ rows; grows on demand (never recorded in a graph).
  void* lp_dev_ = nullptr;
  void* lp_host_ = nullptr;
  int64_t lp_cap_ = 0;
};

}  // namespace sala
