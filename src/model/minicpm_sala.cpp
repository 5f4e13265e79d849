#include "model/minicpm_sala.h"

#include <algorithm>

#include "backend/gla.h"
#include "core/check.h"
#include "model/tensor_parallel.h"

namespace sala {

Model::Model(ModelConfig cfg, std::unique_ptr<Backend> backend, const Checkpoint& ckpt,
             const ModelLimits& limits, std::vector<std::unique_ptr<Backend>> peers)
    : cfg_(std::move(cfg)), limits_(limits), backend_(std::move(backend)) {
  backend_->bind_thread();  // this thread's calls below go to its device
  if (!peers.empty()) {
    // Tensor parallelism (model/tensor_parallel.h): each rank loads its shard of the weights
    // into its own backend (the CPU's, or one GPU each over NCCL): dense, or a quantized
    // checkpoint's codes and scales. Load-time quantization would see part of a row.
    const int n = 1 + int(peers.size());
    if (backend_->linear_format() != backend_->weight_format())
      fail("--tp-size {}: --quantization (quantizing at load) is not split over ranks; write a "
           "quantized checkpoint with `sala quantize` and serve that", n);
    check_tp_config(cfg_, n);
  }
  // With tensor parallelism, w_ is rank 0's shard (TensorParallel loads the other ranks').
  const int n_ranks = 1 + int(peers.size());
  w_ = load_weights(cfg_, ckpt, *backend_, &unused_, tp_shard(cfg_, n_ranks, 0));
  slopes_ = cfg_.lightning_slopes();
  if (!peers.empty()) {
    // Recorded steps pad with a page and a slot past the engine's, on every rank.
    ModelLimits rank_limits = limits_;
    if (backend_->graphs_enabled()) {
      scratch_page_ = rank_limits.caches.num_pages++;
      scratch_slot_ = rank_limits.caches.num_slots++;
    }
    tp_ = std::make_unique<TensorParallel>(cfg_, ckpt, *backend_, w_, std::move(peers),
                                           rank_limits, load_kv_scales(cfg_, ckpt));
    // Rank 0's full logits (gathered vocab shards) are the Model's workspace, as with one rank.
    logits_ = backend_->alloc(limits_.max_logit_rows, cfg_.vocab_size, DType::F32);
    iota_.resize(size_t(limits_.max_logit_rows));
    for (size_t i = 0; i < iota_.size(); ++i) iota_[i] = int32_t(i);
    return;
  }
  CacheShape caches = limits_.caches;
  if (backend_->graphs_enabled()) {
    scratch_page_ = caches.num_pages++;
    scratch_slot_ = caches.num_slots++;
  }
  backend_->set_kv_scales(load_kv_scales(cfg_, ckpt));
  backend_->init_caches(cfg_, caches);
  const int64_t T = limits_.max_step_tokens, H = cfg_.hidden_size;
  const int64_t qd = int64_t(cfg_.num_attention_heads) * cfg_.head_dim;
  const int64_t ld = int64_t(cfg_.lightning_nh) * cfg_.lightning_head_dim;
  const int64_t wide = std::max(qd, ld);
  const DType a = backend_->act_dtype();
  h_ = backend_->alloc(T, H, a);
  x_ = backend_->alloc(T, H, a);
  q_ = backend_->alloc(T, wide, a);
  k_ = backend_->alloc(T, wide, a);
  v_ = backend_->alloc(T, wide, a);
  gate_ = backend_->alloc(T, wide, a);
  attn_ = backend_->alloc(T, wide, a);
  mix_ = backend_->alloc(T, H, a);
  mlp_g_ = backend_->alloc(T, cfg_.intermediate_size, a);
  mlp_u_ = backend_->alloc(T, cfg_.intermediate_size, a);
  logit_in_ = backend_->alloc(limits_.max_logit_rows, H, a);
  logits_ = backend_->alloc(limits_.max_logit_rows, cfg_.vocab_size, DType::F32);
  iota_.resize(size_t(limits_.max_logit_rows));
  for (size_t i = 0; i < iota_.size(); ++i) iota_[i] = int32_t(i);
  const int64_t nl = cfg_.num_lightning_layers();
  if (limits_.keep_verify_rows > 0 && nl > 0) {
    keep_k_ = backend_->alloc(nl * limits_.keep_verify_rows, ld, a);
    keep_v_ = backend_->alloc(nl * limits_.keep_verify_rows, ld, a);
  }
}

Model::~Model() = default;

int Model::tp_size() const { return tp_ ? tp_->size() : 1; }

void Model::copy_state_slot(int32_t src, int32_t dst) {
  flush_state_advances();
  if (tp_) tp_->copy_state_slot(mem_slot(src), mem_slot(dst));
  else backend_->copy_state_slot(mem_slot(src), mem_slot(dst));
}

void Model::snapshot_state(int32_t slot, int32_t snapshot_slot) {
  const int32_t n = limits_.caches.num_slots;
  SALA_CHECK(slot >= 0 && slot < n && snapshot_slot >= 0 && snapshot_slot < n &&
                 slot != snapshot_slot,
             "snapshot of state slot {} into {} of {}", slot, snapshot_slot, n);
  if (slot_mem_.empty())
    for (int32_t i = 0; i < n; ++i) slot_mem_.push_back(i);
  pending_snapshots_.emplace_back(slot, snapshot_slot);
}

const StepMeta& Model::map_state_slots(const StepMeta& meta) {
  if (slot_mem_.empty()) return meta;
  mapped_ = meta;
  for (SeqSlice& s : mapped_.seqs) {
    s.state_slot = mem_slot(s.state_slot);
    if (s.state_dst_slot >= 0) s.state_dst_slot = mem_slot(s.state_dst_slot);  // a caller's own
  }
  // A snapshot waits for the first step with a call on its slot.
  size_t kept = 0;
  for (const std::pair<int32_t, int32_t>& pending : pending_snapshots_) {
    const int32_t slot = pending.first, snap = pending.second;  // (a lambda may capture these)
    const auto it = std::find_if(meta.seqs.begin(), meta.seqs.end(),
                                 [slot](const SeqSlice& s) { return s.state_slot == slot; });
    if (it == meta.seqs.end()) {
      pending_snapshots_[kept++] = {slot, snap};
      continue;
    }
    SALA_CHECK(it->num_tokens < kGlaChunk && it->past_len > 0,
               "snapshot of state slot {}: its call has {} rows after {} tokens (1..63 after "
               "a prefix, or no snapshot)", slot, it->num_tokens, it->past_len);
    SeqSlice& m = mapped_.seqs[size_t(it - meta.seqs.begin())];
    SALA_CHECK(m.state_dst_slot < 0, "two snapshots of state slot {}", slot);
    m.state_dst_slot = mem_slot(snap);
    std::swap(slot_mem_[size_t(slot)], slot_mem_[size_t(snap)]);
  }
  pending_snapshots_.resize(kept);
  return mapped_;
}

bool Model::rollback_state(int32_t slot, int32_t snapshot_slot, int32_t rows) {
  auto it = std::find_if(kept_calls_.begin(), kept_calls_.end(),
                         [&](const SeqSlice& s) { return s.state_slot == slot; });
  if (it == kept_calls_.end()) return false;
  SALA_CHECK(rows >= 1 && rows <= it->num_tokens, "rollback of slot {} to {} of {} rows", slot,
             rows, it->num_tokens);
  // Batched with the other rolled-back calls of the step; the snapshot is read, not copied.
  pending_advances_.push_back({mem_slot(slot), it->token_begin, rows, mem_slot(snapshot_slot)});
  kept_calls_.erase(it);  // one rollback per call
  return true;
}

void Model::flush_state_advances() {
  if (pending_advances_.empty()) return;
  backend_->advance_lightning_states(keep_k_, keep_v_, limits_.keep_verify_rows,
                                     pending_advances_, slopes_);
  pending_advances_.clear();
}

void Model::trace_rows(ForwardTrace* trace, const Tensor& t) {
  if (!trace) return;
  std::vector<float> rows(size_t(t.numel()));
  backend_->download_f32(t, rows.data());
  trace->hidden.push_back(std::move(rows));
}

// Batch-size buckets of recorded steps.
static constexpr int kGraphBuckets[] = {1, 2, 4, 8, 16, 32, 64};
static constexpr int kSparseGraphKey = 1 << 16;  // added to the bucket of steps with sparse rows
// Verify steps' keys: kVerifyGraphKey + the id of their padded per-call row counts.
static constexpr int kVerifyGraphKey = 1 << 20;
static constexpr size_t kMaxVerifyGraphs = 128;

Model::GraphStep Model::graph_step(const StepMeta& meta, ForwardTrace* trace, bool keep) {
  const bool records = tp_ ? tp_->graphs_ok() : backend_->graphs_enabled();
  if (!records || trace || meta.capture || meta.dense_as_sparse) return {};
  const int S = int(meta.seqs.size()), T = meta.num_tokens();
  if (S == 0 || int(meta.logit_rows.size()) != T) return {};
  // Every row's logits, in order (decode: one row per call; verify: 1 + k rows per call).
  for (int i = 0; i < T; ++i)
    if (meta.logit_rows[size_t(i)] != i) return {};
  bool any_sparse = false;
  for (const SeqSlice& s : meta.seqs) {
    if (s.num_tokens > kGraphMaxCallRows) return {};
    any_sparse |= cfg_.sparse.sparse_call(s.total_len(), meta.dense_as_sparse);
  }
  int b = 0;
  for (int x : kGraphBuckets)
    if (x >= S) {
      b = x;
      break;
    }
  const int rows = T + (b - S);  // padded with one-row calls
  if (b == 0 || rows > limits_.max_step_tokens || rows > limits_.max_logit_rows) return {};
  if (keep && rows > limits_.keep_verify_rows) return {};  // run directly, without keeping
  // Steps with an InfLLM-v2 row launch the selection kernels too: their own recordings.
  if (T == S && !keep) return {b + (any_sparse ? kSparseGraphKey : 0), b};
  // A verify step's kernels and grids follow its calls' row counts: one recording per
  // distinct padded layout, up to kMaxVerifyGraphs of them (later layouts run directly).
  std::vector<int32_t>& layout = layout_;  // reused: no allocation per step
  layout.clear();
  for (const SeqSlice& s : meta.seqs) layout.push_back(s.num_tokens);
  layout.resize(size_t(b), 1);
  layout.push_back(any_sparse);
  layout.push_back(keep);  // a recording that keeps k and v writes them elsewhere
  auto it = verify_graph_ids_.find(layout);
  if (it == verify_graph_ids_.end()) {
    if (verify_graph_ids_.size() >= kMaxVerifyGraphs) return {};
    it = verify_graph_ids_.emplace(layout, int(verify_graph_ids_.size())).first;
  }
  return {kVerifyGraphKey + it->second, b};
}

const StepMeta& Model::padded_step(const StepMeta& step, const GraphStep& g) {
  padded_ = step;
  const std::vector<int32_t> page{scratch_page_};
  const int32_t tok = 0;
  for (size_t i = step.seqs.size(); i < size_t(g.padded_seqs); ++i)
    padded_.add_seq(&tok, 1, 0, scratch_slot_, page, false, true);
  return padded_;
}

void Model::forward(const StepMeta& meta, std::vector<float>& logits, ForwardTrace* trace,
                    std::vector<int32_t>* argmax, RowLogprobs* extra, const LogitMasks* masks,
                    bool keep_logits) {
  const int64_t T = meta.num_tokens();
  const int64_t R = int64_t(meta.logit_rows.size());
  SALA_CHECK(T > 0 && T <= limits_.max_step_tokens, "step has {} tokens (max {})", T,
             limits_.max_step_tokens);
  SALA_CHECK(R <= limits_.max_logit_rows, "step wants {} logit rows (max {})", R,
             limits_.max_logit_rows);
  Backend& be = *backend_;
  be.bind_thread();  // the engine's thread on the backend's device (a no-op on the host)
  flush_state_advances();  // before this step reads the states
  const StepMeta& step = map_state_slots(meta);  // what the backend runs
  if (extra && extra->rows.empty()) extra = nullptr;
  const bool keep_asked = meta.keep_lightning_rows && !tp_ && keep_k_.data;
  const GraphStep g = extra ? GraphStep{} : graph_step(meta, trace, keep_asked);
  kept_calls_.clear();
  if (tp_) {
    // Recorded steps (NCCL, the peer group) run the padded step; the collective of the logit
    // rows after the recording covers the step's own R rows.
    const StepMeta& run = g.key ? padded_step(step, g) : step;
    const int64_t rows = g.key ? run.num_tokens() : 0;
    // Greedy steps without masks take the distributed argmax over the vocab shards; every
    // other step gathers the logits into logits_ and goes on as with one rank.
    if (argmax && !(masks && !masks->empty()) && R > 0) {
      argmax->resize(size_t(R));
      tp_->forward(run, R, trace, argmax->data(), extra, logits_, g.key, rows);
      return;
    }
    tp_->forward(run, R, trace, nullptr, extra, logits_, g.key, rows);
  } else if (g.key == 0) {
    const bool keep = keep_asked && T <= limits_.keep_verify_rows;
    if (keep) kept_calls_ = meta.seqs;  // the caller's slots (rollback_state)
    be.begin_step(step);
    run_layers(T, R, trace, extra, keep);
  } else {
    // Decode or verify step: pad to the bucket with one-row calls that read and write only
    // the scratch page and slot (token 0 at position 0), then launch the key's recording
    // (made on its second occurrence; the first runs directly).
    padded_step(step, g);
    const int64_t rows = padded_.num_tokens();
    if (keep_asked) kept_calls_ = meta.seqs;  // graph_step checked the rows
    be.begin_step(padded_);
    if (!be.graph_launch(g.key)) {
      const bool recording = be.graph_capture_begin(g.key);
      run_layers(rows, rows, nullptr, nullptr, keep_asked);
      if (recording) be.graph_capture_end(g.key);
    }
  }
  if (R == 0) {
    logits.clear();
    if (argmax) argmax->clear();
    return;
  }
  Tensor out{logits_.data, DType::F32, R, cfg_.vocab_size};
  if (masks && !masks->empty()) {
    SALA_CHECK(masks->bits.size() == masks->rows.size() * size_t(masks->words));
    be.mask_logits(out, masks->rows.data(), int64_t(masks->rows.size()), masks->bits.data(),
                   masks->words);
  }
  if (argmax) {
    argmax->resize(size_t(R));
    be.argmax_rows(out, argmax->data());
    return;
  }
  if (keep_logits) return;
  logits.resize(size_t(R) * size_t(cfg_.vocab_size));
  be.download_f32(out, logits.data());
}

void Model::logprobs(RowLogprobs& lp) {
  const size_t n = lp.rows.size();
  SALA_CHECK(lp.targets.size() == n && lp.top_n >= 0 && lp.top_n <= kMaxTopLogprobs);
  lp.logprob.resize(n);
  lp.top_ids.resize(n * size_t(lp.top_n));
  lp.top_logprobs.resize(n * size_t(lp.top_n));
  if (n == 0) return;
  if (tp_) tp_->gather_logits(logits_);  // after a distributed-argmax step
  const Tensor out{logits_.data, DType::F32, limits_.max_logit_rows, cfg_.vocab_size};
  backend_->logprobs_rows(out, lp.rows.data(), lp.targets.data(), int64_t(n), lp.top_n,
                          lp.logprob.data(), lp.top_ids.data(), lp.top_logprobs.data());
}

void Model::extra_logprobs(Tensor& x, RowLogprobs& lp) {
  const size_t n = lp.rows.size();
  SALA_CHECK(lp.targets.size() == n && lp.top_n >= 0 && lp.top_n <= kMaxTopLogprobs);
  lp.logprob.resize(n);
  lp.top_ids.resize(n * size_t(lp.top_n));
  lp.top_logprobs.resize(n * size_t(lp.top_n));
  const int64_t G = limits_.max_logit_rows, V = cfg_.vocab_size;
  const size_t tn = size_t(lp.top_n);
  // Runs of consecutive rows, at most G each: a run is a contiguous slice of x, so it needs
  // no gather; the logit divisor is applied in place (x is not read again after this).
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && int64_t(j - i) < G && lp.rows[j] == lp.rows[j - 1] + 1) ++j;
    SALA_CHECK(lp.rows[i] >= 0 && lp.rows[j - 1] < x.rows && (i == 0 || lp.rows[i] > lp.rows[i - 1]),
               "extra logprob rows must be ascending step rows");
    const int64_t m = int64_t(j - i);
    Tensor xs = x.slice_rows(lp.rows[i], m);
    Tensor out{logits_.data, DType::F32, m, V};
    backend_->div_scalar(xs, cfg_.logit_divisor());
    backend_->linear(xs, w_.lm_head, out);
    backend_->logprobs_rows(out, iota_.data(), lp.targets.data() + i, m, lp.top_n,
                            lp.logprob.data() + i, lp.top_ids.data() + i * tn,
                            lp.top_logprobs.data() + i * tn);
    i = j;
  }
}

