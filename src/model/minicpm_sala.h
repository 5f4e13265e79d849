// MiniCPM-SALA: the one explicit forward pass (SPEC §5, §8, §9), written once against the
// Backend ops so the CPU reference and the CUDA backend run the same model code.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"
#include "model/weights.h"

namespace sala {

struct ModelLimits {
  int32_t max_step_tokens = 8192;  // rows of one forward (chunked-prefill size + decodes)
  int32_t max_logit_rows = 256;    // rows whose logits one forward returns
  // Speculative decoding: rows of every lightning layer's k and v kept from a verify step
  // (StepMeta::keep_lightning_rows) for rollback_state; 0: none kept (a rollback recomputes).
  int32_t keep_verify_rows = 0;
  CacheShape caches;
  // Tensor parallelism's lightning o_norm (one RMSNorm over all heads, the heads split over
  // the ranks): false, the split norm (each rank's Σ x² of its columns, one all-reduce of [T]
  // floats, each rank norms its own columns); true, all-gather the heads and the z gate, norm
  // the whole row as one rank does, take the rank's columns back (TP=1's numbers exactly; two
  // all-gathers of [T, nh*d/n] per layer). An A/B until measured over NCCL.
  bool tp_gather_o_norm = false;
  // Tensor parallelism over GPUs: the peer communicator (one kernel per collective, meeting on
  // device flags over peer access; backend/cuda/cuda_comm_peer.cpp) instead of NCCL. Ranks on
  // one GPU always use it. An A/B until measured on two GPUs.
  bool tp_peer_comm = false;
};

// Optional per-layer trace for golden debugging: residual stream rows (fp32).
struct ForwardTrace {
  // hidden[k] is [T, H]: k = 0 embeddings, k = i+1 after layer i, last: after final norm.
  std::vector<std::vector<float>> hidden;
};

// Log-probabilities of some rows of a step (Backend::logprobs_rows: the raw distribution,
// before temperature and penalties). The caller fills rows, targets and top_n; the model
// fills the results.
struct RowLogprobs {
  std::vector<int32_t> rows;     // ascending step rows (forward) or logit rows (logprobs)
  std::vector<int32_t> targets;  // per row: the token whose log-probability is wanted
  int32_t top_n = 0;             // alternatives per row, <= kMaxTopLogprobs
  std::vector<float> logprob;       // [rows]
  std::vector<int32_t> top_ids;     // [rows, top_n], largest first, ties to the lowest id
  std::vector<float> top_logprobs;  // [rows, top_n]
  void clear() {
    rows.clear();
    targets.clear();
    top_n = 0;
  }
};

class TensorParallel;

class Model {
 public:
  // Steps are recorded as CUDA graphs only when every call has at most this many rows.
  static constexpr int kGraphMaxCallRows = 16;
  // peers: tensor parallelism (model/tensor_parallel.h) over 1 + peers.size() ranks, `backend`
  // rank 0 and peers ranks 1.. (backends of the same kind and options); empty: one rank.
  // sala::Error where the weights cannot be split (no load-time quantization; heads etc.
  // divisible by the rank count; W4A16 groups whole) or the ranks have no communicator (backend/comm.h). Steps of more than
  // one rank are recorded where every communicator can be captured (NCCL).
  Model(ModelConfig cfg, std::unique_ptr<Backend> backend, const Checkpoint& ckpt,
        const ModelLimits& limits, std::vector<std::unique_ptr<Backend>> peers = {});
  ~Model();
  // One step: logits [meta.logit_rows.size(), vocab] fp32, row-major, into `logits`; or,
  // with `argmax` given, only the greedy token of each logit row (the logits stay on the
  // device and `logits` is left untouched).
  // `extra`: step rows of any kind (prompt rows, not only logit rows) whose log-probabilities
  // the step computes as well (prompt logprobs); they go through the logits workspace in
  // groups of max_logit_rows rows, so a prompt of any length takes no more memory, and only
  // their results reach the host. A step with extra rows is never a recorded one.
  // `masks`: structured output's allowed tokens of some logit rows, applied to the logits
  // (Backend::mask_logits) before the argmax or the download; later `logprobs` calls see the
  // masked rows too (as vLLM: a grammar's logprobs are those of the masked distribution).
  // `keep_logits`: neither the argmax nor the download; the logits stay in the workspace for
  // logits() (sampling on the device).
  void forward(const StepMeta& meta, std::vector<float>& logits, ForwardTrace* trace = nullptr,
               std::vector<int32_t>* argmax = nullptr, RowLogprobs* extra = nullptr,
               const LogitMasks* masks = nullptr, bool keep_logits = false);
  // The logits workspace [max_logit_rows, vocab] fp32 in backend memory: after forward, rows
  // [0, R) are the step's logit rows (Backend::sample_rows reads them there).
  Tensor logits() const { return {logits_.data, DType::F32, limits_.max_logit_rows, cfg_.vocab_size}; }
  // After forward: log-probabilities of some of its logit rows (indexes into
  // meta.logit_rows), from the logits still in the workspace (never downloaded whole).
  void logprobs(RowLogprobs& lp);

