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
  Weight qkvg;     // [nh*d + 2*kv*d + nh*d, H]: q_proj, k_proj, v_proj, gate
  Weight gate_up;  // [2I, H]: gate_proj, up_proj
  Tensor input_layernorm, post_attention_layernorm;  // [H]
  Weight gate_proj, up_proj;                         // [I, H]
  Weight down_proj;                                  // [H, I]
  Weight q_proj;                                     // [nh*d, H]
  Weight k_proj, v_proj;      // sparse: [kvh*d, H]; lightning: [nh*d, H]
  Weight o_proj;              // [H, nh*d]
  Weight gate;                // sparse: o_gate [nh*d, H]; lightning: z_proj [nh*d, H]
  Tensor q_norm, k_norm;      // lightning only: [d]
  Tensor o_norm;              // lightning only: [nh*d]
};

struct ModelWeights {
  Tensor embed_tokens;  // [V, H]
  Tensor norm;          // [H]
  Weight lm_head;       // [V, H]; with tied embeddings, embed_tokens as a weight
  std::vector<LayerWeights> layers;
  // Bytes of the weights every decode step streams: the GEMM weights, lm_head included.
  size_t linear_bytes() const;
  // ... of the weights a prompt token goes through (all but lm_head, which a prefill reads
  // for its logit rows only).
  size_t body_linear_bytes() const;
};

// "x.weight" -> "x": the module name a quantization_config's ignore list speaks of.
std::string module_of(const std::string& name);
// The scheme a checkpoint with c's quantization_config stores tensor `name` (of `ndim` dims)
// in: every Linear weight (2-D, not the embedding) has its module's scheme (None: dense).
//   FP8_W8A8: "<m>.weight" F8_E4M3 codes and "<m>.weight_scale" [out, 1];
//   W4A16: "<m>.weight_packed" I32 [out, in / 8], "<m>.weight_scale" [out, in / group],
//          "<m>.weight_shape" I32 [2] instead of "<m>.weight" (core/int4.h).
ModuleQuant stored_scheme(const ModelConfig& c, const std::string& name, size_t ndim);
bool stored_fp8(const ModelConfig& c, const std::string& name, size_t ndim);
// The group size of a W4A16 module with `in` input columns (group_size 0: one per channel);
// sala::Error naming the module unless it divides `in`, which is a multiple of 8.
int32_t int4_group(const ModelConfig& c, const ModuleQuant& q, const std::string& module,
                   int64_t in);
// "fp8", "w4a16 (group 128)", "bf16 (dense)": for messages and plans.
std::string scheme_name(const ModuleQuant& q);

// Names and shapes of every tensor the model needs, in load order.
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_tensors(const ModelConfig& c);

// Validates the checkpoint against the config (sala::Error naming the tensor and file on
// any mismatch) and uploads the weights. Unused tensors are returned in `unused`.
// Bytes load_weights will allocate for the checkpoint of `c` on a backend whose projections
// are stored in format `linear` (Backend::linear_format) and lm_head, the embedding and the
// norms in the dense format `dense` (Backend::weight_format).
// With linear == INT4_GROUPED (W4A16 at load), int4_group is BackendOptions::int4_group_size.
// Each int4 weight counts int4_copies times (Backend::int4_weight_copies).
size_t planned_weight_bytes(const ModelConfig& c, WeightFormat linear, WeightFormat dense,
                            int32_t int4_group = 128, int int4_copies = 1);

// The FP8 KV scales of each sparse layer, in layer order: model.layers.N.self_attn.k_scale /
// v_scale (compressed-tensors' kv_cache_scheme, as vLLM / SGLang name them; a scalar or [1]
// float tensor), or the older self_attn.{k,v}_proj.output_scale; kDefaultKvScale (1.0,
// vLLM's default) where the checkpoint has neither. sala::Error for a malformed scale.
std::vector<KvScales> load_kv_scales(const ModelConfig& c, const Checkpoint& ckpt);

// One rank's share of the weights under tensor parallelism (model/tensor_parallel.h):
// Megatron's split, read straight from the checkpoint into the rank's backend.
// - Column-parallel (the rank's outputs, rows [rank·N/size, (rank+1)·N/size) of [N, K]):
//   q/k/v/o_gate of the sparse layers where their heads split (sparse_split), q/k/v/z_proj of
//   the lightning layers, gate_proj and up_proj. Stacked at load as with one rank.
// - Row-parallel (the rank's inputs, columns [rank·K/size, ..) of [N, K], copied): o_proj and
//   down_proj.
// - lm_head: rows [vocab0, vocab1) (vocab-parallel; with tied embeddings, a row slice of the
//   whole embedding). Norms and the embedding: whole.
// size 1: the whole model. A quantized checkpoint's codes and scales split the same way (FP8:
// an output channel's scale goes with its row, whole under a column split; W4A16: whole
// groups only); not load-time quantization (a rank would quantize part of a row), nor a
// quantized lm_head.
struct WeightShard {
  int rank = 0, size = 1;
  bool sparse_split = true;
  int64_t vocab0 = 0, vocab1 = -1;  // -1: the vocabulary's end
};

ModelWeights load_weights(const ModelConfig& c, const Checkpoint& ckpt, Backend& backend,
                          std::vector<std::string>* unused, const WeightShard& shard = {});

}  // namespace sala
