// CUDA backend, host side: memory, caches and workspaces, CUDA graphs, per-op timing and the
// step metadata. The op dispatch is in cuda_backend_ops.cpp (element-wise ops, norms,
// cuBLASLt / skinny GEMMs) and cuda_layers.cpp (lightning and sparse mixers); the kernels are
// declared in cuda_kernels.h.
#include "backend/cuda/cuda_backend.h"

#include "backend/cuda/cuda_argmax.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/safetensors.h"
#include "backend/cuda/cuda_host_util.h"

namespace sala {
using namespace sala::cuda;

using namespace sala::cuda_host;

// ---- lifetime and memory -------------------------------------------------------------

CudaBackend::CudaBackend(const BackendOptions& opts) : bf16_mode_(opts.mode == NumericMode::BF16) {
  const char* no_graph = std::getenv("SALA_DISABLE_CUDA_GRAPH");
  // fp32 mode (the correctness contract) runs eagerly: its GEMMs are cuBLASLt at every row
  // count, whose kernel choice depends on the rows, so a recording padded to its batch bucket
  // would not give the eager step's bits (measured: 27 of 48 steps differed in the last bits).
  graphs_on_ = opts.cuda_graphs && bf16_mode_ &&
               !(no_graph && *no_graph && std::strcmp(no_graph, "0") != 0);
  const char* optime = std::getenv("SALA_CUDA_OPTIME");
  optime_ = optime && *optime && std::strcmp(optime, "0") != 0;
  if (const char* u = std::getenv("SALA_CUDA_UNFUSE")) {
    const std::string list = std::string(",") + u + ",";
    const auto has = [&](const char* n) { return list.find(std::string(",") + n + ",") != std::string::npos; };
    unfuse_silu_ = has("silu"), unfuse_gla_ = has("gla"), unfuse_gate_ = has("gate");
    unfuse_attngate_ = has("attngate");
    unfuse_stack_ = has("stack");
  }
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  SALA_CHECK(count > 0, "no CUDA device");
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_smem_optin_, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  gemv_init();  // kernel attributes now, not inside a recorded step
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&meta_copied_, cudaEventDisableTiming));
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  CUDA_CHECK(cudaMalloc(&lt_workspace_, lt_workspace_size_));
  ensure_meta_capacity(1 << 16, false);
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (optime_) {
    resolve_ticks();
    std::vector<std::pair<double, std::string>> v;
    double total = 0;
    for (auto& [name, t] : op_ms_) v.push_back({t.first, name}), total += t.first;
    std::sort(v.rbegin(), v.rend());
    std::fprintf(stderr, "\n[optime] GPU time by op over %lld steps (eager steps only), %.3f ms total\n",
                 (long long)steps_timed_, total);
    for (auto& [ms, name] : v)
      std::fprintf(stderr, "[optime] %-28s %10.3f ms %6.1f%%  %8lld calls\n", name.c_str(), ms,
                   100 * ms / std::max(total, 1e-9), (long long)op_ms_[name].second);
  }
  for (cudaEvent_t e : tick_pool_) cudaEventDestroy(e);
  drop_graphs();
  for (auto& [key, e] : algos_) {
    cublasLtMatrixLayoutDestroy(e.a);
    cublasLtMatrixLayoutDestroy(e.b);
    cublasLtMatrixLayoutDestroy(e.d);
    cublasLtMatmulDescDestroy(e.op);
  }
  for (void* p : allocations_) cudaFree(p);
  for (auto& [key, p] : inv_freq_) cudaFree(p);
  if (meta_host_) cudaFreeHost(meta_host_);
  if (pinned_dl_) cudaFreeHost(pinned_dl_);
  if (meta_dev_) cudaFree(meta_dev_);
  if (gla_ws_) cudaFree(gla_ws_);
  if (lt_workspace_) cudaFree(lt_workspace_);
  if (argmax_host_) cudaFreeHost(argmax_host_);
  if (lt_) cublasLtDestroy(lt_);
  if (meta_copied_) cudaEventDestroy(meta_copied_);
  if (stream_) cudaStreamDestroy(stream_);
}

void* CudaBackend::dev_alloc(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  allocations_.push_back(p);
  return p;
}

