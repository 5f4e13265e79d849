// `sala quantize`: a bf16 / fp16 / fp32 checkpoint rewritten in compressed-tensors' layouts
// (core/config.h QuantizationConfig) that vLLM and SGLang load and `sala serve` runs without
// flags: FP8 W8A8 ("float-quantized"), W4A16 ("pack-quantized", RTN or GPTQ codes), or a mix
// per module ("mixed-precision").
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"

namespace sala {

struct QuantizeOptions {
  bool quantize_lm_head = false;       // lm_head quantized too (else in ignore, kept as it is)
  // Modules kept as they are (listed in `ignore`), in compressed-tensors' own syntax: a module
  // name ("model.layers.3.mlp.down_proj") or a "re:" regex matched from the name's start
  // (`sala quantize --ignore`). uniform_plan leaves them out.
  std::vector<std::string> ignore;
  uint64_t shard_bytes = 5'000'000'000;  // a new shard once a shard would pass this
};

// The scheme of every Linear module to write ("model.layers.0.mlp.down_proj" -> W4A16 group
// 128); a module not in the plan is copied as it is and listed in `ignore`.
using QuantPlan = std::map<std::string, ModuleQuant>;

// W4A16 codes computed before writing (GPTQ): words [N, K / 8] (core/int4.h packing), scales
// [N, K / group] (bf16 values). Modules of the plan without precomputed codes get RTN.
struct Int4Codes {
  std::vector<uint32_t> words;
  std::vector<float> scales;
  int32_t group = 0;
};
using Int4CodeMap = std::map<std::string, Int4Codes>;

// Reads `in_dir` tensor by tensor (memory: one tensor and its codes at a time, plus `codes`)
// and writes `out_dir` (which must not exist or be empty): each planned module in its scheme
// (FP8: "<m>.weight" F8_E4M3 + "<m>.weight_scale" [out, 1] F32, core/fp8.h fp8_quantize_rows;
// W4A16: "<m>.weight_packed" I32, "<m>.weight_scale" BF16 [out, in / group], "<m>.weight_shape"
// I32 [2]), every other tensor as it was; config.json with the quantization_config (plus
// `extra_config`'s keys in it, e.g. the mixed plan's record); every other file of `in_dir`
// (tokenizer, chat template, generation config) copied. progress(done, total) after each
// tensor. sala::Error for an input that is already quantized or an unusable out_dir.
void write_quantized_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                const QuantPlan& plan, const Int4CodeMap& codes,
                                const QuantizeOptions& opts, const nlohmann::json& extra_config,
                                const std::function<void(size_t, size_t)>& progress = {});

// Every Linear module of the checkpoint (lm_head only with opts.quantize_lm_head) -> q.
QuantPlan uniform_plan(const ModelConfig& c, const ModuleQuant& q, const QuantizeOptions& opts);

// `sala quantize --scheme fp8`: uniform_plan with FP8_W8A8.
void quantize_checkpoint_fp8(const std::string& in_dir, const std::string& out_dir,
                             const QuantizeOptions& opts,
                             const std::function<void(size_t, size_t)>& progress = {});

}  // namespace sala