void Model::run_layers(int64_t T, int64_t R, ForwardTrace* trace, RowLogprobs* extra,
                       bool keep) {
  Backend& be = *backend_;
  const ModelConfig& c = cfg_;
  const float eps = float(c.rms_norm_eps), alpha = c.residual_scale();
  const int64_t qd = int64_t(c.num_attention_heads) * c.head_dim;
  const int64_t kvd = int64_t(c.num_key_value_heads) * c.head_dim;
  const int64_t ld = int64_t(c.lightning_nh) * c.lightning_head_dim;
  auto rows = [T](const Tensor& t, int64_t cols) { return Tensor{t.data, t.dtype, T, cols}; };
  Tensor h = rows(h_, c.hidden_size), x = rows(x_, c.hidden_size), mix = rows(mix_, c.hidden_size);
  Tensor g = rows(mlp_g_, c.intermediate_size), u = rows(mlp_u_, c.intermediate_size);

  be.embedding(w_.embed_tokens, float(c.scale_emb), h);
  trace_rows(trace, h);
  // Each norm names the projection that reads its output next (`next`: the CUDA backend then
  // writes that projection's FP8 input codes in the norm kernel; no number changes).
  be.rmsnorm(h, w_.layers[0].input_layernorm, eps, x, &w_.layers[0].qkvg);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& l = w_.layers[size_t(i)];
    const int ki = c.kind_index(i);
    if (l.type == MixerType::Sparse) {
      Tensor q = rows(q_, qd), k = rows(k_, kvd), v = rows(v_, kvd);
      Tensor gate = rows(gate_, qd), a = rows(attn_, qd);
      be.linear_multi(x, l.qkvg, {&q, &k, &v, &gate});  // q_proj, k_proj, v_proj, o_gate
      // NoPE, no q/k norm; then a * sigmoid(o_gate(x))
      be.sparse_attention_mul_sigmoid(ki, q, k, v, gate, a);
      be.linear_add_rmsnorm(a, l.o_proj, mix, h, alpha, l.post_attention_layernorm, eps, x,
                            &l.gate_up);
    } else {
      Tensor q = rows(q_, ld), k = rows(k_, ld), v = rows(v_, ld);
      Tensor gate = rows(gate_, ld), a = rows(attn_, ld);
      if (keep) {  // the projections write straight into the kept rows: no copy
        k = keep_k_.slice_rows(int64_t(ki) * limits_.keep_verify_rows, T);
        v = keep_v_.slice_rows(int64_t(ki) * limits_.keep_verify_rows, T);
      }
      be.linear_multi(x, l.qkvg, {&q, &k, &v, &gate});  // q_proj, k_proj, v_proj, z_proj
      // per-head RMSNorm of q and k, then RoPE, then simple GLA
      be.lightning_qk_attention(ki, q, k, v, l.q_norm, l.k_norm, eps, c.lightning_head_dim,
                                c.rope_theta, slopes_, float(c.lightning_scale), a);
      // one norm over all heads, then o * sigmoid(z_proj(x))
      be.rmsnorm_mul_sigmoid(a, l.o_norm, eps, gate, a, &l.o_proj);
      be.linear_add_rmsnorm(a, l.o_proj, mix, h, alpha, l.post_attention_layernorm, eps, x,
                            &l.gate_up);
    }
    be.linear_silu_mul(x, l.gate_up, g, u, &l.down_proj);  // silu(gate_proj(x)) * up_proj(x)
    const bool last = i + 1 == c.num_hidden_layers;
    const Tensor& next_norm = last ? w_.norm : w_.layers[size_t(i) + 1].input_layernorm;
    // down_proj, then x: the next layer's input (its q/k/v/gate projection), or the final
    // norm's output (the logit rows are gathered from it: no projection reads x itself)
    be.linear_add_rmsnorm(g, l.down_proj, mix, h, alpha, next_norm, eps, x,
                          last ? nullptr : &w_.layers[size_t(i) + 1].qkvg);
    trace_rows(trace, h);
  }
  // x = RMSNorm(h; model.norm) for every row; logits only for the requested rows.
  trace_rows(trace, x);
  Tensor z{logit_in_.data, logit_in_.dtype, R, c.hidden_size};
  Tensor out{logits_.data, DType::F32, R, c.vocab_size};
  if (R > 0) be.gather_logit_rows(x, z);
  // Extra rows after the gather (which copies the logit rows out of x) and before the logit
  // rows' lm_head, whose logits must be the ones left in the workspace.
  if (extra) extra_logprobs(x, *extra);
  if (R == 0) return;
  be.div_scalar(z, c.logit_divisor());
  be.linear(z, w_.lm_head, out);
}

}  // namespace sala
