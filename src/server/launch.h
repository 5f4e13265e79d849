// Loading a model directory into a running engine + tokenizer + chat template, shared by
// `sala serve` and `sala generate`.
#pragma once
#include <memory>
#include <string>

#include "core/config.h"
#include "engine/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace sala::server {

struct LaunchOptions {
  std::string model_path;          // resolved directory
  std::string device = "cpu";      // cpu | cuda
  std::string dtype = "auto";      // auto | float32 | bfloat16 (CPU numeric mode)
  std::string quantization;        // "" | fp8 (BackendOptions::fp8_weights; CPU, and CUDA in bf16 mode) | w4a16 (int4_group_size 128; CPU)
  std::string kv_cache_dtype = "auto";  // auto | fp8_e4m3 | fp8_e5m2 (BackendOptions::kv_cache_dtype)
  bool int4_prefill_gemm = true;   // BackendOptions::int4_prefill_gemm
  int cpu_threads = 0;             // 0: all cores
  int tp_size = 1;                 // tensor-parallel ranks (model/tensor_parallel.h)
  EngineOptions engine;
  // STANDALONE speculation's draft model (engine.speculative.draft_model): a SALA checkpoint
  // whose config vocabulary and tokenizer equal the target's (else sala::Error naming the
  // file), on a backend of the same device, numeric mode and KV type; --quantization applies
  // to the target only (the draft is served as its checkpoint stores it).
  std::string draft_model_path;
  int64_t max_total_tokens = 0;    // KV pool size in tokens; 0: from kv_memory_bytes
  size_t kv_memory_bytes = size_t(512) << 20;  // CPU: KV pool + state slots
  double mem_fraction_static = 0.88;  // GPU: weights + caches + workspaces, of total memory
  bool cuda_graphs = true;
  int base_gpu_id = 0;  // BackendOptions::cuda_device of rank 0
  bool verbose = true;
};

struct Loaded {
  ModelConfig cfg;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> tmpl;  // null if the directory has no (supported) template
  std::string template_error;          // why tmpl is null
  std::unique_ptr<Engine> engine;
  int64_t max_context_len = 0;
  int64_t max_total_tokens = 0;
  int32_t vocab_size = 0;
};

// The model directory to use when none is given: $SALA_MODEL_DIR, else the bundled tiny
// model (<source dir>/models/sala-tiny-chat).
std::string default_model_dir();

Loaded launch(const LaunchOptions& opts);

}  // namespace sala::server
