// CUDA backend, host side: memory, step metadata, cuBLASLt GEMMs and the op dispatch. The
// kernels are in cuda_ops.cu, cuda_lightning.cu and cuda_sparse.cu (see cuda_kernels.h).
#include "backend/cuda/cuda_backend.h"

#include "backend/cuda/cuda_argmax.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/safetensors.h"

namespace sala {
using namespace sala::cuda;

namespace {

bool is_bf16(const Tensor& t) { return t.dtype == DType::BF16; }

int ptr_alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (u % uintptr_t(a)) != 0) a /= 2;
  return a;
}

template <typename T>
T* ptr(const Tensor& t) { return static_cast<T*>(t.data); }

}  // namespace

// ---- lifetime and memory -------------------------------------------------------------

CudaBackend::CudaBackend(const BackendOptions& opts) : bf16_mode_(opts.mode == NumericMode::BF16) {
  const char* no_graph = std::getenv("SALA_DISABLE_CUDA_GRAPH");
  graphs_on_ = opts.cuda_graphs && !(no_graph && *no_graph && std::strcmp(no_graph, "0") != 0);
  const char* optime = std::getenv("SALA_CUDA_OPTIME");
  optime_ = optime && *optime && std::strcmp(optime, "0") != 0;
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  SALA_CHECK(count > 0, "no CUDA device");
  // fp32 mode is the CPU backend's contract; the GPU path always computes the bf16
  // contract (it is what the golden README specifies for a GPU backend).
  if (!bf16_mode_)
    std::fprintf(stderr, "warning: the CUDA backend computes the bf16 contract; fp32 mode is "
                         "the CPU backend's\n");
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_smem_optin_, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
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
  const size_t row = size_t(cfg.num_key_value_heads) * cfg.head_dim;
  const size_t tokens = size_t(shape.num_pages) * shape.page_size;
  sparse_.resize(size_t(cfg.num_sparse_layers()));
  for (auto& c : sparse_) {
    c.k = static_cast<bf16*>(dev_alloc(tokens * row * 2));
    c.v = static_cast<bf16*>(dev_alloc(tokens * row * 2));
    c.c1 = static_cast<bf16*>(dev_alloc(tokens / size_t(sp.kernel_stride) * row * 2));
    c.c2 = static_cast<bf16*>(dev_alloc(tokens / size_t(sp.level2_stride()) * row * 2));
    CUDA_CHECK(cudaMemsetAsync(c.k, 0, tokens * row * 2, stream_));
    CUDA_CHECK(cudaMemsetAsync(c.v, 0, tokens * row * 2, stream_));
    CUDA_CHECK(cudaMemsetAsync(c.c1, 0, tokens / size_t(sp.kernel_stride) * row * 2, stream_));
    CUDA_CHECK(cudaMemsetAsync(c.c2, 0, tokens / size_t(sp.level2_stride()) * row * 2, stream_));
  }
  if (cfg.num_sparse_layers() > 0) alloc_select_work(tokens);
  const size_t d = size_t(cfg.lightning_head_dim);
  const size_t state_floats =
      size_t(shape.num_slots) * cfg.num_lightning_layers() * cfg.lightning_nh * d * d;
  states_ = static_cast<float*>(dev_alloc(state_floats * 4));
  CUDA_CHECK(cudaMemsetAsync(states_, 0, std::max<size_t>(state_floats * 4, 1), stream_));
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
  // Layout (int32 units): seqs | ids | positions | row_seq | pages | logit rows | short | long
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
    // SALA_CUDA_OPTIME=N (N > 1): only steps of at least N rows are timed.
    const long min_rows = std::strtol(std::getenv("SALA_CUDA_OPTIME"), nullptr, 10);
    optime_step_ = T >= min_rows;
    ticks_.clear();
    if (optime_step_) {
      ++steps_timed_;
      tick("begin_step");
    }
  }
}

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

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) {
  return std::make_unique<CudaBackend>(opts);
}

size_t CudaBackend::device_memory_total() const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b;
}

}  // namespace sala
