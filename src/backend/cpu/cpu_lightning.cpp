// Lightning layers on the CPU: simple GLA with a scalar per-head decay (SPEC §8).
//   S_t = λ_h S_{t-1} + k_tᵀ v_t      (S: [d_k, d_v] fp32, λ_h = exp(-slope_h))
//   o_t = scale · q_t S_t
// Calls with fewer than 64 new tokens run the recurrent form; longer calls run the chunked
// form (chunks of 64 aligned at the call's first token), as HF does. Both forms compute the
// same function; tests/model checks they agree.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gla_reference.h"
#include "core/check.h"

namespace sala {

void gla_recurrent(const float* q, const float* k, const float* v, int64_t T, int64_t stride,
                   int d, float g, float scale, float* S, float* o, int64_t o_stride) {
  const float lam = float(std::exp(double(g)));
  std::vector<float> acc(static_cast<size_t>(d));
  for (int64_t t = 0; t < T; ++t) {
    const float* qt = q + t * stride;
    const float* kt = k + t * stride;
    const float* vt = v + t * stride;
    for (int i = 0; i < d; ++i) {
      float* Si = S + int64_t(i) * d;
      const float ki = kt[i];
#pragma omp simd
      for (int j = 0; j < d; ++j) Si[j] = lam * Si[j] + ki * vt[j];
    }
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int i = 0; i < d; ++i) {
      const float qi = qt[i] * scale;
      const float* Si = S + int64_t(i) * d;
#pragma omp simd
      for (int j = 0; j < d; ++j) acc[size_t(j)] += qi * Si[j];
    }
    std::memcpy(o + t * o_stride, acc.data(), size_t(d) * 4);
  }
}

void gla_chunked(const float* q, const float* k, const float* v, int64_t T, int64_t stride, int d,
                 float g, float scale, float* S, float* o, int64_t o_stride, int chunk) {
  std::vector<float> decay(size_t(chunk) + 1);  // decay[n] = λ^n = exp(n g)
  for (int n = 0; n <= chunk; ++n) decay[size_t(n)] = float(std::exp(double(g) * n));
  std::vector<float> A(size_t(chunk) * chunk), Snew(size_t(d) * d);
  for (int64_t c0 = 0; c0 < T; c0 += chunk) {
    const int C = int(std::min<int64_t>(chunk, T - c0));
    // intra-chunk scores A[i][j] = scale (q_i·k_j) λ^(i-j), j <= i
    for (int i = 0; i < C; ++i) {
      const float* qi = q + (c0 + i) * stride;
      for (int j = 0; j <= i; ++j) {
        const float* kj = k + (c0 + j) * stride;
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int x = 0; x < d; ++x) dot += qi[x] * kj[x];
        A[size_t(i) * chunk + size_t(j)] = scale * dot * decay[size_t(i - j)];
      }
    }
    for (int i = 0; i < C; ++i) {
      float* oi = o + (c0 + i) * o_stride;
      std::fill(oi, oi + d, 0.f);
      // inter: scale λ^(i+1) q_i S_prev
      const float* qi = q + (c0 + i) * stride;
      const float f = scale * decay[size_t(i + 1)];
      for (int x = 0; x < d; ++x) {
        const float qx = qi[x] * f;
        const float* Sx = S + int64_t(x) * d;
#pragma omp simd
        for (int y = 0; y < d; ++y) oi[y] += qx * Sx[y];
      }
      for (int j = 0; j <= i; ++j) {
        const float a = A[size_t(i) * chunk + size_t(j)];
        const float* vj = v + (c0 + j) * stride;
#pragma omp simd
        for (int y = 0; y < d; ++y) oi[y] += a * vj[y];
      }
    }
    // state: S = λ^C S + Σ_j λ^(C-1-j) k_jᵀ v_j
    for (int x = 0; x < d; ++x)
      for (int y = 0; y < d; ++y) Snew[size_t(x) * d + size_t(y)] = decay[size_t(C)] * S[x * d + y];
    for (int j = 0; j < C; ++j) {
      const float* kj = k + (c0 + j) * stride;
      const float* vj = v + (c0 + j) * stride;
      const float f = decay[size_t(C - 1 - j)];
      for (int x = 0; x < d; ++x) {
        const float kx = kj[x] * f;
        float* Sx = Snew.data() + size_t(x) * d;
#pragma omp simd
        for (int y = 0; y < d; ++y) Sx[y] += kx * vj[y];
      }
    }
    std::memcpy(S, Snew.data(), size_t(d) * d * 4);
  }
}

