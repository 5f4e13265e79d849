#include "server/launch.h"

#include <fmt/core.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/safetensors.h"
#include "engine/request_check.h"
#include "model/minicpm_sala.h"
#include "model/tensor_parallel.h"

namespace sala::server {

std::string default_model_dir() {
  if (const char* env = std::getenv("SALA_MODEL_DIR"); env && *env) return env;
#ifdef SALA_DEFAULT_MODEL_DIR
  return SALA_DEFAULT_MODEL_DIR;
#else
  fail("no --model-path given and SALA_MODEL_DIR is not set");
#endif
}

namespace {

std::string tokenizer_file(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path j = fs::path(dir) / "tokenizer.json";
  return (fs::exists(j) ? j : fs::path(dir) / "tokenizer.model").string();
}

// The draft model must speak the target's token ids: the same config vocabulary and the same
// tokenizer (every token's string, BOS and EOS). sala::Error naming the draft's file.
void check_draft_compatible(const Loaded& L, const std::string& target_dir,
                            const ModelConfig& dcfg, const std::string& draft_dir) {
  namespace fs = std::filesystem;
  const std::string dconf = (fs::path(draft_dir) / "config.json").string();
  if (dcfg.vocab_size != L.cfg.vocab_size)
    fail("--speculative-draft-model-path: {} has vocab_size {}, the target's {} has {}", dconf,
         dcfg.vocab_size, (fs::path(target_dir) / "config.json").string(), L.cfg.vocab_size);
  const std::unique_ptr<Tokenizer> dt = Tokenizer::load(draft_dir);
  const std::string dfile = tokenizer_file(draft_dir), tfile = tokenizer_file(target_dir);
  if (dt->vocab_size() != L.tok->vocab_size())
    fail("--speculative-draft-model-path: the tokenizer {} has {} tokens, the target's {} has {}",
         dfile, dt->vocab_size(), tfile, L.tok->vocab_size());
  for (int32_t i = 0; i < dt->vocab_size(); ++i)
    if (dt->id_to_token(i) != L.tok->id_to_token(i))
      fail("--speculative-draft-model-path: token {} is '{}' in the tokenizer {} and '{}' in the "
           "target's {}: the draft model needs the target's tokenizer", i, dt->id_to_token(i),
           dfile, L.tok->id_to_token(i), tfile);
  if (dt->bos_id() != L.tok->bos_id() || dt->eos_ids() != L.tok->eos_ids())
    fail("--speculative-draft-model-path: the tokenizer {} has other BOS / EOS tokens than the "
         "target's {}", dfile, tfile);
}

}  // namespace

Loaded launch(const LaunchOptions& o) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(o.model_path)) fail("model path '{}' is not a directory", o.model_path);
  Loaded L;
  L.cfg = load_model_config(o.model_path);
  // Refused at start, as SGLang does without its override variable (never a server that
  // later fails on a long request).
  check_model_context(L.cfg, o.engine.max_context_len, "--context-length");
  L.tok = Tokenizer::load(o.model_path);
  try {
    L.tmpl = ChatTemplate::load(o.model_path, *L.tok);
  } catch (const sala::Error& e) {
    L.template_error = e.what();
    if (o.verbose) fmt::print(stderr, "warning: no usable chat template ({}); /v1/chat/completions is disabled\n", e.what());
  }

  BackendOptions bo;
  bo.threads = o.cpu_threads;
  if (o.dtype == "auto" || o.dtype == "float32" || o.dtype == "fp32") bo.mode = NumericMode::F32;
  else if (o.dtype == "bfloat16" || o.dtype == "bf16") bo.mode = NumericMode::BF16;
  else fail("--dtype '{}' is not supported (auto, float32, bfloat16)", o.dtype);
  if (o.quantization == "fp8") bo.fp8_weights = true;
  else if (o.quantization == "w4a16") bo.int4_group_size = 128;  // RTN, group 128 (core/int4.h)
  else if (!o.quantization.empty())
    fail("--quantization '{}' is not supported (fp8, w4a16, or none)", o.quantization);
  bo.kv_cache_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  bo.int4_prefill_gemm = o.int4_prefill_gemm;
  // FP8 KV on Hopper: the bf16 shadow of prompt chunks' pages holds one --context-length
  // sequence when one is given (else the longest the pool holds, up to the model's limit).
  if (o.engine.max_context_len > 0) bo.fp8_kv_shadow_tokens = o.engine.max_context_len;
  Checkpoint ckpt(o.model_path);
  if (o.device == "cuda") {
    bo.mode = NumericMode::BF16;  // the GPU path is bf16 by contract
    bo.cuda_graphs = o.cuda_graphs;
    bo.cuda_device = o.base_gpu_id;
  }
  ModelConfig dcfg;
  const bool draft = !o.draft_model_path.empty();
  if (draft) {
    if (!fs::is_directory(o.draft_model_path))
      fail("--speculative-draft-model-path '{}' is not a directory", o.draft_model_path);
    dcfg = load_model_config(o.draft_model_path);
    check_draft_compatible(L, o.model_path, dcfg, o.draft_model_path);
  }
  std::unique_ptr<Backend> backend = make_backend(o.device, bo);
  size_t cache_budget = o.kv_memory_bytes;
  // Tensor parallelism over GPUs: every GPU holds one rank's share (its heads' weights, KV
  // pages and states), so its memory is planned for that share. CPU ranks share one memory.
  const ModelConfig plan_cfg =
      o.device == "cuda" && o.tp_size > 1 ? tp_rank_config(L.cfg, o.tp_size) : L.cfg;
  if (o.device == "cuda") {
    // SGLang's --mem-fraction-static: weights + KV pool + state slots take this fraction of
    // the GPU; activations, cuBLASLt workspace, graphs and the FP8 KV cache's bf16 shadow (512
    // MB for a 512K-token context of the 9B) get a fixed reserve of the rest.
    // A draft model shares the device: its bf16 weights (no load-time quantization) count too.
    const size_t weight_bytes =
        planned_weight_bytes(plan_cfg, backend->linear_format(), backend->weight_format(),
                             bo.int4_group_size, backend->int4_weight_copies()) +
        (draft ? planned_weight_bytes(dcfg, backend->weight_format(), backend->weight_format(), 0)
               : 0);
    const size_t total = backend->device_memory_total();
    const size_t reserve = size_t(6) << 30;
    const double usable = o.mem_fraction_static * double(total);
    if (usable < double(weight_bytes + reserve))
      fail("--mem-fraction-static {} of {:.1f} GiB leaves no room for the KV cache after {:.1f} GiB "
           "of weights", o.mem_fraction_static, double(total) / (1 << 30),
           double(weight_bytes) / (1 << 30));
    cache_budget = size_t(usable) - weight_bytes - reserve;
  }

  if (!L.cfg.sparse.chunk_keeps_one_shot_attention(o.engine.chunked_prefill_size,
                                                   o.engine.dense_as_sparse))
    fmt::print(stderr,
               "warning: --chunked-prefill-size {}: prompts of {}+ tokens get dense attention in "
               "rows that their one-shot prefill computes sparse (chunks ending below dense_len "
               "{} reach past the {} always-selected tokens); use a divisor of {} of at least {}\n",
               o.engine.chunked_prefill_size, L.cfg.sparse.dense_len, L.cfg.sparse.dense_len,
               L.cfg.sparse.total_topk() * L.cfg.sparse.block_size, L.cfg.sparse.dense_len,
               L.cfg.sparse.dense_len - L.cfg.sparse.total_topk() * L.cfg.sparse.block_size);
  ModelLimits lim = plan_limits(plan_cfg, o.engine, cache_budget, o.max_total_tokens,
                                backend->kv_element_bytes(), draft ? &dcfg : nullptr);
  std::unique_ptr<Model> draft_model;
  if (draft) {
    BackendOptions dbo = bo;  // the same device, mode and KV type; no load-time quantization
    dbo.fp8_weights = false;
    dbo.int4_group_size = 0;
    draft_model = std::make_unique<Model>(dcfg, make_backend(o.device, dbo),
                                          Checkpoint(o.draft_model_path),
                                          plan_draft_limits(dcfg, o.engine, lim));
  }
  auto model = std::make_unique<Model>(L.cfg, std::move(backend), ckpt, lim,
                                       make_tp_peers(o.device, bo, o.tp_size));
  L.engine = make_engine(std::move(model), o.engine, std::move(draft_model));
  const EngineInfo info = L.engine->info();
  L.max_total_tokens = info.max_total_tokens > 0 ? info.max_total_tokens
                                                 : int64_t(lim.caches.num_pages) * lim.caches.page_size;
  L.max_context_len = info.max_context_len > 0
                          ? info.max_context_len
                          : std::min<int64_t>(o.engine.max_context_len > 0 ? o.engine.max_context_len
                                                                           : L.cfg.max_position_embeddings,
                                              L.max_total_tokens);
  L.vocab_size = info.vocab_size > 0 ? info.vocab_size : L.cfg.vocab_size;
  return L;
}

}  // namespace sala::server
