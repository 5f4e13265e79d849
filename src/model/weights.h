// The checkpoint's tensors by their Hugging Face names (SPEC §3), checked and uploaded to
// a backend. Every expected tensor must be present with its exact shape; tensors the model
// does not use are reported (RoPE buffers excepted, which HF does not persist).
#pragma once
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"
#include "core/safetensors.h"

namespace sala {

// The projections that read the same input are stacked at load into one weight each
// (qkvg = [q_proj; k_proj; v_proj; gate], gate_up = [gate_proj; up_proj]); the separate
// tensors below are row-slice views of those (rows of an [N, K] weight are contiguous).
struct LayerWeights {
  MixerType type;
  Tensor qkvg;     // [nh*d + 2*kv*d + nh*d, H]: q_proj, k_proj, v_proj, gate
  Tensor gate_up;  // [2I, H]: gate_proj, up_proj
  Tensor input_layernorm, post_attention_layernorm;  // [H]
  Tensor gate_proj, up_proj;                         // [I, H]
  Tensor down_proj;                                  // [H, I]
  Tensor q_proj;                                     // [nh*d, H]
  Tensor k_proj, v_proj;      // sparse: [kvh*d, H]; lightning: [nh*d, H]
  Tensor o_proj;              // [H, nh*d]
  Tensor gate;                // sparse: o_gate [nh*d, H]; lightning: z_proj [nh*d, H]
  Tensor q_norm, k_norm;      // lightning only: [d]
  Tensor o_norm;              // lightning only: [nh*d]
};

struct ModelWeights {
  Tensor embed_tokens;  // [V, H]
  Tensor norm;          // [H]
  Tensor lm_head;       // [V, H]
  std::vector<LayerWeights> layers;
};

// Names and shapes of every tensor the model needs, in load order.
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_tensors(const ModelConfig& c);

// Validates the checkpoint against the config (sala::Error naming the tensor and file on
// any mismatch) and uploads the weights. Unused tensors are returned in `unused`.
ModelWeights load_weights(const ModelConfig& c, const Checkpoint& ckpt, Backend& backend,
                          std::vector<std::string>* unused);

}  // namespace sala
