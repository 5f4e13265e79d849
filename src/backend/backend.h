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
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "backend/weight.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "backend/kv_cache_dtype.h"
#include "backend/logprobs.h"
#include "backend/sampling.h"
#include "backend/token_mask.h"
#include "backend/step.h"

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
    SALA_CHECK(r0 >= 0 && n >= 0 && r0 + n <= rows, "slice [{}, {}) of a {}-row tensor", r0,
               r0 + n, rows);
    return {static_cast<char*>(data) + size_t(r0 * cols) * dtype_size(dtype), dtype, n, cols};
  }
  // A bf16 / fp32 matrix [out, in] is a dense weight of that format.
  operator Weight() const {
    SALA_CHECK(dtype == DType::BF16 || dtype == DType::F32, "a {} tensor is no weight format",
               dtype_name(dtype));
    return {data, dtype == DType::BF16 ? WeightFormat::BF16 : WeightFormat::F32, rows, cols};
  }
};

// The plain matrix of a dense weight (the GEMMs of the dense formats read it as a tensor).
inline Tensor dense_view(const Weight& w) {
  SALA_CHECK(w.dense(), "a {} weight with scales has no dense view", weight_format_name(w.format));
  return {w.data, dense_dtype(w.format), w.rows, w.cols};
}

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
  // A checkpoint tensor (norm, embedding table, or a test's data) converted to the backend's
  // storage type: fp32 on the CPU, act_dtype() on the GPU.
  virtual Tensor upload_weight(const TensorView& src) = 0;
  // The dense format of weights: upload_weight's type (lm_head unless quantized with the rest).
  virtual WeightFormat weight_format() const {
    return act_dtype() == DType::BF16 ? WeightFormat::BF16 : WeightFormat::F32;
  }
  // The format the projections are stored in: weight_format(), or a quantized format that
  // BackendOptions asked for.
  virtual WeightFormat linear_format() const { return weight_format(); }
  // A linear layer's weight [out, in] in `format` (weight_format() or linear_format()).
  virtual Weight upload_linear(const TensorView& src, WeightFormat format) {
    SALA_CHECK(format == weight_format(), "backend {} stores no {} weights", name(),
               weight_format_name(format));
    return upload_weight(src);
  }
  // A pre-quantized FP8 weight (a compressed-tensors checkpoint): codes [out, in] (F8_E4M3)
  // and one scale per output channel. sala::Error where the backend has no FP8 GEMM.
  virtual Weight upload_fp8(const TensorView& codes, const std::vector<float>& /*scales*/) {
    fail("{}: the {} backend has no FP8 GEMM; this checkpoint is FP8 (compressed-tensors)",
         codes.name, name());
  }
  // A pre-quantized W4A16 weight (a compressed-tensors "pack-quantized" checkpoint, core/int4.h):
  // packed int4 codes (I32 [out, in / 8]) and scales [out, in / group] widened to fp32.
  // sala::Error where the backend has no W4A16 GEMM (CPU: cpu_int4.cpp; CUDA: the int4 GEMV and
  // dequantize + dense GEMM, cuda_gemm_int4.cpp).
  virtual Weight upload_int4(const TensorView& packed, const std::vector<float>& /*scales*/,
                             int32_t /*group*/) {
    fail("{}: the {} backend has no W4A16 (int4) GEMM yet; this checkpoint stores it as "
         "compressed-tensors pack-quantized int4 (the CPU backend runs it)", packed.name, name());
  }
  // Calibration (sala quantize --method gptq): `observer(w, x)` is called with the input rows
  // x [T, w.cols] of every linear() before its GEMM (null: none). A backend that cannot
  // observe its GEMM inputs refuses (the CPU backend can).
  using LinearInputObserver = std::function<void(const Weight& w, const Tensor& x)>;
  virtual void set_linear_observer(LinearInputObserver /*observer*/) {
    fail("the {} backend cannot observe GEMM inputs (calibration runs on the CPU)", name());
  }
  // Allocates the paged KV pool and compressed-key pages of the sparse layers and the
  // lightning state slots.
  virtual void init_caches(const ModelConfig& cfg, const CacheShape& shape) = 0;
  // The FP8 KV scales of every sparse layer (backend/kv_cache_dtype.h), given by the model
  // before init_caches (from the checkpoint, else kDefaultKvScale). A backend whose caches
  // are not FP8 (BackendOptions::kv_cache_dtype auto) has no use for them.
  virtual void set_kv_scales(const std::vector<KvScales>& /*per_sparse_layer*/) {}
  virtual void download_f32(const Tensor& src, float* dst) = 0;
  // Bytes of one KV / compressed-key element in the caches (sizing the pool at start): 1
  // with an FP8 KV cache.
  virtual size_t kv_element_bytes() const { return 4; }
  // Total memory of the device the backend runs on (0: host memory, not sized here).
  virtual size_t device_memory_total() const { return 0; }
  // Copies of each int4 weight the backend keeps (CUDA on Hopper: 2, the prefill GEMM's
  // layout beside the GEMV's; BackendOptions::int4_prefill_gemm): the memory plan counts them.
  virtual int int4_weight_copies() const { return 1; }

  // ---- per step ----
  // Uploads ids / positions / tables once. The backend keeps `meta`'s address until the next
  // begin_step (the GEMM runs and the ops read it), so a temporary is refused at compile time.
  virtual void begin_step(const StepMeta& meta) = 0;
  void begin_step(const StepMeta&& meta) = delete;

  // out[T, H] = table[ids] * scale
  virtual void embedding(const Tensor& table, float scale, Tensor& out) = 0;
  // out = RMSNorm(x) * w over groups of w.cols columns (w.cols == x.cols: whole row;
  // w.cols == head_dim: per head). Two bf16 roundings in bf16 mode (SPEC §4.2).
  // `next` (here, in add_scaled_rmsnorm and in rmsnorm_mul_sigmoid): the projection whose
  // GEMM (linear, linear_multi or linear_silu_mul) is the next backend call to read out and
  // its only reader, with nothing writing out in between; or null. A hint that changes no
  // number that GEMM computes: a backend may prepare that GEMM's input here in another form
  // and then leave out's own values unwritten (the CUDA backend writes the per-token FP8
  // codes of out in the norm kernel when next is an FP8 weight, issue 17 item 5, and skips
  // storing out); the CPU backend ignores it. With null, out is always written.
  virtual void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out,
                       const Weight* next = nullptr) = 0;
  // h = h + a * alpha (SPEC §5.1, both rounded in bf16 mode); out = RMSNorm(h) * w.
  virtual void add_scaled_rmsnorm(Tensor& h, const Tensor& a, float alpha, const Tensor& w,
                                  float eps, Tensor& out, const Weight* next = nullptr) = 0;
  // y[T, N] = x[T, K] · W[N, K]ᵀ
  virtual void linear(const Tensor& x, const Weight& w, Tensor& y) = 0;
  // A projection and the residual norm after it (o_proj / down_proj, then the next norm):
  // linear(x, w, y), then add_scaled_rmsnorm(h, y, alpha, norm_w, eps, out, next), the same
  // numbers (the default); a backend may do both in one kernel (CUDA: decode rows).
  virtual void linear_add_rmsnorm(const Tensor& x, const Weight& w, Tensor& y, Tensor& h,
                                  float alpha, const Tensor& norm_w, float eps, Tensor& out,
                                  const Weight* next = nullptr) {
    linear(x, w, y);
    add_scaled_rmsnorm(h, y, alpha, norm_w, eps, out, next);
  }
  // Several projections of one input through one weight whose rows are the projections'
  // weights stacked (fused at load: W = [W_0; W_1; ...], W.rows = Σ ys[i].cols): ys[i] =
  // x · W_iᵀ, each ys[i] a contiguous [T, N_i] tensor. Same numbers as separate linear()
  // calls on the row slices (the default); a backend may do it in one kernel.
  virtual void linear_multi(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys) {
    int64_t r0 = 0;
    for (Tensor* y : ys) {
      linear(x, w.slice_rows(r0, y->cols), *y);
      r0 += y->cols;
    }
  }
  // The MLP's first half: w = [W_gate; W_up] stacked at load ([2I, H]); g[T, I] =
  // silu(x · W_gateᵀ) * (x · W_upᵀ), the numbers of linear_multi into g, u then silu_mul
  // (the default). u [T, I] is scratch; a backend may never write it. `next`: the projection
  // that reads g next and alone, as rmsnorm's (g may then be left unwritten).
  virtual void linear_silu_mul(const Tensor& x, const Weight& w, Tensor& g, Tensor& u,
                               const Weight* /*next*/ = nullptr) {
    linear_multi(x, w, {&g, &u});
    silu_mul(g, u, g);
  }
  // out = silu(g) * u
  virtual void silu_mul(const Tensor& g, const Tensor& u, Tensor& out) = 0;
  // out = a * sigmoid(gate)
  virtual void mul_sigmoid(const Tensor& a, const Tensor& gate, Tensor& out) = 0;
  // The lightning layer's o_norm and output gate (SPEC §8.1): out = RMSNorm(a) * w (groups of
  // w.cols columns, as rmsnorm()) * sigmoid(gate), gate [T, a.cols]; the same numbers as
  // rmsnorm(a, w, eps, out) then mul_sigmoid(out, gate, out) (the default), which a backend may
  // compute in one pass. out may be a; gate must not alias out. `next`: as rmsnorm's (the
  // default composition has no use for it).
  virtual void rmsnorm_mul_sigmoid(const Tensor& a, const Tensor& w, float eps, const Tensor& gate,
                                   Tensor& out, const Weight* /*next*/ = nullptr) {
    rmsnorm(a, w, eps, out);
    mul_sigmoid(out, gate, out);
  }
  // Tensor parallelism's split o_norm (model/tensor_parallel.h): the lightning o_norm is one
  // RMSNorm over all nh*d columns, and a rank holds only its heads' columns. ss[T, 1] fp32 =
  // Σ a[t, :]² over the rank's columns (the ranks' partials, all-reduced, are the row's).
  virtual void row_sum_squares(const Tensor& a, Tensor& ss) = 0;
  // rmsnorm_mul_sigmoid's numbers for the rank's columns with the whole row's Σ x² given:
  // inv = 1 / sqrt(ss[t] / n + eps); out = T(T(T(a · inv) · w) · T(sigmoid(gate))), w the
  // rank's columns of the norm weight ([a.cols]), gate [T, a.cols]. out may be a, not gate.
  virtual void rmsnorm_mul_sigmoid_ss(const Tensor& a, const Tensor& ss, int64_t n,
                                      const Tensor& w, float eps, const Tensor& gate,
                                      Tensor& out) = 0;
  // x /= d (the logit divisor hidden/dim_model_base; SPEC §5 divides)
  virtual void div_scalar(Tensor& x, float d) = 0;
  // Rotate-half RoPE in place on [T, heads*head_dim] at the step's positions (SPEC §7).
  virtual void rope(Tensor& x, int head_dim, double theta) = 0;
  // Lightning q/k: per-head RMSNorm (weights qn, kn of head_dim) then RoPE, in place; the
  // same numbers as rmsnorm(q), rmsnorm(k), rope(q), rope(k) (the default).
  virtual void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& qn, const Tensor& kn, float eps,
                            int head_dim, double theta) {
    rmsnorm(q, qn, eps, q);
    rmsnorm(k, kn, eps, k);
    rope(q, head_dim, theta);
    rope(k, head_dim, theta);
  }
  // Lightning layer li (index among lightning layers): simple GLA over q,k,v [T, nh*d],
  // state slots of the step's sequences, output o [T, nh*d] (SPEC §8).
  virtual void lightning_attention(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const std::vector<float>& slopes, float scale,
                                   Tensor& out) = 0;
  // A lightning layer's q/k norm, RoPE and attention: qk_norm_rope(q, k, qn, kn, eps, head_dim,
  // theta), so q and k are normalised and rotated in place as there, then
  // lightning_attention(li, q, k, v, slopes, scale, out). The same numbers as those two calls
  // (the default), which a backend may fuse.
  virtual void lightning_qk_attention(int li, Tensor& q, Tensor& k, const Tensor& v,
                                      const Tensor& qn, const Tensor& kn, float eps, int head_dim,
                                      double theta, const std::vector<float>& slopes, float scale,
                                      Tensor& out) {
    qk_norm_rope(q, k, qn, kn, eps, head_dim, theta);
    lightning_attention(li, q, k, v, slopes, scale, out);
  }
  // Sparse layer si (index among sparse layers): appends k,v [T, kvh*d] to the paged cache,
  // updates the compressed keys, and computes dense or InfLLM-v2 attention for q
  // [T, nh*d] into out (SPEC §9).
  virtual void sparse_attention(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                                Tensor& out) = 0;
  // A sparse layer's attention and output gate: sparse_attention(si, q, k, v, out), then
  // mul_sigmoid(out, gate, out). The same numbers as those two calls (the default), which a
  // backend may fuse.
  virtual void sparse_attention_mul_sigmoid(int si, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& gate, Tensor& out) {
    sparse_attention(si, q, k, v, out);
    mul_sigmoid(out, gate, out);
  }
  // out[R, C] = x[logit_rows]
  virtual void gather_logit_rows(const Tensor& x, Tensor& out) = 0;
  // dst[T, C] = src[:, c0 : c0 + C] (same dtype and rows): tensor parallelism takes a rank's
  // columns back out of rows gathered from every rank (model/tensor_parallel.h).
  virtual void copy_cols(const Tensor& src, int64_t c0, Tensor& dst) = 0;
  // Greedy decoding without moving logits to the host: out[r] = argmax of fp32 row r of
  // logits [R, V], ties to the lowest id (torch.argmax). The default downloads the rows.
  virtual void argmax_rows(const Tensor& logits, int32_t* out) {
    std::vector<float> row(static_cast<size_t>(logits.cols));
    const int64_t row_bytes = logits.cols * int64_t(dtype_size(logits.dtype));
    for (int64_t r = 0; r < logits.rows; ++r) {
      const Tensor one{static_cast<char*>(logits.data) + r * row_bytes, logits.dtype, 1, logits.cols};
      download_f32(one, row.data());
      int64_t best = 0;
      for (int64_t j = 1; j < logits.cols; ++j)
        if (row[size_t(j)] > row[size_t(best)]) best = j;
      out[r] = int32_t(best);
    }
  }
  // Structured output: for each i < n, row rows[i] of fp32 logits [R, V] gets -inf wherever
  // masks[i * words ..] (host memory, LogitMasks' layout) has the token's bit clear; the same
  // numbers as mask_logits_row on the host (token_mask.h). In place, on the device's logits,
  // so a greedy step still takes its argmax there.
  virtual void mask_logits(Tensor& logits, const int32_t* rows, int64_t n, const uint32_t* masks,
                           int32_t words) = 0;
  // Log-probabilities without moving logits to the host (logprobs of sampled and prompt
  // tokens): for each i < n, row rows[i] of fp32 logits [R, V]: logprob[i] =
  // log_softmax(row)[targets[i]] (NaN where targets[i] < 0) and the top_n (<= 20) largest
  // log-probabilities, ids ascending on ties, into top_ids / top_logprobs [n, top_n]. The raw
  // distribution: no temperature, no penalties. Exact fp32 log-softmax with the sum in double
  // (logprobs_of_row). The default downloads each row and computes on the host; the CUDA
  // backend runs a kernel that returns only these n * (1 + 2 * top_n) numbers (cuda_logprobs.cu).
  virtual void logprobs_rows(const Tensor& logits, const int32_t* rows, const int32_t* targets,
                             int64_t n, int top_n, float* logprob, int32_t* top_ids,
                             float* top_logprobs) {
    std::vector<float> row(static_cast<size_t>(logits.cols));
    for (int64_t i = 0; i < n; ++i) {
      download_f32(logits.slice_rows(rows[i], 1), row.data());
      logprobs_of_row(row.data(), logits.cols, targets[i], top_n, logprob + i,
                      top_ids + i * top_n, top_logprobs + i * top_n);
    }
  }
  // Sampling without moving logits to the host (backend/sampling.h): for each i < n, out[i] =
  // the token of row rows[i] of fp32 logits [R, V] under params[i] (its edits in `edits`),
  // with the host sampler's rules (HostSampler, the CPU backend's implementation and the
  // oracle); logits stay as they are (logprobs_rows afterwards sees the raw rows). A row with
  // penalty_slot >= 0 reads that table and counts its token in it.
  virtual void sample_rows(const Tensor& /*logits*/, const int32_t* /*rows*/, int64_t /*n*/,
                           const RowSampling* /*params*/, const LogitEdit* /*edits*/,
                           int32_t* /*out*/) {
    fail("the {} backend cannot sample on the device", name());
  }
  // Fills slot's penalty table [vocab]: the prompt's ids flagged, the generated ids counted
  // (penalty_table); sample_rows then keeps it up to date.
  virtual void load_penalties(int32_t /*slot*/, int32_t /*vocab*/, const int32_t* /*prompt*/,
                              int64_t /*n_prompt*/, const int32_t* /*generated*/,
                              int64_t /*n_generated*/) {
    fail("the {} backend cannot sample on the device", name());
  }
  // Whether sample_rows / load_penalties are implemented.
  virtual bool samples_rows() const { return false; }
  virtual void synchronize() {}
  // Makes the calling thread's later calls run on this backend's device (CUDA: cudaSetDevice
  // of BackendOptions::cuda_device). Tensor parallelism calls it on each rank's thread and
  // before it loads a rank's weights; a backend on the host needs nothing.
  virtual void bind_thread() {}
  // BackendOptions::profile_ops: print the GPU time per op of the steps since the last call
  // under `label` and start a new table (no-op where nothing is profiled).
  virtual void report_op_profile(const std::string& /*label*/) {}
  // Copies the lightning state of slot src (every lightning layer) over slot dst, in order
  // with the steps: a draft model's snapshot and the rollback to it, a target's rollback
  // where no rows were kept (issue 21). (The target's snapshot before a verify step is no
  // copy: the call writes its state out of place, SeqSlice::state_dst_slot.)
  virtual void copy_state_slot(int32_t src, int32_t dst) = 0;
  // Rollback without recomputing (issue 21): for each c in `calls`, the lightning state of slot
  // c.from() (every lightning layer) advanced by the recurrence over rows [c.row,
  // c.row + c.rows) of k, v [n_lightning * layer_rows, nh*d] (layer li's rows start at
  // li * layer_rows): a verify call's own normalised, rotated k and its v, kept by the model.
  // The arithmetic is lightning_attention's recurrent form (calls of < 64 rows), so the state
  // is bit for bit the one a call of those rows from the same state leaves; it goes to c.slot.
  virtual void advance_lightning_states(const Tensor& k, const Tensor& v, int64_t layer_rows,
                                        const std::vector<StateAdvance>& calls,
                                        const std::vector<float>& slopes) = 0;

  // ---- recorded steps (CUDA graphs) ----
  // A backend that can record the work of a step and launch the recording again later says
  // so here; the model then pads all-decode steps to a few batch-size buckets (keys) and
  // records each bucket's step once. Every launch of a recording reads the metadata that the
  // latest begin_step() uploaded (fixed device buffers), so shapes must match the key.
  virtual bool graphs_enabled() const { return false; }
  // Launches the recording of `key` if there is one (true: the step's work is queued).
  virtual bool graph_launch(int /*key*/) { return false; }
  // true: the ops issued until graph_capture_end() are recorded for `key`, not run. false:
  // run them directly (the backend may want one direct run of a shape first).
  virtual bool graph_capture_begin(int /*key*/) { return false; }
  // Ends the recording and launches it once (the step's work).
  virtual void graph_capture_end(int /*key*/) {}
};