void CpuBackend::lightning_attention(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const std::vector<float>& slopes, float scale, Tensor& out) {
  const int nh = cfg_.lightning_nh, d = cfg_.lightning_head_dim;
  SALA_CHECK(q.cols == int64_t(nh) * d && int(slopes.size()) == nh);
  const size_t state_size = size_t(d) * d;
  const size_t slot_size = size_t(cfg_.num_lightning_layers()) * nh * state_size;
  const auto& seqs = meta_->seqs;
  const int64_t work = int64_t(seqs.size()) * nh;
#pragma omp parallel for schedule(dynamic)
  for (int64_t w = 0; w < work; ++w) {
    const SeqSlice& s = seqs[size_t(w / nh)];
    const int h = int(w % nh);
    const int32_t dst = s.dst_slot();
    SALA_CHECK(s.state_slot >= 0 && s.state_slot < cache_shape_.num_slots && dst >= 0 &&
                   dst < cache_shape_.num_slots &&
                   (dst == s.state_slot || s.num_tokens < kGlaChunk),
               "state slots {} -> {} of {} ({} rows)", s.state_slot, dst, cache_shape_.num_slots,
               s.num_tokens);
    const size_t head = (size_t(li) * nh + size_t(h)) * state_size;
    float* S = states_.data() + size_t(dst) * slot_size + head;
    if (s.past_len == 0) std::fill(S, S + state_size, 0.f);  // a new sequence
    else if (dst != s.state_slot)  // out of place: the state before the call stays in state_slot
      std::copy_n(states_.data() + size_t(s.state_slot) * slot_size + head, state_size, S);
    const int64_t off = int64_t(s.token_begin) * q.cols + int64_t(h) * d;
    const float* qp = static_cast<const float*>(q.data) + off;
    const float* kp = static_cast<const float*>(k.data) + off;
    const float* vp = static_cast<const float*>(v.data) + off;
    float* op = static_cast<float*>(out.data) + off;
    const float g = -slopes[size_t(h)];
    if (s.num_tokens < kGlaChunk)
      gla_recurrent(qp, kp, vp, s.num_tokens, q.cols, d, g, scale, S, op, out.cols);
    else
      gla_chunked(qp, kp, vp, s.num_tokens, q.cols, d, g, scale, S, op, out.cols, kGlaChunk);
  }
  // HF rounds the fp32 GLA output to bf16 before o_norm.
  round_all(out);
}

void CpuBackend::advance_lightning_states(const Tensor& k, const Tensor& v, int64_t layer_rows,
                                          const std::vector<StateAdvance>& calls,
                                          const std::vector<float>& slopes) {
  const int nh = cfg_.lightning_nh, d = cfg_.lightning_head_dim, nl = cfg_.num_lightning_layers();
  SALA_CHECK(k.cols == int64_t(nh) * d && v.cols == k.cols && int(slopes.size()) == nh &&
             k.rows >= nl * layer_rows && v.rows >= nl * layer_rows);
  const size_t state_size = size_t(d) * d, slot_size = size_t(nl) * nh * state_size;
  for (const StateAdvance& c : calls)
    SALA_CHECK(c.slot >= 0 && c.slot < cache_shape_.num_slots && c.from() >= 0 &&
                   c.from() < cache_shape_.num_slots && c.row >= 0 && c.rows > 0 &&
                   c.rows < kGlaChunk && c.row + c.rows <= layer_rows,
               "state advance: slot {} -> {}, rows [{}, {}) of {}", c.from(), c.slot, c.row,
               c.row + c.rows, layer_rows);
  const int64_t work = int64_t(nl) * int64_t(calls.size()) * nh;
#pragma omp parallel for schedule(dynamic)
  for (int64_t w = 0; w < work; ++w) {
    const int h = int(w % nh);
    const StateAdvance& c = calls[size_t(w / nh % int64_t(calls.size()))];
    const int li = int(w / nh / int64_t(calls.size()));
    const size_t head = (size_t(li) * nh + size_t(h)) * state_size;
    float* S = states_.data() + size_t(c.slot) * slot_size + head;
    if (c.from() != c.slot)
      std::copy_n(states_.data() + size_t(c.from()) * slot_size + head, state_size, S);
    const int64_t off = (li * layer_rows + c.row) * k.cols + int64_t(h) * d;
    const float* kp = static_cast<const float*>(k.data) + off;
    const float* vp = static_cast<const float*>(v.data) + off;
    // The recurrent form of lightning_attention; its outputs (q = k here) are not kept.
    std::vector<float> o(size_t(c.rows) * size_t(d));
    gla_recurrent(kp, kp, vp, c.rows, k.cols, d, -slopes[size_t(h)], 1.f, S, o.data(), d);
  }
}

}  // namespace sala
