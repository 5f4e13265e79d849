// LightningRunner: the lightning layers (simple GLA, SPEC §8) on the GPU. It owns the state
// slots ([num_slots, n_lightning, nh, d, d] fp32, zeroed at init_caches), the per-head decay
// tables ([nh][kGlaChunk + 1] = exp(n g), float of double as CpuBackend) and the workspace of
// the chunk-parallel prefill (per-chunk states, up to 128 MB, grown on the first long call;
// without room the serial chunked kernel runs). Steps whose calls all have < 64 tokens run
// the recurrent kernel, others the chunked ones (cuda_lightning*.cu).
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_graph_cache.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_op_timer.h"
#include "backend/cuda/cuda_rope_tables.h"
#include "backend/cuda/cuda_step_plan.h"

namespace sala::cuda_host {

class LightningRunner {
 public:
  // ws_max_floats: BackendOptions::gla_workspace_floats (0: 32 Mi).
  LightningRunner(bool bf16_mode, int64_t ws_max_floats, cudaStream_t stream,
                  DeviceArena& arena, const StepPlan& plan, const GraphCache& graphs,
                  OpTimer& timer, RopeTables& rope);
  LightningRunner(const LightningRunner&) = delete;
  LightningRunner& operator=(const LightningRunner&) = delete;

  void init_states(const ModelConfig& cfg, const CacheShape& shape);  // the state slots
  void copy_slot(int32_t src, int32_t dst);  // Backend::copy_state_slot, on the stream
  // Backend::advance_lightning_states: the recurrent kernel over kept rows, per layer.
  void advance(const Tensor& k, const Tensor& v, int64_t layer_rows,
               const std::vector<StateAdvance>& calls, const std::vector<float>& slopes);
  void init_tables();  // the model's decay tables (after init_states)
  void attention(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                 const std::vector<float>& slopes, float scale, Tensor& out);
  // The q/k norm + RoPE + recurrence in one kernel; false (nothing done) outside the steps
  // it serves: the caller runs Backend's default (qk_norm_rope, then attention).
  bool qk_attention(int li, Tensor& q, Tensor& k, const Tensor& v, const Tensor& qn,
                    const Tensor& kn, float eps, int head_dim, double theta,
                    const std::vector<float>& slopes, float scale, Tensor& out);

 private:
  bool is_act(const Tensor& t) const { return t.dtype == (bf16_ ? DType::BF16 : DType::F32); }
  void upload_tables(const std::vector<float>& slopes);
  bool one_token_step() const;  // every call of the step has one token (a decode step)
  template <typename T>
  cuda::GlaArgs<T> args(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                        const std::vector<float>& slopes, float scale, Tensor& out);

  bool bf16_;
  int64_t ws_max_floats_;
  cudaStream_t stream_;
  DeviceArena& arena_;
  const StepPlan& plan_;
  const GraphCache& graphs_;
  OpTimer& timer_;
  RopeTables& rope_;
  ModelConfig cfg_;
  int num_slots_ = 0;
  float* states_ = nullptr;  // [num_slots, n_lightning, nh, d, d] fp32
  unsigned* tickets_ = nullptr;  // [kFusedGlaMaxSeqs][nh] zeros: GlaNormRope::tickets
  std::vector<float> slopes_;  // the slopes the decay tables hold
  float* decay_ = nullptr;     // [nh][kGlaDecayStride]
  int decay_cap_ = 0;          // heads decay_ has room for
  float* ws_ = nullptr;        // chunk-parallel prefill: per-chunk states
  int64_t ws_floats_ = 0;
  // advance(): its calls as DevSeq [cap] then their indexes [cap]; the outputs nobody reads.
  void* adv_meta_ = nullptr;
  int adv_cap_ = 0;
  void* adv_out_ = nullptr;
  int64_t adv_out_bytes_ = 0;
  std::vector<cuda::DevSeq> adv_seqs_;  // their host copies
  std::vector<int32_t> adv_list_;
};

}  // namespace sala::cuda_host