Tensor CudaBackend::alloc(int64_t rows, int64_t cols, DType dtype) {
  Tensor t{nullptr, dtype, rows, cols};
  t.data = dev_alloc(t.nbytes());
  // Poison-free start: zero, as the CPU backend does.
  CUDA_CHECK(cudaMemsetAsync(t.data, 0, std::max<size_t>(t.nbytes(), 1), stream_));
  // The model allocates its workspaces for max_step_tokens rows: size the per-row
  // workspaces of the attention kernels for that many rows now, not in the step loop.
  ensure_row_capacity(rows, false);
  return t;
}

Tensor CudaBackend::upload_weight(const TensorView& src) {
  const int64_t cols = src.shape.empty() ? 1 : src.shape.back();
  if (!bf16_mode_) {  // fp32 mode: the checkpoint's values upcast exactly, as CpuBackend
    Tensor t = alloc(src.numel() / std::max<int64_t>(cols, 1), cols, DType::F32);
    std::vector<float> host(size_t(src.numel()));
    src.to_f32(host.data());
    CUDA_CHECK(cudaMemcpyAsync(t.data, host.data(), host.size() * 4, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return t;
  }
  Tensor t = alloc(src.numel() / std::max<int64_t>(cols, 1), cols, DType::BF16);
  std::vector<uint16_t> host(size_t(src.numel()));
  if (src.dtype == DType::BF16) {
    std::memcpy(host.data(), src.data, host.size() * 2);
  } else {
    std::vector<float> f(size_t(src.numel()));
    src.to_f32(f.data());
    for (size_t i = 0; i < f.size(); ++i) host[i] = f32_to_bf16(f[i]);
  }
  CUDA_CHECK(cudaMemcpyAsync(t.data, host.data(), host.size() * 2, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return t;
}

void CudaBackend::init_caches(const ModelConfig& cfg, const CacheShape& shape) {
  cfg_ = cfg;
  cache_shape_ = shape;
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
  sparse_.resize(size_t(cfg.num_sparse_layers()));
  for (auto& c : sparse_) {
    c.k = dev_alloc(tokens * row);
    c.v = dev_alloc(tokens * row);
    c.c1 = dev_alloc(tokens / size_t(sp.kernel_stride) * row);
    c.c2 = dev_alloc(tokens / size_t(sp.level2_stride()) * row);
    CUDA_CHECK(cudaMemsetAsync(c.k, 0, tokens * row, stream_));
    CUDA_CHECK(cudaMemsetAsync(c.v, 0, tokens * row, stream_));
    CUDA_CHECK(cudaMemsetAsync(c.c1, 0, tokens / size_t(sp.kernel_stride) * row, stream_));
    CUDA_CHECK(cudaMemsetAsync(c.c2, 0, tokens / size_t(sp.level2_stride()) * row, stream_));
  }
  if (cfg.num_sparse_layers() > 0) alloc_select_work(tokens);
  const size_t d = size_t(cfg.lightning_head_dim);
  const size_t state_floats =
      size_t(shape.num_slots) * cfg.num_lightning_layers() * cfg.lightning_nh * d * d;
  states_ = static_cast<float*>(dev_alloc(state_floats * 4));
  CUDA_CHECK(cudaMemsetAsync(states_, 0, std::max<size_t>(state_floats * 4, 1), stream_));
  // The stacked GEMM's output for the widest stacked weight at kStackMaxRows rows: gate_up
  // [2 I, H], or q/k/v/gate (≤ 4 H columns for the released shapes; a wider weight grows it
  // on first use, outside recordings: stacked_gemm).
  if (!stack_ws_) {
    const int64_t widest =
        std::max<int64_t>(2 * int64_t(cfg.intermediate_size), 4 * int64_t(cfg.hidden_size));
    stack_ws_elems_ = kStackMaxRows * widest;
    stack_ws_ = dev_alloc(size_t(stack_ws_elems_) * 2);
  }
  caches_ready_ = true;
  rows_cap_ = 0;  // re-size the per-row workspaces for this config
  ensure_row_capacity(256, false);
  if (cfg.lightning_nh > 0) upload_gla_tables(cfg.lightning_slopes());
  // The RoPE table of the model's lightning layers.
  const std::pair<int, double> rk{cfg.lightning_head_dim, cfg.rope_theta};
  if (cfg.lightning_head_dim > 0 && !inv_freq_.count(rk))
    inv_freq_[rk] = make_inv_freq(cfg.lightning_head_dim, cfg.rope_theta);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// Selection workspaces for the longest sequence the pool holds (SPEC §9.5 sizes):
// blocks nb = ceil(len / block), level-1 entry tiles ceil(len / stride1 / 64).
void CudaBackend::alloc_select_work(size_t pool_tokens) {
  const auto& sp = cfg_.sparse;
  int64_t max_len = int64_t(pool_tokens);
  if (cfg_.max_position_embeddings > 0) max_len = std::min<int64_t>(max_len, cfg_.max_position_embeddings);
  select_max_len_ = max_len;
  const int kvh = cfg_.num_key_value_heads, nh = cfg_.num_attention_heads;
  select_nb_stride_ = int((max_len + sp.block_size - 1) / sp.block_size) + 1;
  select_et_stride_ = int(max_len / sp.kernel_stride / kEntryTile) + 2;
  if (!bf16_mode_) {
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
  select_work_.ml = static_cast<float2*>(dev_alloc(ml_items * sizeof(float2)));
  select_work_.bscore = static_cast<bf16*>(dev_alloc(rows * kvh * size_t(select_nb_stride_) * 2));
  select_work_.edge = static_cast<float*>(dev_alloc(rows * kvh * size_t(select_et_stride_) * 4));
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
}

// inv_freq[j] = 1 / theta^(2j/d) in fp32, computed on the host exactly as CpuBackend does.
float* CudaBackend::make_inv_freq(int head_dim, double theta) {
  const int half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int j = 0; j < half; ++j)
    inv[size_t(j)] = 1.0f / std::pow(float(theta), float(2 * j) / float(head_dim));
  float* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(inv.size(), 1) * 4));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  CUDA_CHECK(cudaMemcpy(p, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  return p;
}

void CudaBackend::drop_graphs() {
  for (auto& [key, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

bool CudaBackend::graph_launch(int key) {
  auto it = graphs_.find(key);
  if (!graphs_on_ || it == graphs_.end() || !it->second.exec) return false;
  CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
  return true;
}

bool CudaBackend::graph_capture_begin(int key) {
  if (!graphs_on_) return false;
  // The first step of a shape runs directly: kernel attributes, cuBLASLt algorithms and
  // tables are set up outside any recording.
  if (graphs_[key].seen++ == 0) return false;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  return true;
}

void CudaBackend::graph_capture_end(int key) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  capturing_ = false;
  GraphEntry& g = graphs_[key];
  if (g.exec) CUDA_CHECK(cudaGraphExecDestroy(g.exec));
  CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
}

void CudaBackend::tick(const char* op) {
  if (!optime_ || !optime_step_ || capturing_) return;
  if (ticks_.size() >= tick_pool_.size()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    tick_pool_.push_back(e);
  }
  cudaEvent_t e = tick_pool_[ticks_.size()];
  CUDA_CHECK(cudaEventRecord(e, stream_));
  ticks_.push_back({op, e});
}

void CudaBackend::resolve_ticks() {
  if (ticks_.size() < 2) return ticks_.clear();
  CUDA_CHECK(cudaEventSynchronize(ticks_.back().second));
  for (size_t i = 1; i < ticks_.size(); ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ticks_[i - 1].second, ticks_[i].second));
    auto& a = op_ms_[ticks_[i].first];
    a.first += ms;
    a.second += 1;
  }
  ticks_.clear();
}

void CudaBackend::ensure_row_capacity(int64_t rows, bool warn) {
  if (!caches_ready_ || rows <= rows_cap_) return;
  drop_graphs();
  if (warn)
    std::fprintf(stderr, "warning: cuda backend: step of %lld rows exceeds the workspaces (%lld); "
                         "growing them inside the step loop\n",
                 (long long)rows, (long long)rows_cap_);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (void* p : {static_cast<void*>(sel_), static_cast<void*>(sel_cnt_),
                  static_cast<void*>(attn_part_), static_cast<void*>(attn_ml_)}) {
    if (!p) continue;
    CUDA_CHECK(cudaFree(p));
    allocations_.erase(std::remove(allocations_.begin(), allocations_.end(), p), allocations_.end());
  }
  rows_cap_ = rows;
  const int kvh = cfg_.num_key_value_heads, nh = cfg_.num_attention_heads, d = cfg_.head_dim;
  sel_ = static_cast<int32_t*>(dev_alloc(size_t(rows) * kvh * cfg_.sparse.total_topk() * 4));
  sel_cnt_ = static_cast<int32_t*>(dev_alloc(size_t(rows) * kvh * 4));
  // Split-K partials are only used while rows * kvh is small (decode-like steps): room for
  // 2048 (row, split) items per head.
  attn_part_items_ = int64_t(std::max(nh, 1)) * 2048;
  attn_part_ = static_cast<float*>(dev_alloc(size_t(attn_part_items_) * std::max(d, 1) * 4));
  attn_ml_ = static_cast<float*>(dev_alloc(size_t(attn_part_items_) * 2 * 4));
}

void CudaBackend::ensure_meta_capacity(size_t ints, bool warn) {
  if (ints <= meta_cap_ints_) return;
  if (warn && meta_cap_ints_ > 0)
    std::fprintf(stderr, "warning: cuda backend: step metadata of %zu ints exceeds the buffer "
                         "(%zu); growing it inside the step loop\n", ints, meta_cap_ints_);
  drop_graphs();
  if (meta_host_) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaFreeHost(meta_host_));
    CUDA_CHECK(cudaFree(meta_dev_));
  }
  meta_cap_ints_ = std::max(ints, meta_cap_ints_ * 2);
  CUDA_CHECK(cudaMallocHost(&meta_host_, meta_cap_ints_ * 4));
  CUDA_CHECK(cudaMalloc(&meta_dev_, meta_cap_ints_ * 4));
}

void CudaBackend::download_f32(const Tensor& src, float* dst) {
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src.dtype == DType::F32 && n >= (int64_t(1) << 18) && !capturing_) {
    // Large downloads (batched logits): through a pinned staging buffer, which the copy
    // engine writes at full speed, then one host memcpy.
    const size_t bytes = size_t(n) * 4;
    if (bytes > pinned_dl_bytes_) {
      if (pinned_dl_) CUDA_CHECK(cudaFreeHost(pinned_dl_));
      pinned_dl_ = nullptr;
      pinned_dl_bytes_ = 0;
      CUDA_CHECK(cudaMallocHost(&pinned_dl_, bytes));
      pinned_dl_bytes_ = bytes;
    }
    CUDA_CHECK(cudaMemcpyAsync(pinned_dl_, src.data, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(dst, pinned_dl_, bytes);
  } else if (src.dtype == DType::F32) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src.data, size_t(n) * 4, cudaMemcpyDeviceToHost, stream_));
  } else {
    SALA_CHECK(is_bf16(src), "download_f32 of {}", dtype_name(src.dtype));
    std::vector<uint16_t> tmp(static_cast<size_t>(n));
    CUDA_CHECK(cudaMemcpyAsync(tmp.data(), src.data, size_t(n) * 2, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(tmp[size_t(i)]);
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (optime_) resolve_ticks();
}

void CudaBackend::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

// ---- step metadata ---------------------------------------------------------------------

void CudaBackend::begin_step(const StepMeta& meta) {
  meta_ = &meta;
  const int T = meta.num_tokens(), S = int(meta.seqs.size()), P = int(meta.page_table.size()),
            R = int(meta.logit_rows.size());
  constexpr int kSeqInts = int(sizeof(DevSeq) / 4);
  // Sizes in int32 units (the layout is below); tiles are (first row, rows) pairs.
  int n_tiles = 0;
  for (const SeqSlice& s : meta.seqs) n_tiles += (s.num_tokens + kSparseTileRows - 1) / kSparseTileRows;
  const size_t need = size_t(S) * kSeqInts + 3 * size_t(T) + size_t(P) + size_t(R) + 2 * size_t(S) +
                      2 * size_t(n_tiles) + 9;
  ensure_meta_capacity(need, true);
  ensure_row_capacity(T, true);
  // The previous step's copy must have left the pinned buffer before it is rewritten.
  CUDA_CHECK(cudaEventSynchronize(meta_copied_));
  int32_t* h = meta_host_;
  StepDev sd;
  sd.T = T, sd.S = S, sd.P = P, sd.R = R;
  size_t off = 0;
  auto dev = [&](size_t o) { return meta_dev_ + o; };
  DevSeq* hs = reinterpret_cast<DevSeq*>(h);
  for (int i = 0; i < S; ++i) {
    const SeqSlice& s = meta.seqs[size_t(i)];
    DevSeq d{};
    d.token_begin = s.token_begin;
    d.num_tokens = s.num_tokens;
    d.state_slot = s.state_slot;
    d.page_begin = s.page_begin;
    d.num_pages = s.num_pages;
    d.past_len = s.past_len;
    d.sparse = (meta.dense_as_sparse || s.total_len() >= cfg_.sparse.dense_len) ? 1 : 0;
    sd.n_sparse_seqs += d.sparse;
    sd.n_one_token += s.num_tokens == 1;
    SALA_CHECK(!d.sparse || !caches_ready_ || cfg_.num_sparse_layers() == 0 ||
                   s.total_len() <= select_max_len_,
               "sequence of {} tokens is longer than the selection workspaces ({} tokens)",
               s.total_len(), select_max_len_);
    if (caches_ready_) {
      SALA_CHECK(s.total_len() <= int64_t(s.num_pages) * cache_shape_.page_size,
                 "sequence of {} tokens has only {} pages", s.total_len(), s.num_pages);
    }
    hs[i] = d;
  }
  // Layout: seqs | ids | positions | row_seq | logit rows | short | long | tiles | pages. The
  // pages (whose count varies from step to step) come last, so every offset depends only on
  // (S, T, R) and a recorded step reads the same addresses at every launch.
  sd.seqs = reinterpret_cast<const DevSeq*>(dev(0));
  off += size_t(S) * kSeqInts;
  std::memcpy(h + off, meta.token_ids.data(), size_t(T) * 4);
  sd.token_ids = dev(off);
  off += size_t(T);
  std::memcpy(h + off, meta.positions.data(), size_t(T) * 4);
  sd.positions = dev(off);
  off += size_t(T);
  for (int i = 0; i < S; ++i)
    for (int r = 0; r < meta.seqs[size_t(i)].num_tokens; ++r)
      h[off + size_t(meta.seqs[size_t(i)].token_begin + r)] = i;
  sd.row_seq = dev(off);
  off += size_t(T);
  std::memcpy(h + off, meta.logit_rows.data(), size_t(R) * 4);
  sd.logit_rows = dev(off);
  off += size_t(R);
  sd.short_seqs = dev(off);
  for (int i = 0; i < S; ++i)
    if (meta.seqs[size_t(i)].num_tokens < 64) h[off + size_t(sd.n_short++)] = i;
  off += size_t(sd.n_short);
  sd.long_seqs = dev(off);
  for (int i = 0; i < S; ++i)
    if (meta.seqs[size_t(i)].num_tokens >= 64) h[off + size_t(sd.n_long++)] = i;
  off += size_t(sd.n_long);
  off += off % 2;  // int2 alignment; the parity depends only on (S, T, R)
  sd.tiles = reinterpret_cast<const int2*>(dev(off));
  for (const SeqSlice& s : meta.seqs)
    for (int r = 0; r < s.num_tokens; r += kSparseTileRows) {
      h[off++] = s.token_begin + r;
      h[off++] = std::min(kSparseTileRows, s.num_tokens - r);
    }
  sd.n_tiles = n_tiles;
  std::memcpy(h + off, meta.page_table.data(), size_t(P) * 4);
  sd.page_table = dev(off);
  off += size_t(P);
  CUDA_CHECK(cudaMemcpyAsync(meta_dev_, meta_host_, off * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaEventRecord(meta_copied_, stream_));
  sd_ = sd;
  if (optime_) {
    resolve_ticks();  // the previous step's, when it downloaded nothing
    // SALA_CUDA_OPTIME=N (N > 1): only steps of at least N rows are timed (prefills);
    // N < 0: only steps of at most -N rows (decode steps, run eagerly with
    // SALA_DISABLE_CUDA_GRAPH=1).
    const long n = std::strtol(std::getenv("SALA_CUDA_OPTIME"), nullptr, 10);
    optime_step_ = n < 0 ? T <= -n : T >= n;
    ticks_.clear();
    if (optime_step_) {
      ++steps_timed_;
      tick("begin_step");
    }
  }
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) {
  return std::make_unique<CudaBackend>(opts);
}

size_t CudaBackend::device_memory_total() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b;
}

}  // namespace sala
