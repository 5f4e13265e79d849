// Tensor parallelism of the MiniCPM-SALA forward pass (issue 24): `size` ranks, one thread
// each, every rank with its own backend (caches of its heads), the weights' row slices of
// its share, and a Communicator.
//
// The split (Megatron's column split of every projection; see docs/ARCHITECTURE.md "Tensor
// parallelism"):
// - q/k/v/gate (both mixers) and gate_proj/up_proj: rank r computes its heads / its
//   intermediate columns (rows of the weight: contiguous slices, no copies).
// - Lightning heads nh/size per rank, decay slopes taken from the GLOBAL head index.
// - Sparse layers: the KV heads split (2 KV heads -> one per rank with its 16 query heads):
//   a rank attends only with the KV head it stores (no replicated KV cache), and InfLLM-v2's
//   block selection, pooled over a KV head's whole query group, is rank-local. Where the KV
//   heads do not divide over the ranks (1 KV head, TP=2) a split of the query group would
//   change that pooling, so the sparse mixer is replicated on every rank instead (its
//   q/k/v/gate projections, KV cache and attention), o_proj still split.
// - The outputs of the mixers and the MLP are all-gathered, normed where the model norms them
//   (the lightning o_norm over all nh*d columns, not the shard), and o_proj / down_proj are
//   split by OUTPUT columns, gathered again: every element of every GEMM is then the dot
//   product TP=1 computes, so TP=N is bit-identical to TP=1 (fp32 and bf16 modes). Megatron's
//   row-parallel o_proj / down_proj with an all-reduce would sum the two halves of the
//   K dimension separately (a different fp32 order: TP=1's bits are lost).
// - lm_head vocab-parallel (vocab_begin): a distributed argmax for greedy steps (ties to the lowest id),
//   else the logits gathered into rank 0's workspace (masks, sampling, logprobs as TP=1).
// - The embedding and the norms are replicated; so is the residual stream h.
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
// The first vocabulary id of rank r's lm_head slice (r == n: V): slices of ceil(V / n)
// rounded up to a multiple of kLinearColBlock, the last rank the rest, so every slice starts
// at a block boundary of TP=1's GEMM (the real model: 73448 -> 36736 + 36712).
int64_t vocab_begin(int64_t V, int n, int r);
// The backends of ranks 1..tp_size-1 (Model's `peers`) for `--tp-size tp_size` on `device`:
// none for 1; sala::Error for tp_size < 1 and for any device but "cpu" (no NCCL
// communicator yet).
std::vector<std::unique_ptr<Backend>> make_tp_peers(const std::string& device,
                                                    const BackendOptions& opts, int tp_size);

class TensorParallel {
 public:
  // rank0: the Model's backend (its full weights `full` stay there and every rank's weights
  // are row-slice views of them: one host memory, the CPU backend only); peers: the backends
  // of ranks 1..size-1. Initialises every rank's caches with its share of the heads.
  TensorParallel(const ModelConfig& cfg, const ModelWeights& full, Backend& rank0,
                 std::vector<std::unique_ptr<Backend>> peers, const ModelLimits& limits,
                 const std::vector<KvScales>& kv_scales);
  ~TensorParallel();
  int size() const { return int(ranks_.size()); }
  // One step on every rank. argmax non-null: the greedy tokens of the R logit rows; else the
  // logits [R, V] into `logits` (rank 0's workspace, [max_logit_rows, V]). extra: prompt
  // logprob rows (their logits go through `logits` too). trace: rank 0's residual stream.
  void forward(const StepMeta& meta, int64_t R, ForwardTrace* trace, int32_t* argmax,
               RowLogprobs* extra, Tensor& logits);
  void copy_state_slot(int32_t src, int32_t dst);

  struct Rank;

 private:
  void run_rank(Rank& k, const StepMeta& meta, int64_t R, ForwardTrace* trace, int32_t* argmax,
                RowLogprobs* extra, Tensor& logits);
  void run_guarded(Rank& k, int64_t R, ForwardTrace* trace, int32_t* argmax, RowLogprobs* extra,
                   Tensor& logits);
  void worker(int r);  // the thread of rank r > 0

  ModelConfig cfg_;
  ModelLimits limits_;
  bool want_argmax_ = false;
  bool sparse_split_ = true;  // KV heads split over the ranks (else the sparse mixer replicated)  // this step: the distributed argmax (set before the ranks run)
  std::unique_ptr<CpuCommGroup> group_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  // The step forward() hands to the workers of ranks 1..: posted under mu_ with a new
  // generation; pending_ counts the workers still running it.
  struct Job {
    int64_t R = 0;
    RowLogprobs* extra = nullptr;
    Tensor* logits = nullptr;
  };
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  Job job_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace sala
