#include "model/tensor_parallel.h"

#include <algorithm>
#include <exception>

#include "core/check.h"
#include "core/error.h"
#include "model/tensor_parallel_rank.h"

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
  // Slices of ceil(V / n) ids (vocab_begin): every rank must get some.
  if (vocab_begin(c.vocab_size, n, n - 1) >= c.vocab_size)
    fail("{}: vocab_size = {} is too small for --tp-size {}", c.source, c.vocab_size, n);
}

int64_t vocab_begin(int64_t V, int n, int r) { return gather_col(V, n, r); }

std::vector<std::unique_ptr<Backend>> make_tp_peers(const std::string& device,
                                                    const BackendOptions& opts, int tp_size) {
  if (tp_size < 1) fail("--tp-size {} must be >= 1", tp_size);
  std::vector<std::unique_ptr<Backend>> peers;
  if (tp_size == 1) return peers;
  for (int r = 1; r < tp_size; ++r) {
    BackendOptions o = opts;
    o.cuda_device = opts.cuda_device + r;  // one GPU per rank (NCCL); ignored on the CPU
    peers.push_back(make_backend(device, o));
  }
  return peers;
}

ModelConfig tp_rank_config(const ModelConfig& c, int n) {
  check_tp_config(c, n);
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

WeightShard tp_shard(const ModelConfig& c, int n, int r) {
  WeightShard s;
  s.rank = r;
  s.size = n;
  s.sparse_split = c.num_key_value_heads % n == 0;
  s.vocab0 = vocab_begin(c.vocab_size, n, r);
  s.vocab1 = vocab_begin(c.vocab_size, n, r + 1);
  return s;
}

TensorParallel::TensorParallel(const ModelConfig& cfg, const Checkpoint& ckpt, Backend& rank0,
                               const ModelWeights& rank0_weights,
                               std::vector<std::unique_ptr<Backend>> peers,
                               const ModelLimits& limits, const std::vector<KvScales>& kv_scales)
    : cfg_(cfg), limits_(limits) {
  const int n = 1 + int(peers.size());
  check_tp_config(cfg, n);
  const ModelConfig sc = tp_rank_config(cfg, n);
  const std::vector<float> slopes = cfg.lightning_slopes();
  const int64_t T = limits.max_step_tokens, H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t qd = int64_t(cfg.num_attention_heads) * cfg.head_dim;
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
      k->w = &rank0_weights;
    } else {
      k->owned = std::move(peers[size_t(r - 1)]);
      k->be = k->owned.get();
      SALA_CHECK(k->be->name() == rank0.name(), "rank {} backend {} != rank 0's {}", r,
                 k->be->name(), rank0.name());
      k->be->bind_thread();  // this thread's calls below go to rank r's device
      k->own = load_weights(cfg, ckpt, *k->be, nullptr, tp_shard(cfg, n, r));
      k->w = &k->own;
    }
    Backend& be = *k->be;
    be.bind_thread();
    k->vocab0 = vocab_begin(V, n, r);
    k->vocab1 = vocab_begin(V, n, r + 1);
    const int nh = sc.lightning_nh;
    k->slopes.assign(slopes.begin() + r * nh, slopes.begin() + (r + 1) * nh);
    be.set_kv_scales(kv_scales);
    be.init_caches(sc, limits.caches);
    const DType a = be.act_dtype();
    k->h = be.alloc(T, H, a);
    k->x = be.alloc(T, H, a);
    for (Tensor* t : {&k->q, &k->k, &k->v, &k->gate, &k->attn}) *t = be.alloc(T, wide, a);
    k->attn_full = be.alloc(T, std::max(qd, ld), a);
    k->gate_full = be.alloc(T, ld, a);  // lightning only
    k->mix = be.alloc(T, H, a);
    k->sum_squares = be.alloc(T, 1, DType::F32);
    k->g = be.alloc(T, I / n, a);
    k->u = be.alloc(T, I / n, a);
    k->logit_in = be.alloc(limits.max_logit_rows, H, a);
    k->logits_part = be.alloc(limits.max_logit_rows, k->vocab1 - k->vocab0, DType::F32);
    ranks_.push_back(std::move(k));
  }
  rank0.bind_thread();  // the caller's thread runs rank 0
  // One communicator per rank (backend/comm.h: the CPU group, NCCL, or the peer group),
  // its staging buffer sized for the largest collective: the lightning o_norm's rows [T, ld]
  // or the mixer's [T, qd], the all-reduced [T, H] (the peer group stages it), and the
  // logits [max_logit_rows, V] fp32.
  std::vector<Backend*> backends;
  for (auto& k : ranks_) backends.push_back(k->be);
  std::vector<std::unique_ptr<Communicator>> comms =
      make_communicators(backends, limits.tp_peer_comm);
  const size_t act_bytes = dtype_size(rank0.act_dtype());
  const size_t full_bytes = std::max(size_t(T) * size_t(std::max({qd, ld, H})) * act_bytes,
                                     size_t(limits.max_logit_rows) * size_t(V) * 4);
  graphs_ok_ = true;
  for (int r = 0; r < n; ++r) {
    comms[size_t(r)]->reserve_scratch(full_bytes, limits.max_logit_rows);
    graphs_ok_ = graphs_ok_ && comms[size_t(r)]->capturable() &&
                 ranks_[size_t(r)]->be->graphs_enabled();
    ranks_[size_t(r)]->comm = std::move(comms[size_t(r)]);
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
  // Each rank's communicator and backend released on its own device; rank 0's backend is the
  // Model's (released after this).
  for (size_t r = ranks_.size(); r-- > 0;) {
    ranks_[r]->be->bind_thread();
    ranks_[r]->comm.reset();
    ranks_[r]->owned.reset();
  }
  if (!ranks_.empty()) ranks_[0]->be->bind_thread();
}

