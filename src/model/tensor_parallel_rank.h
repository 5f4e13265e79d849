// One rank of TensorParallel (model/tensor_parallel.h): its backend, communicator, weight
// shards and workspaces. Internal to tensor_parallel*.cpp.
#pragma once
#include <memory>
#include <vector>

#include "backend/comm.h"
#include "model/minicpm_sala.h"
#include "model/tensor_parallel.h"

namespace sala {

struct TensorParallel::Rank {
  int r = 0;
  Backend* be = nullptr;
  std::unique_ptr<Backend> owned;  // ranks > 0
  std::unique_ptr<Communicator> comm;
  // The rank's weights (WeightShard, model/weights.h): rank 0's are the Model's, the others'
  // `own`. Column-parallel qkvg [heads/n * d stacked, H] (all heads: a replicated sparse
  // mixer) and gate_up [2I/n, H]; row-parallel o_proj [H, heads*d/n] and down_proj [H, I/n];
  // lm_head [vocab1 - vocab0, H]; norms and the embedding whole.
  const ModelWeights* w = nullptr;
  ModelWeights own;
  int64_t vocab0 = 0, vocab1 = 0;  // the rank's ids (vocab_begin)
  std::vector<float> slopes;       // the GLOBAL slopes of the rank's lightning heads
  // Workspaces [max_step_tokens, cols]: the rank's shards (q..gate, attn: its heads' columns
  // [T, wide]; g, u: [T, I/n]), the gathered / replicated mixer output attn_full and z gate
  // gate_full [T, max(qd, ld)], and the row-parallel partials / their all-reduced sum mix [T, H].
  Tensor h, x, q, k, v, gate, attn, attn_full, gate_full, mix, g, u;
  Tensor sum_squares;  // [max_step_tokens, 1] fp32: the split o_norm's Σ x² of each row
  Tensor logit_in, logits_part;  // [max_logit_rows, H], [max_logit_rows, vocab1 - vocab0]
  StepMeta meta;
  BlockCapture cap;
};

}  // namespace sala
