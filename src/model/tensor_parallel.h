// Tensor parallelism of the MiniCPM-SALA forward pass (issue 24): `size` ranks, one thread
// each, every rank with its own backend (caches of its heads), its shard of the weights
// (loaded from the checkpoint into its backend: model/weights.h WeightShard), and a
// Communicator.
//
// The split (Megatron's column/row-parallel linears; see docs/ARCHITECTURE.md "Tensor
// parallelism"):
// - Column-parallel: q/k/v/gate (both mixers) and gate_proj/up_proj. Rank r computes its heads
//   / its intermediate columns (row slices of the weights: views, no copies).
// - Lightning heads nh/size per rank, decay slopes taken from the GLOBAL head index; the
//   o_norm over all nh*d columns (the heads and the z gate all-gathered, the whole row normed,
//   the rank's columns taken back out).
// - Sparse layers: the KV heads split (2 KV heads -> one per rank with its 16 query heads):
//   a rank attends only with the KV head it stores (no replicated KV cache), and InfLLM-v2's
//   block selection, pooled over a KV head's whole query group, is rank-local. Where the KV
//   heads do not divide over the ranks (1 KV head, TP=2) a split of the query group would
//   change that pooling, so the sparse mixer is replicated on every rank instead (its
//   q/k/v/gate projections, KV cache and attention), each rank then taking its heads' columns.
// - Row-parallel: o_proj and down_proj. Rank r multiplies its input columns (its heads' [T,
//   nh*d/n], its MLP columns [T, I/n]) by the matching column slice of the weight ([H, K/n],
//   copied out of the checkpoint at load), then ONE all-reduce (sum in rank order) of the
//   [T, H] partials. The sum of two K-halves is not TP=1's single dot product: TP=N equals
//   TP=1 to fp32 rounding, not bit for bit (the numbers: docs/ARCHITECTURE.md).
// - lm_head vocab-parallel (vocab_begin): a distributed argmax for greedy steps (ties to the
//   lowest id), else the logits gathered into rank 0's workspace (masks, sampling, logprobs
//   as TP=1).
// - The embedding and the norms are replicated; so is the residual stream h (every rank adds
//   the same all-reduced sum, so h stays identical on every rank).
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/comm.h"
#include "model/minicpm_sala.h"

namespace sala {

// sala::Error unless `cfg` splits over `size` ranks (lightning heads, the sparse layers'
// query heads where their KV heads split, intermediate and hidden sizes divisible by it; a
// vocabulary wide enough for every rank).
void check_tp_config(const ModelConfig& cfg, int size);
// The first vocabulary id of rank r's lm_head slice (r == n: V): slices of ceil(V / n), the
// last rank the rest (the real model: 73448 -> 36724 + 36724).
int64_t vocab_begin(int64_t V, int n, int r);
// One rank's share of a config under `size`-way tensor parallelism (check_tp_config first):
// its heads and intermediate columns, what its backend's caches and attention ops see (and
// what a GPU's memory is planned for). Sparse layers whose KV heads do not split over the
// ranks (the tiny golden models' one KV head) keep all their heads: replicated on every
// rank. The vocabulary stays whole (the embedding is replicated).
ModelConfig tp_rank_config(const ModelConfig& cfg, int size);
// Rank r's share of the weights (model/weights.h) under `size`-way tensor parallelism.
WeightShard tp_shard(const ModelConfig& cfg, int size, int r);
// The backends of ranks 1..tp_size-1 (Model's `peers`) for `--tp-size tp_size` on `device`:
// none for 1; rank r's CUDA backend on GPU opts.cuda_device + r (sala::Error where it does not
// exist); sala::Error for tp_size < 1.
std::vector<std::unique_ptr<Backend>> make_tp_peers(const std::string& device,
                                                    const BackendOptions& opts, int tp_size);

class TensorParallel {
 public:
  // rank0: the Model's backend, holding rank 0's shard of the weights (rank0_weights,
  // loaded with tp_shard(cfg, size, 0)); peers: the backends of ranks 1..size-1, each of
  // which loads its own shard from `ckpt` here. Initialises every rank's caches with its
  // share of the heads.
  TensorParallel(const ModelConfig& cfg, const Checkpoint& ckpt, Backend& rank0,
                 const ModelWeights& rank0_weights, std::vector<std::unique_ptr<Backend>> peers,
                 const ModelLimits& limits, const std::vector<KvScales>& kv_scales);
  ~TensorParallel();
  int size() const { return int(ranks_.size()); }
  // One step on every rank. argmax non-null: the greedy tokens of the first R logit rows;
  // else their logits [R, V] into `logits` (rank 0's workspace, [max_logit_rows, V]). extra:
  // prompt logprob rows (their logits go through `logits` too). trace: rank 0's residual
  // stream. graph_key (Model::graph_step; 0: none): meta is padded to its bucket, with
  // graph_rows >= R logit rows; each rank launches its recording of the layers and lm_head
  // (or records it, or runs it directly, as its backend's GraphCache says: the same on every
  // rank), then the argmax / gather of the first R rows runs directly.
  void forward(const StepMeta& meta, int64_t R, ForwardTrace* trace, int32_t* argmax,
               RowLogprobs* extra, Tensor& logits, int graph_key = 0, int64_t graph_rows = 0);
  // Whether steps may be recorded: every rank's backend records steps and every communicator
  // can be captured in a CUDA graph (NCCL's and the peer group's can; the CPU group's not).
  bool graphs_ok() const { return graphs_ok_; }
  void copy_state_slot(int32_t src, int32_t dst);
  // After a distributed-argmax step: its logits [R, V] gathered into `logits` (rank 0's
  // workspace), for the logprobs of the tokens it picked (Model::logprobs); a no-op where
  // the step gathered them already.
  void gather_logits(Tensor& logits);

  struct Rank;

 private:
  // A step (gather false) or gather_logits' collective (gather true) on every rank.
  struct Job {
    int64_t R = 0;
    RowLogprobs* extra = nullptr;
    Tensor* logits = nullptr;
    bool gather = false;
    int graph_key = 0;        // forward()'s
    int64_t graph_rows = 0;
  };
  // The step on rank k (k.meta): begin_step, its layers (recorded or not), the collective of
  // the logit rows.
  void run_rank(Rank& k, const Job& job, ForwardTrace* trace, int32_t* argmax);
  // Embedding .. lm_head of T rows on rank k: the vocab shard of R logit rows into
  // k.logits_part; extra's rows gathered into `logits` on the way.
  void rank_layers(Rank& k, int64_t T, int64_t R, ForwardTrace* trace, RowLogprobs* extra,
                   Tensor& logits);
  void run_all(const Job& job, ForwardTrace* trace, int32_t* argmax);
  void run_guarded(Rank& k, const Job& job, ForwardTrace* trace, int32_t* argmax);
  void worker(int r);  // the thread of rank r > 0

  ModelConfig cfg_;
  ModelLimits limits_;
  bool want_argmax_ = false;  // this step: the distributed argmax (set before the ranks run)
  bool sparse_split_ = true;  // KV heads split over the ranks (else the sparse mixer replicated)
  bool graphs_ok_ = false;
  std::vector<std::unique_ptr<Rank>> ranks_;
  int64_t last_R_ = 0;           // the last step's logit rows
  bool logits_gathered_ = true;  // ... and whether `logits` holds them
  // The job run_all hands to the workers of ranks 1..: posted under mu_ with a new
  // generation; pending_ counts the workers still running it.
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  Job job_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace sala
