// SparseRunner: the sparse layers (dense attention below dense_len, InfLLM-v2 above, SPEC §9)
// on the GPU. It owns the paged KV cache and the two compressed-key levels of every sparse
// layer (bf16, fp32 in fp32 mode, or FP8 codes with per-layer K / V scales: kv_fmt), the block-selection
// workspaces (sized at init_caches for the longest sequence the KV pool holds, capped at
// max_position_embeddings) and the per-row workspaces (selected blocks, split-K partials;
// sized for the model's max_step_tokens when it allocates its activations), and launches
// append / compress, stage 1 (selection), flash prefill, stage 2 and the combine kernel.
//
// Rows of one-token calls (decode) split their attention and selection over fixed part
// counts, so a recorded decode step launches the same grids at every context length and a
// row's numbers depend only on its own call.
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_graph_cache.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_op_timer.h"
#include "backend/cuda/cuda_step_plan.h"

namespace sala::cuda_host {

class SparseRunner {
 public:
  // attn_min_blocks: BackendOptions::attn_min_blocks (0: SMs / 2); attn_tma:
  // BackendOptions::sparse_attn_tma; kv_shadow_tokens: BackendOptions::fp8_kv_shadow_tokens.
  SparseRunner(bool bf16_mode, int max_smem_optin, int attn_min_blocks, bool attn_tma,
               int64_t kv_shadow_tokens, cudaStream_t stream, DeviceArena& arena,
               const StepPlan& plan, GraphCache& graphs, OpTimer& timer);
  SparseRunner(const SparseRunner&) = delete;
  SparseRunner& operator=(const SparseRunner&) = delete;

  // The caches and selection workspaces of cfg's sparse layers (init_caches). kv_fmt: kKvAct
  // (elements of the activation type) or kKvE4m3 / kKvE5m2 (one byte; bf16 mode only) with
  // scales[i] the K / V scales of sparse layer i (empty: kDefaultKvScale).
  void init(const ModelConfig& cfg, const CacheShape& shape, int kv_fmt,
            const std::vector<KvScales>& scales);
  // Bytes of one cache element (pool sizing): 1 for FP8, else 2 (bf16) or 4 (fp32 mode).
  size_t kv_element_bytes() const { return kv_fmt_ != cuda::kKvAct ? 1 : bf16_ ? 2 : 4; }
  // After init: the per-row workspaces for 256 rows; from now on ensure_rows sizes them.
  void start_rows();
  // Per-row workspaces for `rows` (no-op before start_rows or when they are large enough;
  // growing drops the graphs, with a warning when `warn`).
  void ensure_rows(int64_t rows, bool warn);
  // The planned step's sequences fit the selection workspaces and their pages (after
  // start_rows; StepPlan::begin ran).
  void check_step() const;
  const SparseConfig& sparse_config() const { return cfg_.sparse; }

  void attention(int si, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out);
  // Decode-only steps whose attention is split: the gate applied by the combine kernel.
  // false (nothing done) in other steps: the caller runs Backend's two-op default.
  bool attention_mul_sigmoid(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& gate, Tensor& out);

 private:
  bool is_act(const Tensor& t) const { return t.dtype == (bf16_ ? DType::BF16 : DType::F32); }
  void alloc_select_work(size_t pool_tokens);
  int decode_attn_splits() const;  // parts of a decode row's attention in this step
  int decode_parts_per_block(int row_blocks, int splits) const;
  // attention for the activation type T (bf16, or float in fp32 mode); gate: multiplied in by
  // the combine kernel (only when every row of the step is split).
  template <typename T>
  void attention_t(int si, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                   const Tensor* gate = nullptr);
  void capture_selections(int si) const;  // StepMeta::capture: the step's selected blocks
  void alloc_kv_shadow();
  // FP8 caches: the pages of the step's prompt chunks with sparse rows (the wgmma stage-2
  // kernel's) converted from sparse layer si's cache into the shadow, with their shadow page
  // table; false (nothing launched) where there is no shadow or they need more pages than it
  // has.
  bool fill_kv_shadow(int si, const cuda::CacheGeom& geo);

  bool bf16_;
  int max_smem_optin_;
  int min_blocks_;  // stage-2 decode grid target (decode_parts_per_block)
  bool attn_tma_;   // BackendOptions::sparse_attn_tma
  int64_t kv_shadow_tokens_;  // BackendOptions::fp8_kv_shadow_tokens
  cudaStream_t stream_;
  DeviceArena& arena_;
  const StepPlan& plan_;
  GraphCache& graphs_;
  OpTimer& timer_;

  ModelConfig cfg_;
  CacheShape shape_;
  bool ready_ = false;  // start_rows ran
  int kv_fmt_ = cuda::kKvAct;
  std::vector<cuda::KvScale> kv_scales_;  // per sparse layer (FP8 caches)
  struct LayerCache {  // elements of kv_element_bytes(): bf16, fp32 in fp32 mode, or FP8 codes
    void* k;   // [num_pages, page_size, kvh, d]
    void* v;
    void* c1;  // [num_pages, page_size / s1, kvh, d]
    void* c2;  // [num_pages, page_size / s2, kvh, d]
    bool has_maps = false;  // maps: the wgmma stage-2 kernel's TMA descriptors of k and v
    cuda::Sm90KvMaps maps{};
  };
  std::vector<LayerCache> caches_;
  // FP8 caches on Hopper (BackendOptions::fp8_kv_shadow_tokens): one layer's K / V pages as
  // bf16 code values [shadow_pages_, page_size, kvh, d], refilled per sparse layer of a step
  // with prompt chunks (fill_kv_shadow), their TMA maps, and the step's page table into them
  // (shadow_pt_ [shadow_pt_cap_]: entries of the converted sequences only).
  int64_t shadow_pages_ = 0;
  void* shadow_k_ = nullptr;
  void* shadow_v_ = nullptr;
  cuda::Sm90KvMaps shadow_maps_{};
  int32_t* shadow_pt_ = nullptr;
  int64_t shadow_pt_cap_ = 0;

  // Per-row workspaces (capacity rows_cap_).
  int64_t rows_cap_ = 0;
  int32_t* sel_ = nullptr;      // [rows, kvh, total_topk] selected blocks
  int32_t* sel_cnt_ = nullptr;  // [rows, kvh]
  float* attn_part_ = nullptr;  // split-K partials [attn_part_items_, d] + (m, l)
  float* attn_ml_ = nullptr;
  int64_t attn_part_items_ = 0;  // capacity in (row, head, split) items

  // InfLLM-v2 selection workspaces, for kSelectChunkTiles tiles per launch.
  static constexpr int kSelectChunkTiles = 512;
  static constexpr int kSelectSplits = 32;  // level-2 entry splits of one-token (decode) rows
  static constexpr int kScoreSplits = 64;   // level-1 entry splits of one-token rows
  cuda::SelectWork select_work_{};
  int select_nb_stride_ = 0, select_et_stride_ = 0;
  int64_t select_max_len_ = 0;  // longest sequence the workspaces hold
  int attn_nb_words_ = 0, attn_nkt_words_ = 0, attn_list_cap_ = 0;  // stage 2 shared memory
  bool sm90_prefill_ok_ = false;  // launch_sparse_attention_sm90 takes prompt chunks' rows
};

}  // namespace sala::cuda_host
