// One forward step over a batch of sequences: the flat per-step plan the model runner
// builds once and every backend op reads (the backend's input, so it lives in the backend
// layer; the model and the engine fill it). Rows of every activation tensor are the step's
// tokens in this order: sequence 0's tokens, then sequence 1's, ...
#pragma once
#include <cstdint>
#include <vector>

namespace sala {

struct SeqSlice {
  int32_t token_begin = 0;  // first row of this sequence in the step
  int32_t num_tokens = 0;   // rows this step (1 for a decode step)
  int64_t past_len = 0;     // tokens already in the caches; positions past_len.. past_len+n-1
  int32_t state_slot = -1;  // lightning-state slot (StatePool): the state before the call
  // Where the state after the call goes: -1, state_slot itself; another slot only for calls of
  // fewer than 64 rows (speculative verify calls, Model::snapshot_state), whose state before
  // the call then stays in state_slot.
  int32_t state_dst_slot = -1;
  int32_t dst_slot() const { return state_dst_slot < 0 ? state_slot : state_dst_slot; }
  int32_t page_begin = 0;   // this sequence's pages: StepMeta::page_table[page_begin ..
  int32_t num_pages = 0;    //   page_begin + num_pages), in position order
  int64_t total_len() const { return past_len + num_tokens; }
};

// Backend::advance_lightning_states: the state of `src_slot` advanced by the recurrence over
// `rows` kept rows starting at `row` (issue 21: a verify call's accepted rows, after a
// rejection), into `slot` (src_slot -1: `slot` itself, in place).
struct StateAdvance {
  int32_t slot = -1;
  int32_t row = 0;
  int32_t rows = 0;
  int32_t src_slot = -1;
  int32_t from() const { return src_slot < 0 ? slot : src_slot; }
};

// Selected blocks captured for the golden checks: for each (sparse layer, kv head, row)
// the ascending block list. Only filled when StepMeta::capture is non-null.
struct BlockCapture {
  // key: rows are step rows; selections[sparse_layer][kv_head][row] = blocks
  std::vector<std::vector<std::vector<std::vector<int32_t>>>> selections;
  // CpuBackend only, when want_scores: the pooled block scores that top-k ranked,
  // block_scores[sparse_layer][kv_head][row] (empty for dense rows), so that tests can tell a
  // near-tie of the k-th and (k+1)-th block from a wrong selection.
  bool want_scores = false;
  std::vector<std::vector<std::vector<std::vector<float>>>> block_scores;
  // CudaBackend: sparse layers whose stage 2 read the FP8 KV cache's bf16 shadow (tests check
  // that the path they compare ran).
  int64_t kv_shadow_layers = 0;
};

struct StepMeta {
  std::vector<int32_t> token_ids;   // [T]
  std::vector<int32_t> positions;   // [T] absolute positions
  std::vector<SeqSlice> seqs;
  std::vector<int32_t> page_table;  // concatenated page ids of all sequences
  std::vector<int32_t> logit_rows;  // rows whose logits the step returns, in order
  bool dense_as_sparse = false;     // sparse selection at every length (SGLang's flag)
  // Speculative verify steps: the model keeps every lightning layer's k and v rows of the step
  // (Model::rollback_state advances a rolled-back state over them instead of a recompute).
  bool keep_lightning_rows = false;
  BlockCapture* capture = nullptr;  // debug hook for golden checks

  int32_t num_tokens() const { return int32_t(token_ids.size()); }
  // Appends a sequence's rows; the caller fills pages before or after.
  void add_seq(const int32_t* ids, int32_t n, int64_t past_len, int32_t state_slot,
               const std::vector<int32_t>& pages, bool all_logits, bool last_logit);
};

}  // namespace sala
