// StepPlan: the step's metadata on the device. begin() packs StepMeta into one pinned host
// blob and copies it to one device buffer (one copy per step); StepDev holds the device views
// the kernels read, plus the per-step counts the dispatch decisions use (short / long
// lightning calls, row tiles, sparse and one-token sequences).
//
// Invariants: every offset in the blob depends only on (S, T, R) — the page table, whose
// length varies from step to step, comes last — so a recorded step reads the same addresses
// at every launch. The buffer grows only when a step exceeds every earlier size (with a
// warning; it is sized at start first), and drops the graphs when it moves. The pinned blob
// is rewritten only after the previous step's copy has left it (an event).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_graph_cache.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/step.h"
#include "core/config.h"

namespace sala::cuda_host {

// Device views of the step metadata (valid after StepPlan::begin).
struct StepDev {
  const int32_t* token_ids = nullptr;   // [T]
  const int32_t* positions = nullptr;   // [T]
  const int32_t* row_seq = nullptr;     // [T] index into seqs
  const cuda::DevSeq* seqs = nullptr;   // [S]
  const int32_t* page_table = nullptr;  // [P]
  const int32_t* logit_rows = nullptr;  // [R]
  const int32_t* short_seqs = nullptr;  // lightning: seqs with < 64 tokens
  const int32_t* long_seqs = nullptr;   // lightning: seqs with >= 64 tokens
  int T = 0, S = 0, P = 0, R = 0, n_short = 0, n_long = 0;
  // [n_tiles] (first row, rows) of <= 8 rows of one seq; one row each for split calls,
  // except in shared_tiles steps
  const int2* tiles = nullptr;
  int n_tiles = 0;
  int n_sparse_seqs = 0;                // seqs whose sparse layers run InfLLM-v2
  int n_one_token = 0;                  // seqs with one token in this step (decode)
  // No prompt chunk: every call of several rows returns every row's logits (speculative
  // verify calls and recompute calls, issue 21); decode-only steps too. A prompt chunk that
  // returns every row's logits (prompt logprobs from position 0 of the chunk) counts as one:
  // its rows then take the skinny GEMM of speculative steps, whose bits are not those of the
  // chunk alone (GemmDispatch::skinny_step_rows).
  bool prompt_free = true;
  // A wide speculative step: more than kSplitCallRows rows, prompt_free, not decode-only (e.g.
  // 8 sequences verifying 4 drafts each). Its rows are not held to decode-row bits (its GEMMs
  // are the skinny GEMM's, GemmDispatch::skinny_step_rows), so the rows of a split call share
  // attention tiles of up to 8 rows: each K/V tile loaded once per call, not once per row.
  // A function of the calls' row counts only (as every grid of a recorded step).
  bool shared_tiles = false;
  int n_split_seqs = 0, n_split_rows = 0;  // calls of <= kSplitCallRows rows, and their rows
};

class StepPlan {
 public:
  StepPlan(cudaStream_t stream, DeviceArena& arena, GraphCache& graphs);
  ~StepPlan();
  StepPlan(const StepPlan&) = delete;
  StepPlan& operator=(const StepPlan&) = delete;

  // Uploads meta (which must outlive the step); `sparse` decides which sequences run
  // InfLLM-v2 in the sparse layers (SparseConfig::sparse_call).
  void begin(const StepMeta& meta, const SparseConfig& sparse);
  const StepMeta* meta() const { return meta_; }  // null before the first step
  const StepDev& dev() const { return sd_; }
  // Whether sequence i of the step runs InfLLM-v2 in the sparse layers (DevSeq::sparse, read
  // from the pinned blob).
  bool seq_sparse(int i) const {
    return reinterpret_cast<const cuda::DevSeq*>(host_)[i].sparse != 0;
  }

 private:
  void ensure_capacity(size_t ints, bool warn);

  cudaStream_t stream_;
  DeviceArena& arena_;
  GraphCache& graphs_;
  const StepMeta* meta_ = nullptr;
  int32_t* host_ = nullptr;  // pinned
  int32_t* dev_ = nullptr;
  size_t cap_ints_ = 0;
  cudaEvent_t copied_ = nullptr;
  StepDev sd_;
};

}  // namespace sala::cuda_host
