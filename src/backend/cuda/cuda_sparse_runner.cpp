// SparseRunner's caches, workspaces and step checks; the attention itself is in
// cuda_sparse_attention.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "backend/cache_layout.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_sparse_runner.h"
#include "core/check.h"

namespace sala::cuda_host {
using namespace sala::cuda;

SparseRunner::SparseRunner(bool bf16_mode, int max_smem_optin, int attn_min_blocks,
                           bool attn_tma, int64_t kv_shadow_tokens, cudaStream_t stream,
                           DeviceArena& arena, const StepPlan& plan, GraphCache& graphs,
                           OpTimer& timer)
    : bf16_(bf16_mode), max_smem_optin_(max_smem_optin), attn_tma_(attn_tma),
      kv_shadow_tokens_(kv_shadow_tokens), stream_(stream), arena_(arena), plan_(plan),
      graphs_(graphs), timer_(timer) {
  int dev = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  min_blocks_ = attn_min_blocks > 0 ? attn_min_blocks : std::max(1, sms / 2);
}

void SparseRunner::init(const ModelConfig& cfg, const CacheShape& shape, int kv_fmt,
                        const std::vector<KvScales>& scales) {
  cfg_ = cfg;
  shape_ = shape;
  SALA_CHECK(kv_fmt == kKvAct || bf16_, "an FP8 KV cache runs in bf16 mode only");
  kv_fmt_ = kv_fmt;
  SALA_CHECK(scales.empty() || int(scales.size()) == cfg.num_sparse_layers(),
             "{} KV scales for {} sparse layers", scales.size(), cfg.num_sparse_layers());
  kv_scales_.assign(size_t(cfg.num_sparse_layers()), KvScale{kDefaultKvScale, kDefaultKvScale});
  for (size_t i = 0; i < scales.size(); ++i) {
    SALA_CHECK(scales[i].k > 0.f && scales[i].v > 0.f && std::isfinite(scales[i].k) &&
                   std::isfinite(scales[i].v),
               "KV scales ({}, {}) of sparse layer {} must be finite and > 0", scales[i].k,
               scales[i].v, i);
    kv_scales_[i] = KvScale{scales[i].k, scales[i].v};
  }
  const auto& sp = cfg.sparse;
  SALA_CHECK(shape.page_size % sp.block_size == 0, "page size {} not a multiple of block {}",
             shape.page_size, sp.block_size);
  SALA_CHECK(shape.page_size % sp.level2_stride() == 0 && shape.page_size % sp.kernel_stride == 0,
             "page size {} not a multiple of the compression strides", shape.page_size);
  SALA_CHECK(cfg.num_attention_heads % cfg.num_key_value_heads == 0);
  if (cfg.num_sparse_layers() > 0) {
    // The InfLLM-v2 kernels walk keys in 64-key tiles and level-1 entries in 64-entry tiles:
    // a block must tile 64 keys evenly, and the pool window (block / stride entries) 64
    // entries. The released config (block 64, stride 16) and the tiny ones (16, 4) do.
    const int bs = sp.block_size, r = sp.block_size / sp.kernel_stride;
    SALA_CHECK((bs % 64 == 0 || 64 % bs == 0) && kEntryTile % r == 0,
               "the CUDA backend supports sparse block sizes that divide or are multiples of 64 "
               "tokens with block / kernel_stride dividing 64 (config: block {}, stride {})",
               bs, sp.kernel_stride);
  }
  const size_t row = size_t(cfg.num_key_value_heads) * cfg.head_dim * kv_element_bytes();
  const size_t tokens = size_t(shape.num_pages) * shape.page_size;
  // Bytes of K / V and of each compressed level (cache_layout: whole entries per page).
  const size_t kv_bytes = tokens * row;
  const size_t c1_bytes = size_t(shape.num_pages) *
                          size_t(cache_layout::entries_per_page(shape.page_size, sp.kernel_stride)) * row;
  const size_t c2_bytes = size_t(shape.num_pages) *
                          size_t(cache_layout::entries_per_page(shape.page_size, sp.level2_stride())) * row;
  caches_.resize(size_t(cfg.num_sparse_layers()));
  for (auto& c : caches_) {
    c.k = arena_.device(kv_bytes);
    c.v = arena_.device(kv_bytes);
    c.c1 = arena_.device(c1_bytes);
    c.c2 = arena_.device(c2_bytes);
    CUDA_CHECK(cudaMemsetAsync(c.k, 0, kv_bytes, stream_));
    CUDA_CHECK(cudaMemsetAsync(c.v, 0, kv_bytes, stream_));
    CUDA_CHECK(cudaMemsetAsync(c.c1, 0, c1_bytes, stream_));
    CUDA_CHECK(cudaMemsetAsync(c.c2, 0, c2_bytes, stream_));
  }
  if (cfg.num_sparse_layers() > 0) alloc_select_work(tokens);
  if (sm90_prefill_ok_ && attn_tma_ && bf16_)
    for (auto& c : caches_)
      c.has_maps = make_sparse_attn_sm90_maps(c.k, c.v, int64_t(tokens), cfg.num_key_value_heads,
                                              shape.page_size, kv_fmt_, &c.maps);
  alloc_kv_shadow();
}

void SparseRunner::alloc_kv_shadow() {
  if (kv_fmt_ == kKvAct || !sm90_prefill_ok_ || !attn_tma_ || kv_shadow_tokens_ == 0 ||
      caches_.empty() || !caches_[0].has_maps)
    return;
  // The bf16 kernel's shared memory (5 ring slots, no staging) must fit as the FP8 one's does.
  SparseAttnParams sa{};
  sa.nb_words = attn_nb_words_, sa.nkt_words = attn_nkt_words_, sa.list_cap = attn_list_cap_;
  if (sparse_attn_sm90_smem_bytes(sa) + 4096 > size_t(max_smem_optin_)) return;
  // No sequence is longer than the selection workspaces hold (check_step); -1 holds one such
  // sequence, up to kMaxAutoShadowTokens (1 GB for the 9B: a config without
  // max_position_embeddings sizes the workspaces by the whole pool).
  constexpr int64_t kMaxAutoShadowTokens = int64_t(1) << 20;
  const int64_t tokens = kv_shadow_tokens_ < 0
                             ? std::min(select_max_len_, kMaxAutoShadowTokens)
                             : std::min(kv_shadow_tokens_, select_max_len_);
  const int64_t pages = (tokens + shape_.page_size - 1) / shape_.page_size;
  const int64_t shadow_tokens = pages * shape_.page_size;
  const size_t bytes = size_t(shadow_tokens) * size_t(cfg_.num_key_value_heads) * cfg_.head_dim * 2;
  void* k = arena_.device(bytes);
  void* v = arena_.device(bytes);
  if (!make_sparse_attn_sm90_maps(k, v, shadow_tokens, cfg_.num_key_value_heads,
                                  shape_.page_size, kKvAct, &shadow_maps_)) {
    arena_.release(k);
    arena_.release(v);
    return;
  }
  shadow_k_ = k, shadow_v_ = v, shadow_pages_ = pages;
}

bool SparseRunner::fill_kv_shadow(int si, const CacheGeom& geo) {
  if (shadow_pages_ == 0) return false;
  const StepMeta& meta = *plan_.meta();
  // The wgmma kernel's sequences (DevSeq: sparse, split_row < 0) and the pages their keys
  // 0 .. total_len span.
  auto pages_of = [&](int i) -> int64_t {
    const SeqSlice& s = meta.seqs[size_t(i)];
    if (!plan_.seq_sparse(i) || s.num_tokens <= kSplitCallRows) return 0;
    return (s.total_len() + shape_.page_size - 1) / shape_.page_size;
  };
  int64_t need = 0;
  for (int i = 0; i < int(meta.seqs.size()); ++i) need += pages_of(i);
  if (need == 0 || need > shadow_pages_) return false;
  const int64_t pt = int64_t(meta.page_table.size());
  if (pt > shadow_pt_cap_) {
    SALA_CHECK(!graphs_.capturing(), "the KV shadow's page table grown inside a recorded step");
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // no kernel still reads the old table
    arena_.release(shadow_pt_);
    shadow_pt_cap_ = std::max<int64_t>(pt, 2 * shadow_pt_cap_);
    shadow_pt_ = static_cast<int32_t*>(arena_.device(size_t(shadow_pt_cap_) * 4));
  }
  const LayerCache& sc = caches_[size_t(si)];
  int base = 0;
  for (int i = 0; i < int(meta.seqs.size()); ++i) {
    const int n = int(pages_of(i));
    launch_kv_pages_bf16(kv_fmt_, plan_.dev().page_table, meta.seqs[size_t(i)].page_begin, n,
                         base, geo, static_cast<const uint8_t*>(sc.k),
                         static_cast<const uint8_t*>(sc.v), static_cast<bf16*>(shadow_k_),
                         static_cast<bf16*>(shadow_v_), shadow_pt_, stream_);
    base += n;
  }
  return true;
}

// Selection workspaces for the longest sequence the pool holds (SPEC §9.5 sizes):
// blocks nb = ceil(len / block), level-1 entry tiles ceil(len / stride1 / 64).
void SparseRunner::alloc_select_work(size_t pool_tokens) {
  const auto& sp = cfg_.sparse;
  int64_t max_len = int64_t(pool_tokens);
  if (cfg_.max_position_embeddings > 0) max_len = std::min<int64_t>(max_len, cfg_.max_position_embeddings);
  select_max_len_ = max_len;
  const int kvh = cfg_.num_key_value_heads, nh = cfg_.num_attention_heads;
  select_nb_stride_ = int((max_len + sp.block_size - 1) / sp.block_size) + 1;
  select_et_stride_ = int(max_len / sp.kernel_stride / kEntryTile) + 2;
  if (!bf16_) {
    // fp32 mode: one kernel per (row, KV head) with its level-1 scores and block scores in
    // shared memory (cuda_f32_select.cu); stage 2 needs no workspace.
    const size_t smem = f32_select_smem_bytes(nh / kvh, cfg_.head_dim, select_nb_stride_,
                                              sp.block_size / sp.kernel_stride);
    SALA_CHECK(smem <= size_t(max_smem_optin_),
               "fp32 mode: sequences of {} tokens need {} bytes of shared memory for the block "
               "selection, more than the GPU has",
               max_len, smem);
    return;
  }
  const size_t rows = size_t(kSelectChunkTiles) * kSparseTileRows;
  // lse partials: kSelectSplits per row (only decode rows use more than the first).
  const size_t ml_items = rows * kSelectSplits * size_t(nh);
  select_work_.ml = static_cast<float2*>(arena_.device(ml_items * sizeof(float2)));
  select_work_.bscore = static_cast<bf16*>(arena_.device(rows * kvh * size_t(select_nb_stride_) * 2));
  select_work_.edge = static_cast<float*>(arena_.device(rows * kvh * size_t(select_et_stride_) * 4));
  SALA_CHECK(select_topk_smem_bytes(select_nb_stride_) + 4096 <= size_t(max_smem_optin_),
             "sequences of {} tokens need more shared memory for top-k than the GPU has", max_len);
  // Stage 2: per-row block bitmaps, the union bitmap of 64-key tiles and its list.
  const int64_t nkt = (max_len + 63) / 64;
  attn_nb_words_ = (select_nb_stride_ + 31) / 32;
  attn_nkt_words_ = int((nkt + 31) / 32);
  attn_list_cap_ = int(std::min<int64_t>(
      nkt, int64_t(kSparseTileRows) * sp.total_topk() * std::max(1, (sp.block_size + 63) / 64)));
  SparseAttnParams sa{};
  sa.nb_words = attn_nb_words_, sa.nkt_words = attn_nkt_words_, sa.list_cap = attn_list_cap_;
  SALA_CHECK(sparse_attn_smem_bytes(cfg_.head_dim, sa) + 4096 <= size_t(max_smem_optin_),
             "sequences of {} tokens need more shared memory for sparse attention than the GPU has",
             max_len);
  // Hopper: prompt chunks' sparse rows on the wgmma kernel where it fits, else on the above.
  sa.kv_fmt = kv_fmt_;  // FP8: the wgmma kernel's staging buffers too
  sm90_prefill_ok_ = sparse_attn_sm90_supported(cfg_.head_dim, nh / kvh) &&
                     sparse_attn_sm90_smem_bytes(sa) + 4096 <= size_t(max_smem_optin_);
}

void SparseRunner::start_rows() {
  ready_ = true;
  rows_cap_ = 0;  // re-size the per-row workspaces for this config
  ensure_rows(256, false);
}

void SparseRunner::ensure_rows(int64_t rows, bool warn) {
  if (!ready_ || rows <= rows_cap_) return;
  graphs_.drop();
  if (warn)
    std::fprintf(stderr, "warning: cuda backend: step of %lld rows exceeds the workspaces (%lld); "
                         "growing them inside the step loop\n",
                 (long long)rows, (long long)rows_cap_);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (void* p : {static_cast<void*>(sel_), static_cast<void*>(sel_cnt_),
                  static_cast<void*>(attn_part_), static_cast<void*>(attn_ml_)})
    arena_.release(p);
  rows_cap_ = rows;
  const int kvh = cfg_.num_key_value_heads, nh = cfg_.num_attention_heads, d = cfg_.head_dim;
  sel_ = static_cast<int32_t*>(arena_.device(size_t(rows) * kvh * cfg_.sparse.total_topk() * 4));
  sel_cnt_ = static_cast<int32_t*>(arena_.device(size_t(rows) * kvh * 4));
  // Split-K partials of the rows of split calls (decode, verify): room for 256 rows of
  // kDecodeAttnSplits parts per head (a B = 64 verify step of 1 + 3 rows each).
  attn_part_items_ = int64_t(std::max(nh, 1)) * 256 * kDecodeAttnSplits;
  attn_part_ = static_cast<float*>(arena_.device(size_t(attn_part_items_) * std::max(d, 1) * 4));
  attn_ml_ = static_cast<float*>(arena_.device(size_t(attn_part_items_) * 2 * 4));
}

void SparseRunner::check_step() const {
  if (!ready_) return;
  const StepMeta& meta = *plan_.meta();
  for (int i = 0; i < int(meta.seqs.size()); ++i) {
    const SeqSlice& s = meta.seqs[size_t(i)];
    SALA_CHECK(!plan_.seq_sparse(i) || cfg_.num_sparse_layers() == 0 ||
                   s.total_len() <= select_max_len_,
               "sequence of {} tokens is longer than the selection workspaces ({} tokens)",
               s.total_len(), select_max_len_);
    SALA_CHECK(s.total_len() <= int64_t(s.num_pages) * shape_.page_size,
               "sequence of {} tokens has only {} pages", s.total_len(), s.num_pages);
  }
}

// Parts of a split row's attention (kDecodeAttnSplits, a fixed count so that a recorded
// decode step launches the same grids at every length), fewer only where the partials of
// the step's split rows would not fit attn_part_ (256 rows).
int SparseRunner::decode_attn_splits() const {
  int splits = kDecodeAttnSplits;
  const int64_t per_split = int64_t(plan_.dev().n_split_rows) * cfg_.num_attention_heads;
  while (splits > 1 && per_split * splits > attn_part_items_) --splits;
  return splits;
}

// Decode parts per stage-2 block (SparseAttnParams::spb): the largest power of two ≤
// kSparseTileRows that still launches ≥ min_blocks_ blocks (SMs / 2 unless
// BackendOptions::attn_min_blocks says otherwise; tests force 8 parts per block with 1), from
// the step's (row tile, KV head) count only, so a recorded step keeps its grid. The stage-2
// block needs most of an SM's shared memory: with one part per block a large decode batch
// makes many blocks of one computing warp, one block per SM at a time.
int SparseRunner::decode_parts_per_block(int row_blocks, int splits) const {
  int spb = 1;
  while (2 * spb <= kSparseTileRows &&
         int64_t(row_blocks) * ((splits + 2 * spb - 1) / (2 * spb)) >= min_blocks_)
    spb *= 2;
  return spb;
}

}  // namespace sala::cuda_host
