// Pool sizing (engine.h): bytes of one KV page and one lightning-state slot, and the step,
// logit-row and cache limits `sala serve` plans from its memory budget. Engine-independent
// arithmetic, shared by the server, bench offline, golden and fidelity.
#include <algorithm>
#include <climits>

#include "backend/cache_layout.h"
#include "core/check.h"
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
                        size_t kv_element_bytes, const ModelConfig* draft) {
  ModelLimits lim;
  // A whole prefill chunk beside one decode row (a verify call with speculation) per running
  // request (see make_engine).
  const int32_t rows = 1 + std::max(0, opts.speculative.num_draft_tokens);
  const int32_t running = std::max(1, opts.max_running_requests);
  lim.max_step_tokens = std::max({1, opts.max_step_tokens,
                                  opts.chunked_prefill_size + running * rows});
  lim.max_logit_rows = running * rows;
  // A verify step's rows are all logit rows: keep its lightning k / v for rollbacks, up to
  // kMaxKeepVerifyRows rows (the 9B: 2 x 24 layers x 8 KB per row, 201 MB at 512; a wider
  // verify step, 128+ requests drafting 4 tokens each, rolls back by recomputing).
  constexpr int32_t kMaxKeepVerifyRows = 512;
  lim.keep_verify_rows =
      opts.speculative.enabled() ? std::min(lim.max_logit_rows, kMaxKeepVerifyRows) : 0;
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
    size_t states = size_t(lim.caches.num_slots) * state_bytes_per_slot(cfg);
    size_t page_bytes = kv_bytes_per_page(cfg, int32_t(ps), kv_element_bytes);
    if (draft) {
      // The draft model's slots and its per-request extra pages are fixed costs; its KV for
      // a target page's tokens is paid with that page (rounded up per draft page).
      ModelLimits none = lim;
      none.caches.num_pages = 0;
      const ModelLimits d = plan_draft_limits(*draft, opts, none);
      const size_t dpage = kv_bytes_per_page(*draft, d.caches.page_size, kv_element_bytes);
      states += size_t(d.caches.num_slots) * state_bytes_per_slot(*draft) +
                size_t(d.caches.num_pages) * dpage;
      page_bytes += (dpage * size_t(ps) + size_t(d.caches.page_size) - 1) /
                    size_t(d.caches.page_size);
    }
    const size_t left = memory_budget_bytes > states ? memory_budget_bytes - states : 0;
    pages = std::max<int64_t>(int64_t(left / page_bytes), min_pages);
  }
  lim.caches.num_pages = int32_t(std::clamp<int64_t>(pages, 1, INT32_MAX / ps));
  return lim;
}

ModelLimits plan_draft_limits(const ModelConfig& draft, const EngineOptions& opts,
                              const ModelLimits& target) {
  ModelLimits d;
  const int32_t k = std::max(0, opts.speculative.num_draft_tokens);
  const int32_t running = std::max(1, opts.max_running_requests);
  const int64_t ps = draft.sparse.block_size;
  d.caches.page_size = int32_t(ps);
  d.caches.num_slots = 2 * running;  // a state slot and its snapshot per request
  // The target's tokens; then per request up to k - 1 fed drafts past them and the partial
  // page where its tokens end.
  const int64_t tokens = int64_t(target.caches.num_pages) * target.caches.page_size;
  const int64_t pages = cache_layout::pages_for(tokens, int(ps)) +
                        int64_t(running) * (cache_layout::pages_for(k, int(ps)) + 1);
  d.caches.num_pages = int32_t(std::clamp<int64_t>(pages, 1, INT32_MAX / ps));
  d.max_step_tokens = target.max_step_tokens + running * (1 + k);
  d.max_logit_rows = running;
  return d;
}

int32_t request_state_slots(const EngineOptions& o, const ModelLimits& lim) {
  // With speculation the upper half of the state slots holds the snapshots.
  return lim.caches.num_slots / (o.speculative.enabled() ? 2 : 1);
}

EngineOptions fit_engine_options(const EngineOptions& opts, const ModelConfig& cfg,
                                 const ModelLimits& lim) {
  EngineOptions o = opts;
  const SpeculativeOptions& so = o.speculative;
  SALA_CHECK(so.num_draft_tokens >= 0 && so.num_draft_tokens <= 15 && so.ngram_min >= 1 &&
                 so.ngram_max >= so.ngram_min,
             "speculative options: {} drafts (0..15), n-grams {}..{}", so.num_draft_tokens,
             so.ngram_min, so.ngram_max);
  // A running request may take 1 + num_draft_tokens rows and logit rows per step.
  const int32_t rows = 1 + so.num_draft_tokens;
  o.max_running_requests = std::min(
      {o.max_running_requests, request_state_slots(o, lim), lim.max_logit_rows / rows});
  o.max_step_tokens = std::min(o.max_step_tokens, lim.max_step_tokens);
  // Room for a whole chunk beside a decode row (verify call) of every running request, so
  // that prefill chunks (fixed boundaries, see scheduler.h) never starve behind decodes.
  o.max_step_tokens = std::min(std::max(o.max_step_tokens,
                                        o.chunked_prefill_size + o.max_running_requests * rows),
                               lim.max_step_tokens);
  o.chunked_prefill_size = std::max(
      1, std::min(o.chunked_prefill_size, o.max_step_tokens - o.max_running_requests * rows));
  if (o.max_context_len <= 0) o.max_context_len = cfg.max_position_embeddings;
  SALA_CHECK(o.max_running_requests > 0 && o.max_step_tokens > 0 &&
                 o.chunked_prefill_size > 0 && o.max_context_len > 0,
             "engine limits must be positive");
  return o;
}

}  // namespace sala
