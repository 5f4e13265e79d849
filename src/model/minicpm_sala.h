// MiniCPM-SALA: the one explicit forward pass (SPEC §5, §8, §9), written once against the
// Backend ops so the CPU reference and the CUDA backend run the same model code.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"
#include "model/weights.h"

namespace sala {

struct ModelLimits {
  int32_t max_step_tokens = 8192;  // rows of one forward (chunked-prefill size + decodes)
  int32_t max_logit_rows = 256;    // rows whose logits one forward returns
  CacheShape caches;
};

// Optional per-layer trace for golden debugging: residual stream rows (fp32).
struct ForwardTrace {
  // hidden[k] is [T, H]: k = 0 embeddings, k = i+1 after layer i, last: after final norm.
  std::vector<std::vector<float>> hidden;
};

class Model {
 public:
  Model(ModelConfig cfg, std::unique_ptr<Backend> backend, const Checkpoint& ckpt,
        const ModelLimits& limits);
  // One step: logits [meta.logit_rows.size(), vocab] fp32, row-major, into `logits`; or,
  // with `argmax` given, only the greedy token of each logit row (the logits stay on the
  // device and `logits` is left untouched).
  void forward(const StepMeta& meta, std::vector<float>& logits, ForwardTrace* trace = nullptr,
               std::vector<int32_t>* argmax = nullptr);

  const ModelConfig& config() const { return cfg_; }
  const ModelLimits& limits() const { return limits_; }
  Backend& backend() { return *backend_; }
  const ModelWeights& weights() const { return w_; }
  const std::vector<std::string>& unused_tensors() const { return unused_; }

 private:
  void trace_rows(ForwardTrace* trace, const Tensor& t);
  // The ops of one step (after begin_step): embedding .. logits of the R logit rows.
  void run_layers(int64_t T, int64_t R, ForwardTrace* trace);
  // Recorded decode steps: the bucket (batch size the step is padded to) of an all-decode
  // step, or 0 if the step runs directly.
  int graph_bucket(const StepMeta& meta, ForwardTrace* trace) const;

  ModelConfig cfg_;
  ModelLimits limits_;
  std::unique_ptr<Backend> backend_;
  ModelWeights w_;
  std::vector<std::string> unused_;
  std::vector<float> slopes_;
  // Workspaces, allocated once for max_step_tokens rows.
  Tensor h_, x_, q_, k_, v_, gate_, attn_, mix_, mlp_g_, mlp_u_, logit_in_, logits_;
  // Padding rows of recorded decode steps use a cache page and a state slot past the
  // engine's (allocated for them when the backend records steps).
  int32_t scratch_page_ = -1, scratch_slot_ = -1;
  StepMeta padded_;
};

}  // namespace sala
