// The ops the MiniCPM-SALA forward pass needs, over tensors in one backend's memory.
// The CPU backend (cpu/) is the readable reference and the oracle for every other
// backend; the CUDA backend implements the same ops on the GPU.
//
// Conventions: every activation is a contiguous row-major 2-D tensor [rows, cols] in
// act_dtype(); rows are the step's tokens (StepMeta order). Weights are [out, in] (PyTorch
// nn.Linear), so linear() computes y = x · Wᵀ. Heads are contiguous column groups:
// column c of a [T, heads*d] tensor is head c / d, dim c % d.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"
#include "model/step.h"

namespace sala {

struct TensorView;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  int64_t numel() const { return rows * cols; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  // Rows [r0, r0+n) of a contiguous tensor.
  Tensor slice_rows(int64_t r0, int64_t n) const {
    return {static_cast<char*>(data) + size_t(r0 * cols) * dtype_size(dtype), dtype, n, cols};
  }
};

// Sizes of the two cache pools, fixed at start.
struct CacheShape {
  int32_t num_pages = 0;    // KV pages shared by all sequences (sparse layers only)
  int32_t page_size = 0;    // tokens per page; a multiple of block_size
  int32_t num_slots = 0;    // lightning-state slots (one per running sequence)
};

enum class NumericMode { F32, BF16 };  // the golden README's two contracts

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual DType act_dtype() const = 0;

  // ---- memory (all at start; nothing in the step loop) ----
  virtual Tensor alloc(int64_t rows, int64_t cols, DType dtype) = 0;
  // A weight from the checkpoint, converted to the backend's weight format.
  virtual Tensor upload_weight(const TensorView& src) = 0;
  // Allocates the paged KV pool and compressed-key pages of the sparse layers and the
  // lightning state slots.
  virtual void init_caches(const ModelConfig& cfg, const CacheShape& shape) = 0;
  virtual void download_f32(const Tensor& src, float* dst) = 0;

  // ---- per step ----
  virtual void begin_step(const StepMeta& meta) = 0;  // uploads ids/positions/tables once

  // out[T, H] = table[ids] * scale
  virtual void embedding(const Tensor& table, float scale, Tensor& out) = 0;
  // out = RMSNorm(x) * w over groups of w.cols columns (w.cols == x.cols: whole row;
  // w.cols == head_dim: per head). Two bf16 roundings in bf16 mode (SPEC §4.2).
  virtual void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) = 0;
  // h = h + a * alpha (SPEC §5.1, both rounded in bf16 mode); out = RMSNorm(h) * w.
  virtual void add_scaled_rmsnorm(Tensor& h, const Tensor& a, float alpha, const Tensor& w,
                                  float eps, Tensor& out) = 0;
  // y[T, N] = x[T, K] · W[N, K]ᵀ
  virtual void linear(const Tensor& x, const Tensor& w, Tensor& y) = 0;
  // out = silu(g) * u
  virtual void silu_mul(const Tensor& g, const Tensor& u, Tensor& out) = 0;
  // out = a * sigmoid(gate)
  virtual void mul_sigmoid(const Tensor& a, const Tensor& gate, Tensor& out) = 0;
  // x /= d (the logit divisor hidden/dim_model_base; SPEC §5 divides)
  virtual void div_scalar(Tensor& x, float d) = 0;
  // Rotate-half RoPE in place on [T, heads*head_dim] at the step's positions (SPEC §7).
  virtual void rope(Tensor& x, int head_dim, double theta) = 0;
  // Lightning layer li (index among lightning layers): simple GLA over q,k,v [T, nh*d],
  // state slots of the step's sequences, output o [T, nh*d] (SPEC §8).
  virtual void lightning_attention(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const std::vector<float>& slopes, float scale,
                                   Tensor& out) = 0;
  // Sparse layer si (index among sparse layers): appends k,v [T, kvh*d] to the paged cache,
  // updates the compressed keys, and computes dense or InfLLM-v2 attention for q
  // [T, nh*d] into out (SPEC §9).
  virtual void sparse_attention(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                                Tensor& out) = 0;
  // out[R, C] = x[logit_rows]
  virtual void gather_logit_rows(const Tensor& x, Tensor& out) = 0;
  virtual void synchronize() {}
};

struct BackendOptions {
  NumericMode mode = NumericMode::F32;
  int threads = 0;  // 0: all cores
};

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opts);
#ifdef SALA_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts);
#endif

}  // namespace sala
