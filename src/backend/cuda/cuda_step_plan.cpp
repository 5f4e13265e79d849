#include "backend/cuda/cuda_step_plan.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_check.h"

namespace sala::cuda_host {
using namespace sala::cuda;

StepPlan::StepPlan(cudaStream_t stream, DeviceArena& arena, GraphCache& graphs)
    : stream_(stream), arena_(arena), graphs_(graphs) {
  CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  ensure_capacity(1 << 16, false);
}

StepPlan::~StepPlan() {
  if (copied_) cudaEventDestroy(copied_);
}

void StepPlan::ensure_capacity(size_t ints, bool warn) {
  if (ints <= cap_ints_) return;
  if (warn && cap_ints_ > 0)
    std::fprintf(stderr, "warning: cuda backend: step metadata of %zu ints exceeds the buffer "
                         "(%zu); growing it inside the step loop\n", ints, cap_ints_);
  graphs_.drop();
  if (host_) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    arena_.release_pinned(host_);
    arena_.release(dev_);
  }
  cap_ints_ = std::max(ints, cap_ints_ * 2);
  host_ = static_cast<int32_t*>(arena_.pinned(cap_ints_ * 4));
  dev_ = static_cast<int32_t*>(arena_.device(cap_ints_ * 4));
}

void StepPlan::begin(const StepMeta& meta, const SparseConfig& sparse) {
  meta_ = &meta;
  const int T = meta.num_tokens(), S = int(meta.seqs.size()), P = int(meta.page_table.size()),
            R = int(meta.logit_rows.size());
  constexpr int kSeqInts = int(sizeof(DevSeq) / 4);
  // Sizes in int32 units (the layout is below); tiles are (first row, rows) pairs.
  StepDev sd;
  sd.T = T, sd.S = S, sd.P = P, sd.R = R;
  int n_one = 0;
  for (const SeqSlice& s : meta.seqs) {
    n_one += s.num_tokens == 1;
    if (s.num_tokens > 1) {  // logit_rows ascend: count this call's
      const auto lo = std::lower_bound(meta.logit_rows.begin(), meta.logit_rows.end(), s.token_begin);
      const auto hi = std::lower_bound(lo, meta.logit_rows.end(), s.token_begin + s.num_tokens);
      sd.prompt_free = sd.prompt_free && hi - lo == s.num_tokens;
    }
  }
  sd.shared_tiles = T > kSplitCallRows && sd.prompt_free && n_one < S;
  // Rows of split calls (DevSeq::split_row) get a tile each, a split row's parts being what
  // its block's warps share; in shared_tiles steps a call's rows share tiles of up to 8.
  const bool shared = sd.shared_tiles;
  auto tile_rows = [shared](const SeqSlice& s) {
    return s.num_tokens <= kSplitCallRows && !shared ? 1 : kSparseTileRows;
  };
  int n_tiles = 0;
  for (const SeqSlice& s : meta.seqs) n_tiles += (s.num_tokens + tile_rows(s) - 1) / tile_rows(s);
  const size_t need = size_t(S) * kSeqInts + 3 * size_t(T) + size_t(P) + size_t(R) + 2 * size_t(S) +
                      2 * size_t(n_tiles) + 9;
  ensure_capacity(need, true);
  // The previous step's copy must have left the pinned buffer before it is rewritten.
  CUDA_CHECK(cudaEventSynchronize(copied_));
  int32_t* h = host_;
  size_t off = 0;
  auto dev = [&](size_t o) { return dev_ + o; };
  DevSeq* hs = reinterpret_cast<DevSeq*>(h);
  for (int i = 0; i < S; ++i) {
    const SeqSlice& s = meta.seqs[size_t(i)];
    DevSeq d{};
    d.token_begin = s.token_begin;
    d.num_tokens = s.num_tokens;
    d.state_slot = s.state_slot;
    d.state_dst_slot = s.dst_slot();
    d.page_begin = s.page_begin;
    d.num_pages = s.num_pages;
    d.past_len = s.past_len;
    d.sparse = sparse.sparse_call(s.total_len(), meta.dense_as_sparse) ? 1 : 0;
    sd.n_sparse_seqs += d.sparse;
    sd.n_one_token += s.num_tokens == 1;
    d.split_row = -1;
    if (s.num_tokens <= kSplitCallRows) {
      d.split_row = sd.n_split_rows;
      sd.n_split_rows += s.num_tokens;
      ++sd.n_split_seqs;
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
    for (int r = 0; r < s.num_tokens; r += tile_rows(s)) {
      h[off++] = s.token_begin + r;
      h[off++] = std::min(tile_rows(s), s.num_tokens - r);
    }
  sd.n_tiles = n_tiles;
  std::memcpy(h + off, meta.page_table.data(), size_t(P) * 4);
  sd.page_table = dev(off);
  off += size_t(P);
  CUDA_CHECK(cudaMemcpyAsync(dev_, host_, off * 4, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaEventRecord(copied_, stream_));
  sd_ = sd;
}

}  // namespace sala::cuda_host
