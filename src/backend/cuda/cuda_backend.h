// The CUDA backend: bf16 activations and weights in device memory, one stream, cuBLASLt
// GEMMs, and kernels that round at exactly the points of the golden README §4 (the CPU
// backend in NumericMode::BF16 is the oracle; tests/ops compares every op with it). In fp32
// mode (NumericMode::F32) weights (exact upcasts), activations, KV cache and compressed keys
// are fp32 and nothing rounds to bf16: the same kernels instantiated for float, true-fp32
// GEMMs, and CUDA-core kernels in place of the bf16 tensor-core ones (flash prefill, GEMV,
// InfLLM-v2 selection and stage 2); the CPU backend in fp32 mode is that oracle.
//
// Memory: weights, caches and workspaces are allocated at start (upload_weight, alloc,
// init_caches). The per-step metadata (StepMeta) travels in one pinned blob to one device
// buffer in begin_step; its capacity grows only if a step exceeds every earlier size, with
// a warning (the model allocates its workspaces for max_step_tokens, which sizes it first).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"

namespace sala {

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opts);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  // bf16 (fp32 mode: fp32) KV and compressed keys
  size_t kv_element_bytes() const override { return bf16_mode_ ? 2 : 4; }
  size_t device_memory_total() const override;
  DType act_dtype() const override { return bf16_mode_ ? DType::BF16 : DType::F32; }

  Tensor alloc(int64_t rows, int64_t cols, DType dtype) override;
  Tensor upload_weight(const TensorView& src) override;
  void init_caches(const ModelConfig& cfg, const CacheShape& shape) override;
  void download_f32(const Tensor& src, float* dst) override;

  void begin_step(const StepMeta& meta) override;

  void embedding(const Tensor& table, float scale, Tensor& out) override;
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override;
  void add_scaled_rmsnorm(Tensor& h, const Tensor& a, float alpha, const Tensor& w, float eps,
                          Tensor& out) override;
  void linear(const Tensor& x, const Weight& w, Tensor& y) override;
  // One GEMM over all rows of x (skinny GEMM for ≤ 16 rows, cuBLASLt above).
  void linear_rows(const Tensor& x, const Tensor& w, Tensor& y);
  void linear_multi(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys) override;
  void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& qn, const Tensor& kn, float eps,
                    int head_dim, double theta) override;
  void linear_silu_mul(const Tensor& x, const Weight& w, Tensor& g, Tensor& u) override;
  void silu_mul(const Tensor& g, const Tensor& u, Tensor& out) override;
  void mul_sigmoid(const Tensor& a, const Tensor& gate, Tensor& out) override;
  // One kernel: the rmsnorm kernel of the row width with the gate applied before the store.
  void rmsnorm_mul_sigmoid(const Tensor& a, const Tensor& w, float eps, const Tensor& gate,
                           Tensor& out) override;
  void div_scalar(Tensor& x, float d) override;
  void rope(Tensor& x, int head_dim, double theta) override;
  void lightning_attention(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                           const std::vector<float>& slopes, float scale, Tensor& out) override;
  // One kernel in steps whose calls all have < 64 tokens (cuda_layers.cpp).
  void lightning_qk_attention(int li, Tensor& q, Tensor& k, const Tensor& v, const Tensor& qn,
                              const Tensor& kn, float eps, int head_dim, double theta,
                              const std::vector<float>& slopes, float scale, Tensor& out) override;
  void sparse_attention(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                        Tensor& out) override;
  // Decode-only steps: the gate inside the combine kernel (cuda_layers.cpp).
  void sparse_attention_mul_sigmoid(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& gate, Tensor& out) override;
  void gather_logit_rows(const Tensor& x, Tensor& out) override;
  void argmax_rows(const Tensor& logits, int32_t* out) override;
  void synchronize() override;

  bool graphs_enabled() const override { return graphs_on_; }
  bool graph_launch(int key) override;
  bool graph_capture_begin(int key) override;
  void graph_capture_end(int key) override;

  cudaStream_t stream() const { return stream_; }

  // Device views of the step metadata (valid after begin_step).
  struct StepDev {
    const int32_t* token_ids = nullptr;   // [T]
    const int32_t* positions = nullptr;   // [T]
    const int32_t* row_seq = nullptr;     // [T] index into seqs
    const cuda::DevSeq* seqs = nullptr;   // [S]
    const int32_t* page_table = nullptr;  // [P]
    const int32_t* logit_rows = nullptr;  // [R]
    const int32_t* short_seqs = nullptr;  // lightning: seqs with < 64 tokens
    const int32_t* long_seqs = nullptr;   // lightning: seqs with >= 64 tokens
    int T = 0, S = 0, P = 0, R = 0, n_short = 0, n_long = 0;
    const int2* tiles = nullptr;          // [n_tiles] (first row, rows) of <= 8 rows of one seq
    int n_tiles = 0;
    int n_sparse_seqs = 0;                // seqs whose sparse layers run InfLLM-v2
    int n_one_token = 0;                  // seqs with one token in this step (decode)
  };

 private:
  void* dev_alloc(size_t bytes);
  void ensure_row_capacity(int64_t rows, bool warn);
  void ensure_meta_capacity(size_t ints, bool warn);
  void upload_gla_tables(const std::vector<float>& slopes);
  template <typename T>
  cuda::GlaArgs<T> gla_args(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                            const std::vector<float>& slopes, float scale, Tensor& out);
  float* make_inv_freq(int head_dim, double theta);
  const float* inv_freq(int head_dim, double theta);
  void alloc_select_work(size_t pool_tokens);
  bool is_act(const Tensor& t) const { return t.dtype == act_dtype(); }
  int decode_attn_splits() const;  // parts of a decode row's attention in this step
  // sparse_attention for the activation type T (bf16, or float in fp32 mode); gate: multiplied
  // in by the combine kernel (only when every row of the step is split).
  template <typename T>
  void sparse_attention_t(int si, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                          const Tensor* gate = nullptr);
  void drop_graphs();  // recordings hold device pointers: dropped when a buffer moves
  // Per-op GPU time (SALA_CUDA_OPTIME=1): an event after every op; the time since the
  // previous event is the op's. Printed at exit, summed by op name.
  void tick(const char* op);
  void resolve_ticks();

  bool bf16_mode_;
  int32_t* argmax_dev_ = nullptr;   // [argmax_cap_] device ids of argmax_rows
  int32_t* argmax_host_ = nullptr;  // pinned copy
  int64_t argmax_cap_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  size_t lt_workspace_size_ = 32u << 20;
  struct AlgoEntry {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int, int, int>, AlgoEntry> algos_;
  std::vector<void*> allocations_;

  // Step metadata: host pinned blob -> device blob.
  const StepMeta* meta_ = nullptr;
  int32_t* meta_host_ = nullptr;
  int32_t* meta_dev_ = nullptr;
  size_t meta_cap_ints_ = 0;
  cudaEvent_t meta_copied_ = nullptr;
  StepDev sd_;

  // Caches.
  ModelConfig cfg_;
  CacheShape cache_shape_;
  bool caches_ready_ = false;
  struct SparseLayerCache {  // elements of kv_element_bytes(): bf16, or fp32 in fp32 mode
    void* k;   // [num_pages, page_size, kvh, d]
    void* v;
    void* c1;  // [num_pages, page_size / s1, kvh, d]
    void* c2;  // [num_pages, page_size / s2, kvh, d]
  };
  std::vector<SparseLayerCache> sparse_;
  float* states_ = nullptr;  // [num_slots, n_lightning, nh, d, d] fp32

  // Per-row workspaces (capacity rows_cap_).
  int64_t rows_cap_ = 0;
  int32_t* sel_ = nullptr;      // [rows, kvh, total_topk] selected blocks
  int32_t* sel_cnt_ = nullptr;  // [rows, kvh]
  float* attn_part_ = nullptr;  // split-K partials [attn_part_cap_ items, d] + (m, l)
  float* attn_ml_ = nullptr;
  int64_t attn_part_items_ = 0;  // capacity in (row, head, split) items

  // InfLLM-v2 selection workspaces, for kSelectChunkTiles tiles per launch (init_caches:
  // sized by the longest sequence the KV pool holds).
  static constexpr int kSelectChunkTiles = 512;
  static constexpr int kSelectSplits = 32;  // level-2 entry splits of one-token (decode) rows
  static constexpr int kScoreSplits = 64;   // level-1 entry splits of one-token rows
  cuda::SelectWork select_work_{};
  int select_nb_stride_ = 0, select_et_stride_ = 0;
  int64_t select_max_len_ = 0;  // longest sequence the workspaces hold
  int attn_nb_words_ = 0, attn_nkt_words_ = 0, attn_list_cap_ = 0;  // stage 2 shared memory

  // RoPE inverse frequencies by (head_dim, theta), computed on the host as the CPU does.
  std::map<std::pair<int, double>, float*> inv_freq_;
  // Lightning decay tables per head: [nh][kGlaChunk + 1] = exp(n g) (float of double).
  std::vector<float> gla_slopes_;
  float* gla_decay_ = nullptr;
  int gla_decay_cap_ = 0;
  // Chunk-parallel lightning prefill: per-chunk states, grown up to 128 MB (or one
  // window of one sequence) on the first long call.
  void* pinned_dl_ = nullptr;  // staging buffer of large download_f32 calls
  size_t pinned_dl_bytes_ = 0;
  float* gla_ws_ = nullptr;
  int64_t gla_ws_floats_ = 0;
  int max_smem_optin_ = 0;

  // CUDA graphs of decode steps, by batch-size bucket.
  struct GraphEntry {
    int seen = 0;
    cudaGraphExec_t exec = nullptr;
  };
  bool graphs_on_ = true;
  bool capturing_ = false;
  std::map<int, GraphEntry> graphs_;

  bool optime_ = false, optime_step_ = false;
  // SALA_CUDA_UNFUSE (A/B of the fused ops; names, comma-separated): "silu"
  // (linear_silu_mul), "gla" (lightning_qk_attention), "gate" (rmsnorm_mul_sigmoid),
  // "attngate" (sparse_attention_mul_sigmoid) run their two-op defaults.
  bool unfuse_silu_ = false, unfuse_gla_ = false, unfuse_gate_ = false, unfuse_attngate_ = false;
  bool unfuse_stack_ = false;  // "stack": one cuBLASLt GEMM per output of a stacked weight
  // Decode steps of 17..kStackMaxRows rows: a stacked weight's outputs from one cuBLASLt GEMM
  // into this [rows, N] bf16 buffer, then split (linear_multi) or combined (linear_silu_mul).
  static constexpr int64_t kStackMaxRows = 64;
  void* stack_ws_ = nullptr;
  int64_t stack_ws_elems_ = 0;
  bool stacked_gemm(const Tensor& x, const Tensor& w);  // grows stack_ws_ outside recordings
  std::vector<cudaEvent_t> tick_pool_;
  std::vector<std::pair<const char*, cudaEvent_t>> ticks_;
  std::map<std::string, std::pair<double, int64_t>> op_ms_;  // name -> (ms, calls)
  int64_t steps_timed_ = 0;
};

}  // namespace sala