// Every setting of a backend, in one place; filled from the command line (sala serve,
// sala bench offline) and by tests. Nothing in src/backend reads the environment.
struct BackendOptions {
  NumericMode mode = NumericMode::F32;
  int threads = 0;  // CPU: worker threads; 0: all cores
  // CUDA, bf16 mode: record all-decode steps as CUDA graphs, one per batch bucket (fp32 mode
  // always runs eagerly). `--disable-cuda-graph` turns it off.
  bool cuda_graphs = true;
  // CUDA: GPU time per op, printed to stderr when the backend is destroyed (OpTimer). 0: off;
  // N > 0: the steps of at least N rows (1: every step); N < 0: the steps of at most -N rows.
  // Recorded steps are never timed (use with cuda_graphs = false for decode steps).
  // `sala bench offline --profile-ops N`.
  int64_t profile_ops = 0;
  // CUDA: the stage-2 attention of decode rows computes up to 8 parts per block while the
  // step still launches at least this many blocks; 0: half the SMs. The parts, and so the
  // results, are the same for any value; tests set 1 to force 8 parts per block.
  int attn_min_blocks = 0;
  // CUDA, Hopper: the wgmma stage-2 kernel of prompt chunks loads K/V tiles by TMA where pages
  // hold whole 64-key tiles (else cp.async). Both fill the same tiles, so the results are the
  // same bits; tests set false to compare the two.
  bool sparse_attn_tma = true;
  // CUDA, Hopper, FP8 KV cache: before a sparse layer's stage 2 of prompt chunks, the pages of
  // the chunks' sequences are converted into a bf16 shadow of this many tokens (one layer's
  // K and V: 512 bytes per token of the 9B's 2 KV heads of 128) that the wgmma stage-2 kernel
  // reads as a bf16 cache: the code values it would convert itself, so the same bits
  // (CudaKvFp8.Stage2ShadowBitEqual), without the conversion inside the kernel. H100, 9B, FP8
  // weights + e4m3 KV (session 36): 128K prefill 3.850 vs 4.637 s, 512K 18.40 vs 22.45 s
  // (stage 2 760 vs 1,668 ms at 128K; the conversion 19 ms, 285 ms at 512K). A step whose
  // sequences need more pages reads the FP8 pages directly. -1: the longest sequence the
  // selection workspaces hold, at most 1M tokens; 0: no shadow (tests compare the two).
  int64_t fp8_kv_shadow_tokens = -1;
  // W8A8 FP8 (`sala serve --quantization fp8`): the projections are quantized at load to
  // e4m3 with one scale per output channel (amax / 448), and each GEMM quantizes its input
  // rows the same way per token; lm_head, the embedding and the norms stay dense. The CPU
  // backend (the oracle) implements it; the CUDA backend runs it in bf16 mode (the FP8 skinny
  // GEMV for <= 64 rows; quantize kernel + cuBLASLt FP8 GEMMs above, cuda_gemm_fp8.cpp) and
  // refuses it in fp32 mode (sala::Error).
  bool fp8_weights = false;
  // CUDA, FP8 projections (issue 17 item 5): a norm or SiLU kernel told which FP8 projection
  // reads its output next (Backend's `next` hint) writes that projection's per-token codes
  // itself where the GEMM multiplies all its rows as one run (decode steps, one-sequence prompt
  // chunks), so the GEMM launches no quantize kernel (the same bits; H200, CudaFp8Fused.Speed:
  // 1-3.5 µs less per projection at 1-8 rows). false: every FP8 GEMM quantizes its input with
  // the separate kernel, the reference path that GraphReplayMatchesEagerFp8 compares with.
  bool fp8_producer_codes = true;
  // W4A16 at load (`sala serve --quantization w4a16`): the projections are quantized to
  // symmetric int4 with one bf16 scale per this many input columns (core/int4.h RTN, the bits
  // of `sala quantize --scheme w4a16 --method rtn`); lm_head, the embedding and the norms stay
  // dense. 0: off. The CPU backend (the oracle) implements it; the CUDA backend runs it in
  // both modes (bf16: the int4 GEMV for <= 64 rows; above, on Hopper, the mixed-input GEMM of
  // int4_prefill_gemm, else dequantize to bf16 + cuBLASLt; fp32: exact dequantization to fp32
  // + cuBLASLt fp32, the CPU's numbers up to summation order).
  int32_t int4_group_size = 0;
  // CUDA, bf16 mode, Hopper, int4 weights: prompt runs of more than 64 rows multiply through
  // CUTLASS's mixed-input GEMM (cuda_gemm_int4_sm90.cu), which dequantizes in registers, the
  // same bf16(q · s) weights as the dequantize + cuBLASLt path up to the fp32 summation order.
  // It reads a second copy of each int4 weight in CUTLASS's shuffled order, made at upload
  // (the codes' bytes again plus the scales: ≈ 4.6 GB for the 9B). false: no copy; prompt runs
  // dequantize each weight per forward into a bf16 scratch and take cuBLASLt.
  bool int4_prefill_gemm = true;
  // The sparse layers' KV pages and compressed keys (levels 1 and 2): the activation type's
  // cache, or FP8 codes with one K and one V scale per layer (backend/kv_cache_dtype.h),
  // dequantized wherever attention reads them. `sala serve --kv-cache-dtype`. The CPU
  // backend (the oracle) implements it in both modes; the CUDA backend in bf16 mode (codes
  // written by append / compress, read by selection, flash, stage 2 and dense attention,
  // cuda_kv_fp8.cuh) and refuses it in fp32 mode (sala::Error).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::Auto;
  // CUDA, fp32 mode: the most fp32 entries of the lightning chunk kernels' per-chunk state
  // workspace; longer calls walk their chunks in windows that fit (cuda_lightning_chunk3.cu).
  // 0: 32 Mi (128 MB). The results do not depend on it; tests set small values to force
  // windows. bf16 mode allocates none (cuda_lightning_seq_tc.cu keeps the state in registers).
  int64_t gla_workspace_floats = 0;
  // CUDA: the GPU this backend runs on (its ordinal). Every allocation, stream and kernel of
  // the backend is on it; the constructor leaves the calling thread's current device as it
  // found it, and bind_thread() switches a thread to it. Tensor parallelism puts rank r on
  // GPU cuda_device + r (make_tp_peers). sala::Error where the GPU does not exist.
  int cuda_device = 0;
};

// The backend of a device name ("cpu", "cuda"; backend/factory.cpp): the one factory every
// caller uses. sala::Error for an unknown name, or for "cuda" in a build without CUDA.
std::unique_ptr<Backend> make_backend(const std::string& device, const BackendOptions& opts);
// The device names this build can make, e.g. {"cpu", "cuda"}.
std::vector<std::string> backend_devices();

// The concrete backends behind make_backend (tests that compare the two call them directly).
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opts);
#ifdef SALA_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts);
#endif

}  // namespace sala
