// `sala quantize --scheme fp8`: a bf16 / fp16 / fp32 checkpoint rewritten in the
// compressed-tensors FP8 layout (core/config.h QuantizationConfig) that vLLM and SGLang load
// and `sala serve` runs without flags.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace sala {

struct QuantizeOptions {
  bool quantize_lm_head = false;       // lm_head in FP8 too (else in ignore, kept as it is)
  uint64_t shard_bytes = 5'000'000'000;  // a new shard once a shard would pass this
};

// Reads `in_dir` tensor by tensor (memory: one tensor and its codes at a time) and writes
// `out_dir` (which must not exist or be empty): every Linear weight as F8_E4M3 codes plus
// "<module>.weight_scale" [out, 1] F32 (core/fp8.h fp8_quantize_rows), every other tensor as
// it was; config.json with the quantization_config added; every other file of `in_dir`
// (tokenizer, chat template, generation config) copied. progress(done, total) after each
// tensor. sala::Error for an input that is already quantized or an unusable out_dir.
void quantize_checkpoint_fp8(const std::string& in_dir, const std::string& out_dir,
                             const QuantizeOptions& opts,
                             const std::function<void(size_t, size_t)>& progress = {});

}  // namespace sala