  const ModelConfig& config() const { return cfg_; }
  const ModelLimits& limits() const { return limits_; }
  Backend& backend() { return *backend_; }
  const ModelWeights& weights() const { return w_; }
  const std::vector<std::string>& unused_tensors() const { return unused_; }
  // Ranks of tensor parallelism (1: none).
  int tp_size() const;
  // Backend::copy_state_slot on every rank.
  void copy_state_slot(int32_t src, int32_t dst);
  // Speculative verify calls (issue 21): the next forward call on `slot` (in the first step
  // that has one; fewer than 64 rows after a prefix) leaves the state before it in
  // snapshot_slot and the state after it in `slot`, as copy_state_slot(slot, snapshot_slot)
  // before that step would, without the copy: the call reads the state where it is and writes
  // the new one into the snapshot's memory, and the two slots trade memory (slot_mem_; the
  // slots the caller names keep their meaning).
  void snapshot_state(int32_t slot, int32_t snapshot_slot);
  // Rollback after a verify call without computing its rows again (issue 21): the lightning
  // state of `slot` becomes snapshot_slot's (the state before the call) advanced over the
  // call's first `rows` rows, from the k and v rows the last forward kept
  // (StepMeta::keep_lightning_rows), by one kernel reading the snapshot and writing `slot` (no
  // copy): bit for bit the state that call left after those rows.
  // Deferred to the next forward or copy_state_slot, so the rolled-back calls of one step go
  // in one batch. false (nothing done) when the last forward kept no rows for `slot` (too
  // many rows, tensor parallelism, keep_verify_rows 0): the caller recomputes the rows.
  bool rollback_state(int32_t slot, int32_t snapshot_slot, int32_t rows);

 private:
  void trace_rows(ForwardTrace* trace, const Tensor& t);
  // The ops of one step (after begin_step): embedding .. logits of the R logit rows.
  // keep: k and v of the lightning layers go to keep_k_ / keep_v_ (rollback_state).
  void run_layers(int64_t T, int64_t R, ForwardTrace* trace, RowLogprobs* extra, bool keep);
  void flush_state_advances();  // rollback_state's deferred work
  // The backend slot that holds the state of `slot` (a slot the model owns, such as
  // scratch_slot_, maps to itself).
  int32_t mem_slot(int32_t slot) const {
    return size_t(slot) < slot_mem_.size() ? slot_mem_[size_t(slot)] : slot;
  }
  // meta with its state slots mapped to memory and the snapshots of snapshot_state applied
  // (mapped_), or meta itself while every slot is its own memory and none is pending.
  const StepMeta& map_state_slots(const StepMeta& meta);
  // The extra rows of run_layers, x: the final-normed hidden rows (divided in place).
  void extra_logprobs(Tensor& x, RowLogprobs& extra);
  // Recorded steps (CUDA graphs): decode steps and speculative verify steps, whose calls
  // each have at most 16 rows and want every row's logits in order. key: the recording's
  // (0: the step runs directly); padded_seqs: the batch bucket the step is padded to with
  // one-row calls.
  struct GraphStep {
    int key = 0, padded_seqs = 0;
  };
  GraphStep graph_step(const StepMeta& meta, ForwardTrace* trace, bool keep);
  // padded_ = step and the one-row calls that pad it to g's bucket (reading and writing only
  // the scratch page and slot: token 0 at position 0).
  const StepMeta& padded_step(const StepMeta& step, const GraphStep& g);

  ModelConfig cfg_;
  ModelLimits limits_;
  std::unique_ptr<Backend> backend_;
  ModelWeights w_;
  std::vector<std::string> unused_;
  std::vector<float> slopes_;
  // Workspaces, allocated once for max_step_tokens rows.
  Tensor h_, x_, q_, k_, v_, gate_, attn_, mix_, mlp_g_, mlp_u_, logit_in_, logits_;
  // Padding rows of recorded decode steps use a cache page and a state slot past the
  // engine's (allocated for them when the backend records steps).
  int32_t scratch_page_ = -1, scratch_slot_ = -1;
  StepMeta padded_;
  // Verify steps' padded layouts (rows per call, then whether any call is sparse) -> the id
  // of their recording.
  std::map<std::vector<int32_t>, int> verify_graph_ids_;
  std::vector<int32_t> layout_;  // graph_step's scratch
  std::unique_ptr<TensorParallel> tp_;  // null: one rank
  std::vector<int32_t> iota_;  // 0, 1, ..., max_logit_rows - 1: the rows of a logits group
  // rollback_state: k and v [n_lightning * keep_verify_rows, nh*d] of the last kept step
  // (layer li's rows from li * keep_verify_rows), its calls (empty: nothing kept), and the
  // state advances not yet run.
  Tensor keep_k_, keep_v_;
  std::vector<SeqSlice> kept_calls_;
  std::vector<StateAdvance> pending_advances_;
  // snapshot_state: the engine's state slots -> backend slots (a permutation of
  // [0, caches.num_slots); empty until the first snapshot), the (slot, snapshot) pairs not yet
  // taken (each waits for a step with a call on its slot), and the step's mapped StepMeta.
  std::vector<int32_t> slot_mem_;
  std::vector<std::pair<int32_t, int32_t>> pending_snapshots_;
  StepMeta mapped_;
};

}  // namespace sala
