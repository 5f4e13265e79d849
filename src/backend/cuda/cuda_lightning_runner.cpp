#include "backend/cuda/cuda_lightning_runner.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/gla.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_host_util.h"
#include "core/check.h"

namespace sala::cuda_host {
using namespace sala::cuda;

// Steps whose calls all have < 64 tokens (decode) and at most kFusedGlaMaxSeqs sequences: one
// kernel (launch_gla_norm_rope). Other steps: qk_norm_rope over all rows, then attention (the
// default; the chunked kernels read the normalised rows). The fused kernel normalises and
// rotates each (head, sequence) block's q and k before its recurrence, which lengthens every
// block: a gain while the blocks fit in one wave, a loss with many (docs/PERF.md).
constexpr int kFusedGlaMaxSeqs = 16;

LightningRunner::LightningRunner(bool bf16_mode, int64_t ws_max_floats,
                                 cudaStream_t stream, DeviceArena& arena, const StepPlan& plan,
                                 const GraphCache& graphs, OpTimer& timer, RopeTables& rope)
    : bf16_(bf16_mode),
      ws_max_floats_(ws_max_floats > 0 ? ws_max_floats : int64_t(32) << 20), stream_(stream),
      arena_(arena), plan_(plan), graphs_(graphs), timer_(timer), rope_(rope) {}

void LightningRunner::init_states(const ModelConfig& cfg, const CacheShape& shape) {
  cfg_ = cfg;
  num_slots_ = shape.num_slots;
  const size_t d = size_t(cfg.lightning_head_dim);
  const size_t state_floats =
      size_t(shape.num_slots) * cfg.num_lightning_layers() * cfg.lightning_nh * d * d;
  states_ = static_cast<float*>(arena_.device(state_floats * 4));
  CUDA_CHECK(cudaMemsetAsync(states_, 0, std::max<size_t>(state_floats * 4, 1), stream_));
  const size_t tickets = size_t(kFusedGlaMaxSeqs) * size_t(std::max(cfg.lightning_nh, 1));
  tickets_ = static_cast<unsigned*>(arena_.device(tickets * 4));
  CUDA_CHECK(cudaMemsetAsync(tickets_, 0, tickets * 4, stream_));
}

bool LightningRunner::one_token_step() const {
  const StepDev& sd = plan_.dev();
  return sd.S > 0 && sd.n_one_token == sd.S;
}

void LightningRunner::copy_slot(int32_t src, int32_t dst) {
  SALA_CHECK(src >= 0 && src < num_slots_ && dst >= 0 && dst < num_slots_,
             "state slots {} -> {} of {}", src, dst, num_slots_);
  const size_t d = size_t(cfg_.lightning_head_dim);
  const size_t slot = size_t(cfg_.num_lightning_layers()) * cfg_.lightning_nh * d * d;
  if (src != dst && slot > 0)
    CUDA_CHECK(cudaMemcpyAsync(states_ + size_t(dst) * slot, states_ + size_t(src) * slot,
                               slot * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

void LightningRunner::advance(const Tensor& k, const Tensor& v, int64_t layer_rows,
                              const std::vector<StateAdvance>& calls,
                              const std::vector<float>& slopes) {
  const int nh = cfg_.lightning_nh, d = cfg_.lightning_head_dim, nl = cfg_.num_lightning_layers();
  SALA_CHECK(!graphs_.capturing(), "state advance inside a recorded step");
  SALA_CHECK(k.cols == int64_t(nh) * d && v.cols == k.cols && int(slopes.size()) == nh &&
             is_act(k) && is_act(v) && k.rows >= nl * layer_rows && v.rows >= nl * layer_rows);
  const int n = int(calls.size());
  if (n == 0 || nl == 0) return;
  std::vector<DevSeq>& seqs = adv_seqs_;  // reused: no allocation per rollback batch
  std::vector<int32_t>& list = adv_list_;
  seqs.resize(size_t(n));
  list.resize(size_t(n));
  int32_t max_end = 0;
  for (int i = 0; i < n; ++i) {
    const StateAdvance& c = calls[size_t(i)];
    SALA_CHECK(c.slot >= 0 && c.slot < num_slots_ && c.from() >= 0 && c.from() < num_slots_ &&
                   c.row >= 0 && c.rows > 0 && c.rows < kGlaChunk && c.row + c.rows <= layer_rows,
               "state advance: slot {} -> {}, rows [{}, {}) of {}", c.from(), c.slot, c.row,
               c.row + c.rows, layer_rows);
    DevSeq& s = seqs[size_t(i)];
    s = DevSeq{};
    s.token_begin = c.row;
    s.num_tokens = c.rows;
    s.state_slot = c.from();
    s.state_dst_slot = c.slot;
    s.split_row = -1;
    s.past_len = 1;  // > 0: the kernel starts from the slot's state instead of zeros
    list[size_t(i)] = i;
    max_end = std::max(max_end, c.row + c.rows);
  }
  if (n > adv_cap_) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    arena_.release(adv_meta_);
    adv_meta_ = arena_.device(size_t(n) * (sizeof(DevSeq) + 4));
    adv_cap_ = n;
  }
  const int64_t out_bytes = int64_t(max_end) * k.cols * int64_t(bf16_ ? 2 : 4);
  if (out_bytes > adv_out_bytes_) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    arena_.release(adv_out_);
    adv_out_ = arena_.device(size_t(out_bytes));
    adv_out_bytes_ = out_bytes;
  }
  auto* dseqs = static_cast<DevSeq*>(adv_meta_);
  auto* dlist = reinterpret_cast<int32_t*>(dseqs + adv_cap_);
  // From pageable memory: staged before the calls return, so seqs / list may go at once.
  CUDA_CHECK(cudaMemcpyAsync(dseqs, seqs.data(), size_t(n) * sizeof(DevSeq),
                             cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaMemcpyAsync(dlist, list.data(), size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
  if (slopes != slopes_) upload_tables(slopes);
  with_act_type(bf16_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    for (int li = 0; li < nl; ++li) {
      GlaArgs<T> a;
      T* kl = ptr<T>(k) + int64_t(li) * layer_rows * k.cols;
      a.q = kl;  // the outputs are not kept: any q will do
      a.k = kl;
      a.v = ptr<const T>(v) + int64_t(li) * layer_rows * v.cols;
      a.stride = k.cols;
      a.seqs = dseqs;
      a.states = states_;
      a.slot_stride = int64_t(nl) * nh * d * d;
      a.layer_off = int64_t(li) * nh * d * d;
      a.decay = decay_;
      a.scale = 1.f;
      a.out = static_cast<T*>(adv_out_);
      a.ostride = k.cols;
      a.nh = nh;
      SALA_CHECK(launch_gla(d, a, dlist, n, nullptr, 0, stream_),
                 "lightning head_dim {} not supported by the CUDA backend", d);
    }
  });
  timer_.tick("lightning state advance");
}

void LightningRunner::init_tables() {
  if (cfg_.lightning_nh > 0) upload_tables(cfg_.lightning_slopes());
}

void LightningRunner::upload_tables(const std::vector<float>& slopes) {
  const int nh = int(slopes.size());
  std::vector<float> tab(size_t(nh) * kGlaDecayStride);
  for (int h = 0; h < nh; ++h) {
    const double g = -double(slopes[size_t(h)]);
    // As CpuBackend: λ = float(exp(double g)), decay[n] = float(exp(double(g) * n)).
    for (int n = 0; n <= kGlaChunk; ++n) tab[size_t(h) * kGlaDecayStride + size_t(n)] = float(std::exp(g * n));
  }
  if (nh > decay_cap_) {
    arena_.release(decay_);
    decay_ = static_cast<float*>(arena_.device(tab.size() * 4));
    decay_cap_ = nh;
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  CUDA_CHECK(cudaMemcpy(decay_, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
  slopes_ = slopes;
}

// The kernels' arguments for lightning layer li (checks the tensors and the step's slots).
template <typename T>
GlaArgs<T> LightningRunner::args(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const std::vector<float>& slopes, float scale, Tensor& out) {
  const int nh = cfg_.lightning_nh, d = cfg_.lightning_head_dim;
  const StepDev& sd = plan_.dev();
  SALA_CHECK(q.cols == int64_t(nh) * d && int(slopes.size()) == nh);
  SALA_CHECK(k.cols == q.cols && v.cols == q.cols && out.cols == q.cols && q.rows == sd.T);
  SALA_CHECK(is_act(q) && is_act(k) && is_act(v) && is_act(out));
  SALA_CHECK(li >= 0 && li < cfg_.num_lightning_layers());
  for (const SeqSlice& s : plan_.meta()->seqs)
    SALA_CHECK(s.state_slot >= 0 && s.state_slot < num_slots_ && s.dst_slot() >= 0 &&
                   s.dst_slot() < num_slots_ &&
                   (s.dst_slot() == s.state_slot || s.num_tokens < kGlaChunk),
               "state slots {} -> {} of {} ({} rows)", s.state_slot, s.dst_slot(), num_slots_,
               s.num_tokens);
  if (slopes != slopes_) upload_tables(slopes);  // tests; the model's are set at init
  GlaArgs<T> a;
  a.q = ptr<T>(q);
  a.k = ptr<T>(k);
  a.v = ptr<const T>(v);
  a.stride = q.cols;
  a.seqs = sd.seqs;
  a.states = states_;
  a.slot_stride = int64_t(cfg_.num_lightning_layers()) * nh * d * d;
  a.layer_off = int64_t(li) * nh * d * d;
  a.decay = decay_;
  a.scale = scale;
  a.out = ptr<T>(out);
  a.ostride = out.cols;
  a.nh = nh;
  a.one_token = one_token_step();
  return a;
}

void LightningRunner::attention(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                                const std::vector<float>& slopes, float scale, Tensor& out) {
  const int nh = cfg_.lightning_nh, d = cfg_.lightning_head_dim;
  const StepDev& sd = plan_.dev();
  with_act_type(bf16_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    GlaArgs<T> a = args<T>(li, q, k, v, slopes, scale, out);
    if (std::is_same_v<T, float> && sd.n_long > 0) {  // fp32 mode's chunk3 workspace
      int64_t max_tokens = 0, n_long = 0;
      for (const SeqSlice& s : plan_.meta()->seqs)
        if (s.num_tokens >= 64) max_tokens = std::max<int64_t>(max_tokens, s.num_tokens), ++n_long;
      a.max_chunks = int((max_tokens + 63) / 64);
      const int64_t per_state = int64_t(nh) * d * d;
      const int64_t want =
          std::max(per_state, std::min<int64_t>(ws_max_floats_, per_state * n_long * a.max_chunks));
      if (want > ws_floats_ && !graphs_.capturing()) {
        if (ws_) {
          CUDA_CHECK(cudaStreamSynchronize(stream_));
          arena_.release(ws_);
          ws_ = nullptr;
          ws_floats_ = 0;
        }
        // Out of memory: the serial chunked kernel runs instead.
        ws_ = static_cast<float*>(arena_.try_device(size_t(want) * 4));
        if (ws_) ws_floats_ = want;
      }
      a.ws = ws_;
      a.ws_floats = ws_floats_;
    }
    SALA_CHECK(launch_gla(d, a, sd.short_seqs, sd.n_short, sd.long_seqs, sd.n_long, stream_),
               "lightning head_dim {} not supported by the CUDA backend", d);
  });
  timer_.tick(sd.n_long > 0 ? "lightning chunked" : "lightning recurrent");
}

bool LightningRunner::qk_attention(int li, Tensor& q, Tensor& k, const Tensor& v,
                                   const Tensor& qn, const Tensor& kn, float eps, int head_dim,
                                   double theta, const std::vector<float>& slopes, float scale,
                                   Tensor& out) {
  const int d = cfg_.lightning_head_dim;
  const StepDev& sd = plan_.dev();
  if (sd.n_long > 0 || sd.n_short > kFusedGlaMaxSeqs || head_dim != d) return false;
  SALA_CHECK(is_act(qn) && is_act(kn) && qn.numel() == head_dim && kn.numel() == head_dim);
  const float* inv = rope_.get(head_dim, theta);
  with_act_type(bf16_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    const GlaArgs<T> a = args<T>(li, q, k, v, slopes, scale, out);
    const GlaNormRope<T> nr{ptr<const T>(qn), ptr<const T>(kn), eps, sd.positions, inv,
                            tickets_};
    SALA_CHECK(launch_gla_norm_rope(d, a, nr, sd.short_seqs, sd.n_short, stream_),
               "lightning head_dim {} not supported by the CUDA backend", d);
  });
  timer_.tick("lightning qk_norm_rope+recurrent");
  return true;
}

}  // namespace sala::cuda_host
