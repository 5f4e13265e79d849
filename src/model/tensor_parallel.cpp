#include "model/tensor_parallel.h"

#include <algorithm>
#include <exception>

#include "core/check.h"
#include "core/error.h"

namespace sala {

void check_tp_config(const ModelConfig& c, int n) {
  if (n < 1) fail("--tp-size {} must be >= 1", n);
  auto need = [&](int64_t v, const char* what) {
    if (v % n != 0) fail("{}: {} = {} is not divisible by --tp-size {}", c.source, what, v, n);
  };
  // The sparse layers' heads split only when the KV heads do (else they are replicated).
  if (c.num_key_value_heads % n == 0) need(c.num_attention_heads, "num_attention_heads");
  need(c.lightning_nh, "lightning_nh");
  need(c.intermediate_size, "intermediate_size");
  need(c.hidden_size, "hidden_size");
  // The vocabulary is cut at multiples of kLinearColBlock (vocab_begin): every rank gets some.
  if (vocab_begin(c.vocab_size, n, n - 1) >= c.vocab_size)
    fail("{}: vocab_size = {} is too small for --tp-size {} (lm_head slices of {} columns)",
         c.source, c.vocab_size, n, kLinearColBlock);
}

int64_t vocab_begin(int64_t V, int n, int r) {
  const int64_t per = (V + n - 1) / n;
  const int64_t chunk = (per + kLinearColBlock - 1) / kLinearColBlock * kLinearColBlock;
  return std::min(V, r * chunk);
}

std::vector<std::unique_ptr<Backend>> make_tp_peers(const std::string& device,
                                                    const BackendOptions& opts, int tp_size) {
  if (tp_size < 1) fail("--tp-size {} must be >= 1", tp_size);
  std::vector<std::unique_ptr<Backend>> peers;
  if (tp_size == 1) return peers;
  if (device != "cpu")
    fail("--tp-size {} on --device {}: tensor parallelism runs on the CPU backend only (the "
         "NCCL communicator for GPUs does not exist yet)", tp_size, device);
  for (int r = 1; r < tp_size; ++r) peers.push_back(make_backend(device, opts));
  return peers;
}

namespace {

// Rank r's share of a config: its heads and intermediate columns (what its backend's caches
// and attention ops see). Sparse layers whose KV heads do not split over the ranks (the tiny
// golden models' one KV head) keep all their heads: replicated on every rank. The vocabulary stays whole (the embedding is replicated).
ModelConfig shard_config(const ModelConfig& c, int n) {
  ModelConfig s = c;
  if (c.num_key_value_heads % n == 0) {
    s.num_attention_heads /= n;
    s.num_key_value_heads /= n;
  }
  s.lightning_nh /= n;
  s.lightning_nkv = std::max(1, c.lightning_nkv / n);
  s.intermediate_size /= n;
  return s;
}

struct LayerShard {
  Weight q, k, v, gate;      // [heads/n * d, H] each
  Weight gate_proj, up_proj;  // [I/n, H]
  Weight o_proj;              // [H/n, heads*d]: the rank's output columns
  Weight down_proj;           // [H/n, I]
};

}  // namespace

struct TensorParallel::Rank {
  int r = 0;
  Backend* be = nullptr;
  std::unique_ptr<Backend> owned;  // ranks > 0
  std::unique_ptr<Communicator> comm;
  const ModelWeights* full = nullptr;  // norms, embedding (replicated)
  std::vector<LayerShard> layers;
  Weight lm_head;  // [vocab1 - vocab0, H]
  int64_t vocab0 = 0, vocab1 = 0;  // the rank's ids (vocab_begin)
  std::vector<float> slopes;  // the global slopes of the rank's lightning heads
  // Workspaces [max_step_tokens, cols]: shards (q..attn, mix_part, g, u) and gathered.
  Tensor h, x, q, k, v, gate, attn, attn_full, gate_full, mix_part, mix, g, u, g_full;
  Tensor logit_in, logits_part;  // [max_logit_rows, H], [max_logit_rows, vocab1 - vocab0]
  StepMeta meta;
  BlockCapture cap;
};

TensorParallel::TensorParallel(const ModelConfig& cfg, const ModelWeights& full, Backend& rank0,
                               std::vector<std::unique_ptr<Backend>> peers,
                               const ModelLimits& limits, const std::vector<KvScales>& kv_scales)
    : cfg_(cfg), limits_(limits) {
  const int n = 1 + int(peers.size());
  check_tp_config(cfg, n);
  group_ = std::make_unique<CpuCommGroup>(n);
  const ModelConfig sc = shard_config(cfg, n);
  const std::vector<float> slopes = cfg.lightning_slopes();
  const int64_t T = limits.max_step_tokens, H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t qd = int64_t(cfg.num_attention_heads) * cfg.head_dim;
  const int64_t kvd = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
  const int64_t ld = int64_t(cfg.lightning_nh) * cfg.lightning_head_dim;
  const int64_t V = cfg.vocab_size;
  const bool kv_split = cfg.num_key_value_heads % n == 0;
  sparse_split_ = kv_split;
  // The rank's widths of q, k, v, gate, attn: the sparse mixer's share (all of it when
  // replicated) or the lightning heads' share.
  const int64_t wide = std::max(kv_split ? qd / n : qd, ld / n);
  for (int r = 0; r < n; ++r) {
    auto k = std::make_unique<Rank>();
    k->r = r;
    if (r == 0) {
      k->be = &rank0;
    } else {
      k->owned = std::move(peers[size_t(r - 1)]);
      k->be = k->owned.get();
      SALA_CHECK(k->be->name() == rank0.name(), "rank {} backend {} != rank 0's {}", r,
                 k->be->name(), rank0.name());
    }
    k->comm = group_->comm(r);
    k->full = &full;
    // Every weight of the rank: rows [r*N/n, (r+1)*N/n) of the full [N, K] weight.
    auto part = [&](const Weight& w, int64_t rows) { return w.slice_rows(r * rows / n, rows / n); };
    for (const LayerWeights& l : full.layers) {
      LayerShard s;
      const bool sparse = l.type == MixerType::Sparse;
      if (sparse && !kv_split) {
        s.q = l.q_proj, s.k = l.k_proj, s.v = l.v_proj, s.gate = l.gate;  // replicated
      } else {
        s.q = part(l.q_proj, sparse ? qd : ld);
        s.k = part(l.k_proj, sparse ? kvd : ld);
        s.v = part(l.v_proj, sparse ? kvd : ld);
        s.gate = part(l.gate, sparse ? qd : ld);
      }
      s.gate_proj = part(l.gate_proj, I);
      s.up_proj = part(l.up_proj, I);
      s.o_proj = part(l.o_proj, H);
      s.down_proj = part(l.down_proj, H);
      k->layers.push_back(s);
    }
    k->vocab0 = vocab_begin(V, n, r);
    k->vocab1 = vocab_begin(V, n, r + 1);
    k->lm_head = full.lm_head.slice_rows(k->vocab0, k->vocab1 - k->vocab0);
    const int nh = sc.lightning_nh;
    k->slopes.assign(slopes.begin() + r * nh, slopes.begin() + (r + 1) * nh);
    Backend& be = *k->be;
    be.set_kv_scales(kv_scales);
    be.init_caches(sc, limits.caches);
    const DType a = be.act_dtype();
    k->h = be.alloc(T, H, a);
    k->x = be.alloc(T, H, a);
    for (Tensor* t : {&k->q, &k->k, &k->v, &k->gate, &k->attn}) *t = be.alloc(T, wide, a);
    k->attn_full = be.alloc(T, std::max(qd, ld), a);
    k->gate_full = be.alloc(T, ld, a);
    k->mix_part = be.alloc(T, H / n, a);
    k->mix = be.alloc(T, H, a);
    k->g = be.alloc(T, I / n, a);
    k->u = be.alloc(T, I / n, a);
    k->g_full = be.alloc(T, I, a);
    k->logit_in = be.alloc(limits.max_logit_rows, H, a);
    k->logits_part = be.alloc(limits.max_logit_rows, k->vocab1 - k->vocab0, DType::F32);
    ranks_.push_back(std::move(k));
  }
  for (int r = 1; r < n; ++r) workers_.emplace_back([this, r] { worker(r); });
}

TensorParallel::~TensorParallel() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

// An exception on a rank is a bug (bad input is refused before a step): the other ranks
// would wait at a barrier for ever, so it ends the process.
void TensorParallel::run_guarded(Rank& k, int64_t R, ForwardTrace* trace, int32_t* argmax,
                                 RowLogprobs* extra, Tensor& logits) {
  try {
    run_rank(k, k.meta, R, trace, argmax, extra, logits);
  } catch (const std::exception& e) {
    SALA_CHECK(false, "tensor-parallel rank {}: {}", k.r, e.what());
  }
}

// Rank r's thread: runs each step forward() posts (one generation each), for the life of
// the model (the OpenMP pool of the thread is made once, not per step).
void TensorParallel::worker(int r) {
  uint64_t seen = 0;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    run_guarded(*ranks_[size_t(r)], job.R, nullptr, nullptr, job.extra, *job.logits);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void TensorParallel::copy_state_slot(int32_t src, int32_t dst) {
  for (auto& k : ranks_) k->be->copy_state_slot(src, dst);
}

void TensorParallel::forward(const StepMeta& meta, int64_t R, ForwardTrace* trace,
                             int32_t* argmax, RowLogprobs* extra, Tensor& logits) {
  // Each rank its own copy of the step (its backend keeps a pointer to it) and its own block
  // capture (its KV heads), merged below into the caller's with global head indexes.
  for (auto& k : ranks_) {
    k->meta = meta;
    k->cap = BlockCapture{};
    if (meta.capture) {
      k->cap.want_scores = meta.capture->want_scores;
      k->meta.capture = &k->cap;
    }
  }
  want_argmax_ = argmax != nullptr;
  // Ranks 1.. on their workers, rank 0 on this thread; then wait for the workers.
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = Job{R, extra, &logits};
    pending_ = size() - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  run_guarded(*ranks_[0], R, trace, argmax, extra, logits);
  {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
  }
  if (!meta.capture) return;
  // Split KV heads: rank r's are r*kvl..; replicated: rank 0's are all of them.
  const int kvl = sparse_split_ ? cfg_.num_key_value_heads / size() : cfg_.num_key_value_heads;
  BlockCapture& out = *meta.capture;
  for (auto& k : ranks_) {
    if (!sparse_split_ && k->r > 0) break;
    const auto& sel = k->cap.selections;
    if (out.selections.size() < sel.size()) out.selections.resize(sel.size());
    if (out.block_scores.size() < k->cap.block_scores.size())
      out.block_scores.resize(k->cap.block_scores.size());
    for (size_t l = 0; l < sel.size(); ++l) {
      auto& o = out.selections[l];
      if (o.size() < size_t(cfg_.num_key_value_heads)) o.resize(size_t(cfg_.num_key_value_heads));
      for (int g = 0; g < kvl && size_t(g) < sel[l].size(); ++g)
        o[size_t(k->r * kvl + g)] = sel[l][size_t(g)];
    }
    for (size_t l = 0; l < k->cap.block_scores.size(); ++l) {
      auto& o = out.block_scores[l];
      if (o.size() < size_t(cfg_.num_key_value_heads)) o.resize(size_t(cfg_.num_key_value_heads));
      for (int g = 0; g < kvl && size_t(g) < k->cap.block_scores[l].size(); ++g)
        o[size_t(k->r * kvl + g)] = k->cap.block_scores[l][size_t(g)];
    }
  }
}

void TensorParallel::run_rank(Rank& k, const StepMeta& meta, int64_t R, ForwardTrace* trace,
                              int32_t* argmax, RowLogprobs* extra, Tensor& logits) {
  Backend& be = *k.be;
  Communicator& comm = *k.comm;
  const ModelConfig& c = cfg_;
  const ModelWeights& w = *k.full;
  const int n = size();
  const int64_t T = meta.num_tokens();
  const float eps = float(c.rms_norm_eps), alpha = c.residual_scale();
  const int64_t qd = int64_t(c.num_attention_heads) * c.head_dim;
  const int64_t kvd = int64_t(c.num_key_value_heads) * c.head_dim;
  const int64_t ld = int64_t(c.lightning_nh) * c.lightning_head_dim;
  auto rows = [T](const Tensor& t, int64_t cols) { return Tensor{t.data, t.dtype, T, cols}; };
  auto trace_rows = [&](const Tensor& t) {
    if (!trace) return;
    std::vector<float> v(size_t(t.numel()));
    be.download_f32(t, v.data());
    trace->hidden.push_back(std::move(v));
  };
  Tensor h = rows(k.h, c.hidden_size), x = rows(k.x, c.hidden_size), mix = rows(k.mix, c.hidden_size);
  Tensor mix_part = rows(k.mix_part, c.hidden_size / n);
  Tensor g = rows(k.g, c.intermediate_size / n), u = rows(k.u, c.intermediate_size / n);
  Tensor g_full = rows(k.g_full, c.intermediate_size);

  be.begin_step(meta);
  be.embedding(w.embed_tokens, float(c.scale_emb), h);
  trace_rows(h);
  be.rmsnorm(h, w.layers[0].input_layernorm, eps, x);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& l = w.layers[size_t(i)];
    const LayerShard& s = k.layers[size_t(i)];
    const int ki = c.kind_index(i);
    const bool sparse = l.type == MixerType::Sparse;
    const int64_t od = sparse ? qd : ld;  // the mixer's output width (all heads)
    const int split = sparse && !sparse_split_ ? 1 : n;  // 1: a replicated sparse mixer
    Tensor q = rows(k.q, od / split), kk = rows(k.k, (sparse ? kvd : ld) / split);
    Tensor v = rows(k.v, (sparse ? kvd : ld) / split), gate = rows(k.gate, od / split);
    Tensor a = rows(k.attn, od / split), a_full = rows(k.attn_full, od);
    be.linear(x, s.q, q);
    be.linear(x, s.k, kk);
    be.linear(x, s.v, v);
    be.linear(x, s.gate, gate);
    if (sparse) {
      // the rank's KV heads and their query heads; NoPE; then a * sigmoid(o_gate(x))
      // (replicated: all heads, a_full directly)
      be.sparse_attention_mul_sigmoid(ki, q, kk, v, gate, split == 1 ? a_full : a);
      if (split > 1) comm.all_gather_cols(a, a_full);
    } else {
      be.lightning_qk_attention(ki, q, kk, v, l.q_norm, l.k_norm, eps, c.lightning_head_dim,
                                c.rope_theta, k.slopes, float(c.lightning_scale), a);
      // o_norm over all nh*d columns: gather the heads and the gate, norm the whole row.
      Tensor z_full = rows(k.gate_full, od);
      comm.all_gather_cols(a, a_full);
      comm.all_gather_cols(gate, z_full);
      be.rmsnorm_mul_sigmoid(a_full, l.o_norm, eps, z_full, a_full);
    }
    be.linear(a_full, s.o_proj, mix_part);  // the rank's H/n output columns
    comm.all_gather_cols(mix_part, mix);
    be.add_scaled_rmsnorm(h, mix, alpha, l.post_attention_layernorm, eps, x);
    be.linear(x, s.gate_proj, g);
    be.linear(x, s.up_proj, u);
    be.silu_mul(g, u, g);
    comm.all_gather_cols(g, g_full);
    be.linear(g_full, s.down_proj, mix_part);
    comm.all_gather_cols(mix_part, mix);
    const Tensor& next_norm =
        i + 1 < c.num_hidden_layers ? w.layers[size_t(i) + 1].input_layernorm : w.norm;
    be.add_scaled_rmsnorm(h, mix, alpha, next_norm, eps, x);
    trace_rows(h);
  }
  trace_rows(x);
  const int64_t G = limits_.max_logit_rows, Vn = k.vocab1 - k.vocab0;
  Tensor z{k.logit_in.data, k.logit_in.dtype, R, c.hidden_size};
  if (R > 0) be.gather_logit_rows(x, z);
  if (extra) {
    // Prompt logprob rows in runs of consecutive rows (as Model::extra_logprobs): each run's
    // vocab shards gathered into rank 0's logits, where the log-softmax runs.
    const size_t ne = extra->rows.size(), tn = size_t(extra->top_n);
    if (k.r == 0) {
      SALA_CHECK(extra->targets.size() == ne && extra->top_n >= 0 && extra->top_n <= kMaxTopLogprobs);
      extra->logprob.resize(ne);
      extra->top_ids.resize(ne * tn);
      extra->top_logprobs.resize(ne * tn);
    }
    std::vector<int32_t> iota(static_cast<size_t>(G));
    for (size_t i = 0; i < iota.size(); ++i) iota[i] = int32_t(i);
    for (size_t i = 0; i < ne;) {
      size_t j = i + 1;
      while (j < ne && int64_t(j - i) < G && extra->rows[j] == extra->rows[j - 1] + 1) ++j;
      SALA_CHECK(extra->rows[i] >= 0 && extra->rows[j - 1] < T &&
                     (i == 0 || extra->rows[i] > extra->rows[i - 1]),
                 "extra logprob rows must be ascending step rows");
      const int64_t m = int64_t(j - i);
      Tensor xs = x.slice_rows(extra->rows[i], m);
      Tensor part{k.logits_part.data, DType::F32, m, Vn};
      Tensor out{logits.data, DType::F32, m, c.vocab_size};
      be.div_scalar(xs, c.logit_divisor());
      be.linear(xs, k.lm_head, part);
      comm.gather_cols(part, out, 0);
      if (k.r == 0)
        be.logprobs_rows(out, iota.data(), extra->targets.data() + i, m, extra->top_n,
                         extra->logprob.data() + i, extra->top_ids.data() + i * tn,
                         extra->top_logprobs.data() + i * tn);
      i = j;
    }
  }
  if (R == 0) return;
  be.div_scalar(z, c.logit_divisor());
  Tensor part{k.logits_part.data, DType::F32, R, Vn};
  be.linear(z, k.lm_head, part);
  // Every rank knows whether rank 0 wants the argmax only: forward() passes the same flag.
  if (want_argmax_) {
    comm.argmax_rows(part, k.vocab0, argmax, 0);
  } else {
    Tensor out{logits.data, DType::F32, R, c.vocab_size};
    comm.gather_cols(part, out, 0);
  }
}

}  // namespace sala