// An exception on a rank is a bug (bad input is refused before a step): the other ranks
// would wait at a barrier for ever, so it ends the process.
void TensorParallel::run_guarded(Rank& k, const Job& job, ForwardTrace* trace, int32_t* argmax) {
  try {
    k.be->bind_thread();
    if (job.gather) {
      // The last step's vocab shards (left in logits_part by a distributed-argmax step).
      const Tensor part{k.logits_part.data, DType::F32, job.R, k.vocab1 - k.vocab0};
      Tensor out{job.logits->data, DType::F32, job.R, cfg_.vocab_size};
      k.comm->gather_cols(part, out, 0);
    } else {
      run_rank(k, job, trace, argmax);
    }
  } catch (const std::exception& e) {
    SALA_CHECK(false, "tensor-parallel rank {}: {}", k.r, e.what());
  }
}

// Posts `job` to the workers of ranks 1.., runs rank 0 on this thread, waits for the workers.
void TensorParallel::run_all(const Job& job, ForwardTrace* trace, int32_t* argmax) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = job;
    pending_ = size() - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  run_guarded(*ranks_[0], job, trace, argmax);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return pending_ == 0; });
}

void TensorParallel::gather_logits(Tensor& logits) {
  if (logits_gathered_) return;
  run_all(Job{last_R_, nullptr, &logits, true}, nullptr, nullptr);
  logits_gathered_ = true;
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
    run_guarded(*ranks_[size_t(r)], job, nullptr, nullptr);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void TensorParallel::copy_state_slot(int32_t src, int32_t dst) {
  for (size_t r = ranks_.size(); r-- > 0;) {  // each on its device; rank 0 (the caller's) last
    ranks_[r]->be->bind_thread();
    ranks_[r]->be->copy_state_slot(src, dst);
  }
}

void TensorParallel::forward(const StepMeta& meta, int64_t R, ForwardTrace* trace,
                             int32_t* argmax, RowLogprobs* extra, Tensor& logits, int graph_key,
                             int64_t graph_rows) {
  SALA_CHECK(graph_key == 0 || (graphs_ok_ && graph_rows >= R && !extra && !trace),
             "a recorded tensor-parallel step of {} rows ({} logit rows)", graph_rows, R);
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
  run_all(Job{R, extra, &logits, false, graph_key, graph_rows}, trace, argmax);
  last_R_ = R;
  logits_gathered_ = argmax == nullptr;
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

}  // namespace sala
