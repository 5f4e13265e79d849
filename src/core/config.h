// Typed, validated model configuration read from the checkpoint's config.json
// (../shared/SPEC.md §2). Every key the forward pass depends on is required; a missing or
// ill-typed key, an unknown mixer type or a sparse group ratio other than 16 is refused
// with sala::Error naming the key.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace sala {

enum class MixerType { Sparse, Lightning };  // "minicpm4" | "lightning-attn"

struct SparseConfig {
  int block_size = 64;
  int dense_len = 8192;
  int init_blocks = 1;
  int kernel_size = 32;    // level-1 compression window
  int kernel_stride = 16;  // level-1 compression stride
  int topk = 64;           // plus window_size/block_size forced local blocks
  int window_size = 2048;
  bool use_nope = false;

  int level2_window() const { return 4 * kernel_size; }
  int level2_stride() const { return 4 * kernel_stride; }
  int local_blocks() const { return window_size / block_size; }
  int total_topk() const { return topk + local_blocks(); }

  // The dense/sparse rule (docs/ARCHITECTURE.md "Invariants"): a call of a sparse layer takes
  // the InfLLM-v2 path iff the sequence's total length after the call reaches dense_len, or
  // always with --dense-as-sparse (StepMeta::dense_as_sparse). Every row of the call follows it.
  bool sparse_call(int64_t total_len, bool dense_as_sparse) const {
    return dense_as_sparse || total_len >= dense_len;
  }
  // The smallest total length (>= 1) whose call is sparse: where the scheduler must end a
  // chunk so that the choice depends on the sequence alone.
  int first_sparse_len(bool dense_as_sparse) const { return dense_as_sparse ? 1 : dense_len; }
  // Whether prefill chunks of `chunk` tokens (boundaries at its multiples) give every row of a
  // prompt of at least dense_len tokens the attention of its one-shot prefill (which is sparse
  // for all rows). A chunk that ends below dense_len is computed dense; that equals the sparse
  // path only for rows t < total_topk() * block_size, whose visible blocks are all selected.
  // The 9B (dense_len 8192, 96 blocks of 64): chunks of 8192, 4096, 2048 keep it; 1024 not.
  bool chunk_keeps_one_shot_attention(int64_t chunk, bool dense_as_sparse) const {
    if (dense_as_sparse || chunk <= 0) return dense_as_sparse;
    const int64_t last_dense_end = (int64_t(dense_len - 1) / chunk) * chunk;
    return last_dense_end <= int64_t(total_topk()) * block_size;
  }
};

// A checkpoint's `quantization_config` (config.json), compressed-tensors' layouts that vLLM and
// SGLang load, per Linear module:
//   FP8_W8A8  "float-quantized" (llm-compressor's FP8_DYNAMIC): e4m3 weights with one scale per
//             output channel (`<m>.weight` F8_E4M3, `<m>.weight_scale` [out, 1]), input
//             activations quantized per token at run time;
//   W4A16     "pack-quantized" (llm-compressor's W4A16 / GPTQ): symmetric int4 with one scale
//             per group of input columns (`<m>.weight_packed` I32 [out, in / 8],
//             `<m>.weight_scale` [out, in / group], `<m>.weight_shape` I32 [2]; core/int4.h).
// config_groups give each a list of targets ("Linear", an exact module name or a "re:" regex,
// matched from the name's start as Python's re.match); `ignore` leaves modules dense. One
// checkpoint may mix the schemes (format "mixed-precision", each group with its own
// "format"). Anything else is refused when config.json is read (quant_config.cpp), naming what
// is not implemented.
enum class QuantScheme : uint8_t { None, FP8_W8A8, W4A16 };
struct ModuleQuant {
  QuantScheme scheme = QuantScheme::None;
  int32_t group_size = 0;  // W4A16: input columns per scale (0: one per output channel)
  bool operator==(const ModuleQuant&) const = default;
};
struct QuantGroup {
  std::string name;                  // config_groups key, for messages
  std::vector<std::string> targets;  // "Linear", names, "re:" regexes
  ModuleQuant quant;
};
struct QuantizationConfig {
  std::vector<QuantGroup> groups;   // empty: not quantized
  std::vector<std::string> ignore;  // modules left dense: names ("lm_head") or "re:" regexes
  bool any() const { return !groups.empty(); }
  // Whether module `name` (a tensor name without ".weight") is left dense.
  bool ignores(const std::string& name) const;
  // The scheme of Linear module `name`: None when ignored or not targeted; an exact name
  // beats a regex, which beats "Linear"; two groups at the same rank with different schemes
  // are a sala::Error naming both (`source`: config.json, for the message).
  ModuleQuant scheme_of(const std::string& name, const std::string& source) const;
};

struct ModelConfig {
  std::string source;  // path of config.json, for messages
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int vocab_size = 0;
  // sparse (minicpm4) layers
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  bool attn_use_output_gate = true;
  // lightning layers
  int lightning_nh = 0;
  int lightning_nkv = 0;
  int lightning_head_dim = 0;
  double lightning_scale = 0;  // resolved from "1/sqrt(d)"
  bool use_output_gate = true;
  bool use_output_norm = true;
  bool qk_norm = true;
  bool lightning_use_rope = true;
  double rope_theta = 10000.0;
  // scalings
  double rms_norm_eps = 1e-6;
  double scale_emb = 12;
  double scale_depth = 1.4;
  double dim_model_base = 256;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  int bos_token_id = 1;
  std::vector<int> eos_token_ids;
  SparseConfig sparse;
  QuantizationConfig quantization;
  std::vector<MixerType> mixer_types;

  // Derived constants (SPEC §2 "Derived constants").
  float residual_scale() const { return float(scale_depth / std::sqrt(double(num_hidden_layers))); }
  float logit_divisor() const { return float(hidden_size / dim_model_base); }
  float attn_scale() const { return float(1.0 / std::sqrt(double(head_dim))); }
  int kv_group() const { return num_attention_heads / num_key_value_heads; }
  int num_sparse_layers() const;
  int num_lightning_layers() const;
  // Index of layer i among the layers of its own kind (KV pool / state pool index).
  int kind_index(int layer) const;
  // ALiBi slopes for the lightning heads (SPEC §8.2); same in every layer.
  std::vector<float> lightning_slopes() const;
};

ModelConfig load_model_config(const std::string& path_or_dir);
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
const char* mixer_name(MixerType t);

}  // namespace sala
