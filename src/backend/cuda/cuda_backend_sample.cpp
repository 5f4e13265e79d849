// CUDA backend, sampling and log-probabilities on the device (Backend::sample_rows,
// load_penalties, logprobs_rows): the buffers of cuda_sample.cu's and cuda_logprobs.cu's
// kernels. Nothing here is recorded in a graph, so buffers may grow.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_host_util.h"
#include "backend/cuda/cuda_logprobs.h"
#include "backend/cuda/cuda_sample.h"
#include "backend/logprobs.h"
#include "core/check.h"

namespace sala {
using namespace sala::cuda;
using namespace sala::cuda_host;

namespace {
// Byte offsets of the sample buffer's parts: params [cap], edits [ecap], rows [cap], ids [cap].
struct SampleLayout {
  size_t edits, rows, ids, bytes;
  SampleLayout(int64_t cap, int64_t ecap) {
    edits = size_t(cap) * sizeof(RowSampling);
    rows = edits + size_t(ecap) * sizeof(LogitEdit);
    ids = rows + size_t(cap) * 4;
    bytes = ids + size_t(cap) * 4;
  }
};
}  // namespace

void CudaBackend::load_penalties(int32_t slot, int32_t vocab, const int32_t* prompt,
                                 int64_t n_prompt, const int32_t* generated, int64_t n_generated) {
  SALA_CHECK(slot >= 0 && vocab > 0);
  SALA_CHECK(pen_vocab_ == 0 || pen_vocab_ == vocab, "penalty tables of vocabulary {} and {}",
             pen_vocab_, vocab);
  const size_t row_bytes = size_t(vocab) * 4;
  if (slot >= pen_slots_) {  // grows, keeping the loaded tables
    const int32_t slots = std::max({slot + 1, 2 * pen_slots_, 8});
    auto* t = static_cast<int32_t*>(arena_.device(size_t(slots) * row_bytes));
    CUDA_CHECK(cudaMemsetAsync(t, 0, size_t(slots) * row_bytes, st()));
    if (pen_table_) {
      CUDA_CHECK(cudaMemcpyAsync(t, pen_table_, size_t(pen_slots_) * row_bytes,
                                 cudaMemcpyDeviceToDevice, st()));
      stream_.sync();
      arena_.release(pen_table_);
    }
    pen_table_ = t;
    pen_slots_ = slots;
    pen_vocab_ = vocab;
  }
  const std::vector<int32_t> table = penalty_table(vocab, prompt, n_prompt, generated, n_generated);
  // From pageable memory: returns once the table is staged, in order with the steps.
  CUDA_CHECK(cudaMemcpyAsync(pen_table_ + int64_t(slot) * vocab, table.data(), row_bytes,
                             cudaMemcpyHostToDevice, st()));
}

void CudaBackend::sample_rows(const Tensor& logits, const int32_t* rows, int64_t n,
                              const RowSampling* params, const LogitEdit* edits, int32_t* out) {
  SALA_CHECK(logits.dtype == DType::F32, "sample_rows of {}", dtype_name(logits.dtype));
  if (n == 0) return;
  const int64_t V = logits.cols;
  SALA_CHECK(V > 0 && V < (int64_t(1) << 18), "sample_rows over {} ids (fixed-point sums need "
             "fewer than 2^18)", V);
  int64_t n_edits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const RowSampling& p = params[i];
    SALA_CHECK(rows[i] >= 0 && rows[i] < logits.rows, "sample row {} of {}", rows[i], logits.rows);
    SALA_CHECK(p.u >= 0.0 && p.u < 1.0, "draw {} outside [0, 1)", p.u);
    SALA_CHECK(p.penalty_slot < pen_slots_ && (p.penalty_slot < 0 || pen_vocab_ == V),
               "penalty slot {} was not loaded", p.penalty_slot);
    SALA_CHECK(p.edit_begin >= 0 && p.edit_count >= 0);
    for (int32_t e = p.edit_begin; e < p.edit_begin + p.edit_count; ++e) {
      const LogitEdit& ed = edits[e];
      SALA_CHECK(ed.id >= 0 && ed.id < V, "logit edit of id {} (vocabulary {})", ed.id, V);
      SALA_CHECK(ed.next < 0 || (ed.next > e && ed.next < p.edit_begin + p.edit_count &&
                                 edits[ed.next].id == ed.id && !edits[ed.next].first),
                 "logit edit chain at {}", e);
    }
    n_edits = std::max<int64_t>(n_edits, p.edit_begin + p.edit_count);
  }
  if (n > sample_cap_ || n_edits > edit_cap_) {
    // Nothing in flight reads the old buffers: every call ends with a synchronizing copy.
    if (sample_dev_) arena_.release(sample_dev_);
    if (sample_host_) arena_.release_pinned(sample_host_);
    sample_cap_ = std::max<int64_t>({n, sample_cap_, 64});
    edit_cap_ = std::max<int64_t>({n_edits, edit_cap_, 256});
    const SampleLayout l(sample_cap_, edit_cap_);
    sample_dev_ = arena_.device(l.bytes);
    sample_host_ = arena_.pinned(l.bytes);
  }
  if (2 * n * V > scratch_elems_) {  // per row: the edited logits and their weights
    if (sample_scratch_) arena_.release(sample_scratch_);
    scratch_elems_ = 2 * n * V;
    sample_scratch_ = static_cast<float*>(arena_.device(size_t(scratch_elems_) * 4));
  }
  const SampleLayout l(sample_cap_, edit_cap_);
  auto* h = static_cast<char*>(sample_host_);
  auto* d = static_cast<char*>(sample_dev_);
  std::memcpy(h, params, size_t(n) * sizeof(RowSampling));
  if (n_edits) std::memcpy(h + l.edits, edits, size_t(n_edits) * sizeof(LogitEdit));
  std::memcpy(h + l.rows, rows, size_t(n) * 4);
  CUDA_CHECK(cudaMemcpyAsync(d, h, l.rows + size_t(n) * 4, cudaMemcpyHostToDevice, st()));
  launch_sample_rows(ptr<float>(logits), int32_t(V), reinterpret_cast<const int32_t*>(d + l.rows),
                     n, reinterpret_cast<const RowSampling*>(d),
                     reinterpret_cast<const LogitEdit*>(d + l.edits), pen_table_, sample_scratch_,
                     reinterpret_cast<int32_t*>(d + l.ids), st());
  CUDA_CHECK(cudaMemcpyAsync(h + l.ids, d + l.ids, size_t(n) * 4, cudaMemcpyDeviceToHost, st()));
  stream_.sync();
  std::memcpy(out, h + l.ids, size_t(n) * 4);
  tick("sample_rows");
}

