// Pool sizing (engine.h): bytes of one KV page and one lightning-state slot, and the step,
// logit-row and cache limits `sala serve` plans from its memory budget. Engine-independent
// arithmetic, shared by the server, bench offline, golden and fidelity.
#include <algorithm>
#include <climits>

#include "backend/cache_layout.h"
#include "engine/engine.h"

namespace sala {

size_t kv_bytes_per_page(const ModelConfig& c, int32_t page_size, size_t element_bytes) {
  const int64_t row = int64_t(c.num_key_value_heads) * c.head_dim;
  const int64_t per_layer = cache_layout::page_elements(page_size, row, c.sparse.kernel_stride,
                                                        c.sparse.level2_stride());
  return size_t(per_layer) * element_bytes * size_t(c.num_sparse_layers());
}

size_t state_bytes_per_slot(const ModelConfig& c) {
  const size_t d = size_t(c.lightning_head_dim);
  return size_t(c.num_lightning_layers()) * size_t(c.lightning_nh) * d * d * 4;
}

ModelLimits plan_limits(const ModelConfig& cfg, const EngineOptions& opts,
                        size_t memory_budget_bytes, int64_t max_total_tokens,
                        size_t kv_element_bytes) {
  ModelLimits lim;
  // A whole prefill chunk beside one decode row (a verify call with speculation) per running
  // request (see make_engine).
  const int32_t rows = 1 + std::max(0, opts.speculative.num_draft_tokens);
  const int32_t running = std::max(1, opts.max_running_requests);
  lim.max_step_tokens = std::max({1, opts.max_step_tokens,
                                  opts.chunked_prefill_size + running * rows});
  lim.max_logit_rows = running * rows;
  lim.caches.page_size = cfg.sparse.block_size;
  lim.caches.num_slots = running * (opts.speculative.enabled() ? 2 : 1);
  const int64_t ps = lim.caches.page_size;
  const int64_t ctx = opts.max_context_len > 0 ? opts.max_context_len
                                               : cfg.max_position_embeddings;
  const int64_t min_pages = cache_layout::pages_for(ctx, int(ps));
  int64_t pages;
  if (max_total_tokens > 0) {
    pages = cache_layout::pages_for(max_total_tokens, int(ps));
  } else {
    const size_t states = size_t(lim.caches.num_slots) * state_bytes_per_slot(cfg);
    const size_t left = memory_budget_bytes > states ? memory_budget_bytes - states : 0;
    pages = std::max<int64_t>(
        int64_t(left / kv_bytes_per_page(cfg, int32_t(ps), kv_element_bytes)), min_pages);
  }
  lim.caches.num_pages = int32_t(std::clamp<int64_t>(pages, 1, INT32_MAX / ps));
  return lim;
}

}  // namespace sala
