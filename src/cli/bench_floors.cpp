#include "cli/bench_floors.h"

#include <algorithm>

#include "backend/cache_layout.h"

namespace sala::cli {

// Attention FLOPs of prefilling L tokens in chunks of `chunk`, all layers. Sparse layers
// (SPEC §9.2-9.6): a chunk is dense or sparse by the sequence's length after it; per query
// token at position t, dense: q·k and p·v over t+1 keys; sparse: stage 1 over the level-1
// and level-2 entries visible at t, stage 2 over at most total_topk blocks. Lightning layers:
// the recurrent form's minimum, state update k·vᵀ and readout q·S (2·d² each per head).
double prefill_attention_flops(const sala::ModelConfig& c, int64_t L, int64_t chunk) {
  const auto& sp = c.sparse;
  const double qk = double(c.num_attention_heads) * c.head_dim;  // MACs of one q·k, all heads
  const int64_t selected = int64_t(sp.total_topk()) * sp.block_size;
  double sparse_layer = 0;
  for (int64_t off = 0; off < L; off += chunk) {
    const int64_t end = std::min(L, off + chunk);
    const bool sparse = sp.sparse_call(end, false);
    for (int64_t t = off; t < end; ++t) {
      if (!sparse) {
        sparse_layer += 4 * qk * double(t + 1);
        continue;
      }
      const int64_t n1 = sala::cache_layout::num_entries(t + 1, sp.kernel_size, sp.kernel_stride);
      const int64_t n2 = sala::cache_layout::num_entries(t + 1, sp.level2_window(), sp.level2_stride());
      sparse_layer += 2 * qk * double(n1 + n2) + 4 * qk * double(std::min(t + 1, selected));
    }
  }
  const double ld = c.lightning_head_dim;
  const double lightning_layer = 4.0 * c.lightning_nh * ld * ld * double(L);
  return sparse_layer * c.num_sparse_layers() + lightning_layer * c.num_lightning_layers();
}

// Bytes one sequence adds to a decode step at context C (bf16 caches, fp32 states; the
// step's length is C + 1): sparse layers read all K and V below dense_len, else the
// compressed keys and at most total_topk blocks of K and V; lightning layers read and write
// their [nh, d, d] state.
double decode_seq_bytes(const sala::ModelConfig& c, int64_t C) {
  const auto& sp = c.sparse;
  const int64_t L = C + 1;
  const double row = double(c.num_key_value_heads) * c.head_dim * 2;  // one token's K, bf16
  double kv = 2 * row * double(L);
  if (sp.sparse_call(L, false)) {
    const int64_t n1 = sala::cache_layout::num_entries(L, sp.kernel_size, sp.kernel_stride);
    const int64_t n2 = sala::cache_layout::num_entries(L, sp.level2_window(), sp.level2_stride());
    const int64_t selected = int64_t(sp.total_topk()) * sp.block_size;
    kv = row * double(n1 + n2) + 2 * row * double(std::min(L, selected));
  }
  const double ld = c.lightning_head_dim;
  const double state = 2 * double(c.lightning_nh) * ld * ld * 4;
  return kv * c.num_sparse_layers() + state * c.num_lightning_layers();
}

}  // namespace sala::cli