void CudaBackend::logprobs_rows(const Tensor& logits, const int32_t* rows, const int32_t* targets,
                                int64_t n, int top_n, float* logprob, int32_t* top_ids,
                                float* top_logprobs) {
  SALA_CHECK(logits.dtype == DType::F32, "logprobs_rows of {}", dtype_name(logits.dtype));
  SALA_CHECK(top_n >= 0 && top_n <= kMaxTopLogprobs, "top_n {}", top_n);
  if (n == 0) return;
  const int64_t V = logits.cols;
  SALA_CHECK(V > 0 && V <= INT32_MAX, "logprobs_rows over {} ids", V);
  for (int64_t i = 0; i < n; ++i) {
    SALA_CHECK(rows[i] >= 0 && rows[i] < logits.rows, "logprob row {} of {}", rows[i], logits.rows);
    SALA_CHECK(targets[i] < V, "logprob target {} (vocabulary {})", targets[i], V);
  }
  // Per row: 2 words up (row, target), at most 1 + 2 * kMaxTopLogprobs words down.
  constexpr int64_t kIn = 2, kOut = 1 + 2 * int64_t(kMaxTopLogprobs);
  if (n > lp_cap_) {
    // Nothing in flight reads the old buffers: every call ends with a synchronizing copy.
    if (lp_dev_) arena_.release(lp_dev_);
    if (lp_host_) arena_.release_pinned(lp_host_);
    lp_cap_ = std::max<int64_t>({n, 2 * lp_cap_, 64});
    const size_t bytes = size_t(lp_cap_ * (kIn + kOut)) * 4;
    lp_dev_ = arena_.device(bytes);
    lp_host_ = arena_.pinned(bytes);
  }
  // [rows n | targets n] at the start, [logprob n | top_ids n*top_n | top_logprobs n*top_n]
  // after the input region: one copy each way.
  auto* h = static_cast<int32_t*>(lp_host_);
  auto* d = static_cast<int32_t*>(lp_dev_);
  std::memcpy(h, rows, size_t(n) * 4);
  std::memcpy(h + n, targets, size_t(n) * 4);
  CUDA_CHECK(cudaMemcpyAsync(d, h, size_t(kIn * n) * 4, cudaMemcpyHostToDevice, st()));
  const int64_t out_off = kIn * lp_cap_, tn = int64_t(top_n);
  int32_t* dout = d + out_off;
  launch_logprobs_rows(ptr<float>(logits), int32_t(V), d, d + n, n, top_n,
                       reinterpret_cast<float*>(dout), dout + n,
                       reinterpret_cast<float*>(dout + n + n * tn), st());
  const int64_t out_words = n * (1 + 2 * tn);
  CUDA_CHECK(cudaMemcpyAsync(h + out_off, dout, size_t(out_words) * 4, cudaMemcpyDeviceToHost,
                             st()));
  stream_.sync();
  const int32_t* hout = h + out_off;
  std::memcpy(logprob, hout, size_t(n) * 4);
  if (top_n > 0) {
    std::memcpy(top_ids, hout + n, size_t(n * tn) * 4);
    std::memcpy(top_logprobs, hout + n + n * tn, size_t(n * tn) * 4);
  }
  tick("logprobs_rows");
}

}  // namespace sala
