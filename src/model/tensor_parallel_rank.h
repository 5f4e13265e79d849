// One rank of TensorParallel (model/tensor_parallel.h): its backend, communicator, weight
// shards and workspaces. Internal to tensor_parallel*.cpp.
#pragma once
#include <memory>
#include <vector>

#include "backend/comm.h"
#include "model/minicpm_sala.h"
#include "model/tensor_parallel.h"

namespace sala {

struct LayerShard {
  Weight q, k, v, gate;       // column-parallel: [heads/n * d, H] each (all heads: replicated sparse)
  Weight gate_proj, up_proj;  // column-parallel: [I/n, H]
  Weight o_proj;              // row-parallel: [H, heads*d/n], the rank's input columns (a copy)
  Weight down_proj;           // row-parallel: [H, I/n] (a copy)
};

struct TensorParallel::Rank {
  int r = 0;
  Backend* be = nullptr;
  std::unique_ptr<Backend> owned;  // ranks > 0
  std::unique_ptr<Communicator> comm;
  const ModelWeights* full = nullptr;  // norms, embedding (replicated)
  std::vector<LayerShard> layers;
  Weight lm_head;                  // [vocab1 - vocab0, H]
  int64_t vocab0 = 0, vocab1 = 0;  // the rank's ids (vocab_begin)
  std::vector<float> slopes;       // the GLOBAL slopes of the rank's lightning heads
  // Workspaces [max_step_tokens, cols]: the rank's shards (q..gate, attn: its heads' columns
  // [T, wide]; g, u: [T, I/n]), the gathered / replicated mixer output attn_full and z gate
  // gate_full [T, max(qd, ld)], and the row-parallel partials / their all-reduced sum mix [T, H].
  Tensor h, x, q, k, v, gate, attn, attn_full, gate_full, mix, g, u;
  Tensor logit_in, logits_part;  // [max_logit_rows, H], [max_logit_rows, vocab1 - vocab0]
  StepMeta meta;
  BlockCapture cap;
};

// dst[T, dst.cols] = src[:, c0 : c0 + dst.cols] (host fp32 tensors: the CPU backend's).
void copy_cols(const Tensor& src, int64_t c0, Tensor& dst);

}  // namespace sala
