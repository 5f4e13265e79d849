// CUDA backend, host side of the two mixer kinds: lightning (SPEC §8) and sparse (SPEC §9)
// layers. Kernels: cuda_lightning.cu, cuda_sparse.cu (and the InfLLM-v2 kernels:
// cuda_infllm_select.cu / cuda_infllm_attn.cu in bf16 mode, cuda_f32_select.cu and
// attention_kernel<float, true> in fp32 mode).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_host_util.h"
#include "backend/gla.h"
#include "core/check.h"

namespace sala {
using namespace sala::cuda;

using namespace sala::cuda_host;

namespace {
// Decode parts per stage-2 block (SparseAttnParams::spb): the largest power of two ≤
// kSparseTileRows that still launches ≥ SMs / 2 blocks (SALA_ATTN_MIN_BLOCKS overrides; read
// at each call so that tests can force 8 parts per block), from the step's (row tile, KV
// head) count only, so a recorded step keeps its grid. The stage-2 block needs most of an
// SM's shared memory: at batch 64 one part per block made 2048 blocks of one computing warp,
// one block per SM at a time. H200, 4K context, B = 8 / 64: 5.918 / 10.080 ms per step with
// one part per block, 5.912 / 9.253 at ≥ 2 SMs' worth of blocks, 5.849 / 9.153 at SMs / 2,
// 6.239 / 9.152 with 8 parts always (docs/PERF.md).
int decode_parts_per_block(int row_blocks, int splits) {
  static const int sms = [] {
    int dev = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  const char* e = std::getenv("SALA_ATTN_MIN_BLOCKS");
  const int target = e ? std::max(1, std::atoi(e)) : std::max(1, sms / 2);
  int spb = 1;
  while (2 * spb <= kSparseTileRows &&
         int64_t(row_blocks) * ((splits + 2 * spb - 1) / (2 * spb)) >= target)
    spb *= 2;
  return spb;
}
}  // namespace

void CudaBackend::upload_gla_tables(const std::vector<float>& slopes) {
  const int nh = int(slopes.size());
  std::vector<float> tab(size_t(nh) * kGlaDecayStride);
  for (int h = 0; h < nh; ++h) {
    const double g = -double(slopes[size_t(h)]);
    // As CpuBackend: λ = float(exp(double g)), decay[n] = float(exp(double(g) * n)).
    for (int n = 0; n <= kGlaChunk; ++n) tab[size_t(h) * kGlaDecayStride + size_t(n)] = float(std::exp(g * n));
  }
  if (nh > gla_decay_cap_) {
    if (gla_decay_) CUDA_CHECK(cudaFree(gla_decay_));
    CUDA_CHECK(cudaMalloc(&gla_decay_, tab.size() * 4));
    gla_decay_cap_ = nh;
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  CUDA_CHECK(cudaMemcpy(gla_decay_, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
  gla_slopes_ = slopes;
}

// The kernels' arguments for lightning layer li (checks the tensors and the step's slots).
template <typename T>
GlaArgs<T> CudaBackend::gla_args(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const std::vector<float>& slopes, float scale, Tensor& out) {
  const int nh = cfg_.lightning_nh, d = cfg_.lightning_head_dim;
  SALA_CHECK(q.cols == int64_t(nh) * d && int(slopes.size()) == nh);
  SALA_CHECK(k.cols == q.cols && v.cols == q.cols && out.cols == q.cols && q.rows == sd_.T);
  SALA_CHECK(is_act(q) && is_act(k) && is_act(v) && is_act(out));
  SALA_CHECK(li >= 0 && li < cfg_.num_lightning_layers());
  for (const SeqSlice& s : meta_->seqs)
    SALA_CHECK(s.state_slot >= 0 && s.state_slot < cache_shape_.num_slots, "state slot {}", s.state_slot);
  if (slopes != gla_slopes_) upload_gla_tables(slopes);  // tests; the model's are set at init
  GlaArgs<T> a;
  a.q = ptr<T>(q);
  a.k = ptr<T>(k);
  a.v = ptr<const T>(v);
  a.stride = q.cols;
  a.seqs = sd_.seqs;
  a.states = states_;
  a.slot_stride = int64_t(cfg_.num_lightning_layers()) * nh * d * d;
  a.layer_off = int64_t(li) * nh * d * d;
  a.decay = gla_decay_;
  a.scale = scale;
  a.out = ptr<T>(out);
  a.ostride = out.cols;
  a.nh = nh;
  return a;
}

void CudaBackend::lightning_attention(int li, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const std::vector<float>& slopes, float scale, Tensor& out) {
  const int nh = cfg_.lightning_nh, d = cfg_.lightning_head_dim;
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    GlaArgs<T> a = gla_args<T>(li, q, k, v, slopes, scale, out);
    if (sd_.n_long > 0) {
      int64_t max_tokens = 0, n_long = 0;
      for (const SeqSlice& s : meta_->seqs)
        if (s.num_tokens >= 64) max_tokens = std::max<int64_t>(max_tokens, s.num_tokens), ++n_long;
      a.max_chunks = int((max_tokens + 63) / 64);
      const int64_t per_state = int64_t(nh) * d * d;
      const int64_t want = std::max(per_state, std::min<int64_t>(int64_t(32) << 20, per_state * n_long * a.max_chunks));
      if (want > gla_ws_floats_ && !capturing_) {
        if (gla_ws_) {
          CUDA_CHECK(cudaStreamSynchronize(stream_));
          CUDA_CHECK(cudaFree(gla_ws_));
          gla_ws_ = nullptr;
          gla_ws_floats_ = 0;
        }
        if (cudaMalloc(&gla_ws_, size_t(want) * 4) == cudaSuccess) {
          gla_ws_floats_ = want;
        } else {
          (void)cudaGetLastError();  // out of memory: the serial chunked kernel runs instead
          gla_ws_ = nullptr;
        }
      }
      a.ws = gla_ws_;
      a.ws_floats = gla_ws_floats_;
    }
    SALA_CHECK(launch_gla(d, a, sd_.short_seqs, sd_.n_short, sd_.long_seqs, sd_.n_long, stream_),
               "lightning head_dim {} not supported by the CUDA backend", d);
  });
  tick(sd_.n_long > 0 ? "lightning chunked" : "lightning recurrent");
}

// Steps whose calls all have < 64 tokens (decode) and at most kFusedGlaMaxSeqs sequences: one
// kernel (launch_gla_norm_rope). Other steps: qk_norm_rope over all rows, then
// lightning_attention (the default; the chunked kernels read the normalised rows). The fused
// kernel normalises and rotates each (head, sequence) block's q and k before its recurrence,
// which lengthens every block: a gain while the blocks fit in one wave, a loss with many
// (H200, full-size decode step, unfused -> fused: B=1 5.46 -> 5.24 ms, B=64 8.75 -> 8.89 ms;
// B=8 7.34 -> 6.93 ms on the tree with the dropped GEMV norm epilogue).
constexpr int kFusedGlaMaxSeqs = 16;

void CudaBackend::lightning_qk_attention(int li, Tensor& q, Tensor& k, const Tensor& v,
                                         const Tensor& qn, const Tensor& kn, float eps,
                                         int head_dim, double theta,
                                         const std::vector<float>& slopes, float scale,
                                         Tensor& out) {
  const int d = cfg_.lightning_head_dim;
  if (sd_.n_long > 0 || sd_.n_short > kFusedGlaMaxSeqs || head_dim != d || unfuse_gla_)
    return Backend::lightning_qk_attention(li, q, k, v, qn, kn, eps, head_dim, theta, slopes,
                                           scale, out);
  SALA_CHECK(is_act(qn) && is_act(kn) && qn.numel() == head_dim && kn.numel() == head_dim);
  const float* inv = inv_freq(head_dim, theta);
  with_act_type(bf16_mode_, [&](auto tag) {
    using T = tag_t<decltype(tag)>;
    const GlaArgs<T> a = gla_args<T>(li, q, k, v, slopes, scale, out);
    const GlaNormRope<T> nr{ptr<const T>(qn), ptr<const T>(kn), eps, sd_.positions, inv};
    SALA_CHECK(launch_gla_norm_rope(d, a, nr, sd_.short_seqs, sd_.n_short, stream_),
               "lightning head_dim {} not supported by the CUDA backend", d);
  });
  tick("lightning qk_norm_rope+recurrent");
}

void CudaBackend::sparse_attention(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                                   Tensor& out) {
  SALA_CHECK(is_act(q) && is_act(k) && is_act(v) && is_act(out));
  if (bf16_mode_)
    sparse_attention_t<bf16>(si, q, k, v, out);
  else
    sparse_attention_t<float>(si, q, k, v, out);
}

// Parts of a decode row's attention (kDecodeAttnSplits, a fixed count so that a recorded
// decode step launches the same grids at every length), fewer only where the step's
// partials would not fit attn_part_ (sized for the engine's largest decode step).
int CudaBackend::decode_attn_splits() const {
  int splits = kDecodeAttnSplits;
  const int64_t per_split = int64_t(sd_.S) * cfg_.num_attention_heads;
  while (splits > 1 && per_split * splits > attn_part_items_) --splits;
  return splits;
}

// Steps of one-token calls only (decode) whose attention is split: every row's output is
// written by the combine kernel, which then applies the gate as mul_sigmoid would (same
// roundings: the attention value rounded to T, times T(sigmoid(gate))); one kernel less per
// sparse layer. Other steps: the two-op default.
void CudaBackend::sparse_attention_mul_sigmoid(int si, const Tensor& q, const Tensor& k,
                                               const Tensor& v, const Tensor& gate, Tensor& out) {
  const bool fused = !unfuse_attngate_ && sd_.n_one_token == sd_.S && sd_.S > 0 &&
                     decode_attn_splits() > 1 && is_act(gate) && gate.rows == out.rows &&
                     gate.cols == out.cols;
  if (!fused) return Backend::sparse_attention_mul_sigmoid(si, q, k, v, gate, out);
  SALA_CHECK(is_act(q) && is_act(k) && is_act(v) && is_act(out));
  if (bf16_mode_)
    sparse_attention_t<bf16>(si, q, k, v, out, &gate);
  else
    sparse_attention_t<float>(si, q, k, v, out, &gate);
}

// T = bf16: the tensor-core InfLLM-v2 and flash kernels. T = float (fp32 mode): the same
// append / compress / dense attention kernels for float, cuda_f32_select.cu's selection and
// attention_kernel<float, true> over the selected blocks; no flash.
template <typename T>
void CudaBackend::sparse_attention_t(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                                     Tensor& out, const Tensor* gate) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  const ModelConfig& c = cfg_;
  const auto& sp = c.sparse;
  const int kvh = c.num_key_value_heads, d = c.head_dim, nh = c.num_attention_heads;
  const int GH = c.kv_group();
  SALA_CHECK(si >= 0 && si < int(sparse_.size()));
  SALA_CHECK(q.cols == int64_t(nh) * d && k.cols == int64_t(kvh) * d && v.cols == k.cols &&
             out.cols == q.cols && q.rows == sd_.T && out.rows == q.rows);
  const int T_rows = sd_.T;
  if (T_rows == 0) return;
  const SparseLayerCache& sc = sparse_[size_t(si)];
  struct {
    T *k, *v, *c1, *c2;
  } cache{static_cast<T*>(sc.k), static_cast<T*>(sc.v), static_cast<T*>(sc.c1), static_cast<T*>(sc.c2)};
  CacheGeom geo{cache_shape_.page_size, kvh, d, sp.kernel_stride, sp.level2_stride(),
                sp.kernel_size, sp.level2_window(), sp.block_size, int64_t(kvh) * d};

  const StepRows rows{T_rows, sd_.row_seq, sd_.seqs, sd_.page_table};
  launch_append_kv<T>(ptr<const T>(k), ptr<const T>(v), rows, geo, cache.k, cache.v, stream_);
  launch_compress<T>(rows, geo, cache.k, cache.c1, cache.c2, stream_);
  tick("sparse append+compress");

  SALA_CHECK(!kBf16 || sd_.n_sparse_seqs == 0 || (GH == 16 && infllm_head_dim_supported(d)),
             "InfLLM-v2 layers need 16 query heads per KV head and head_dim 16/32/64/128 (have {} "
             "and {})", GH, d);
  // Selection needs each row's level-2 normaliser, then scores, then top-k. Rows of
  // one-token calls (decode, one row per tile) split their entries over kSelectSplits
  // blocks; a step has that grid whenever it has such a row, so a recorded decode step
  // launches the same grids at every context length.
  const bool one_token_calls = sd_.n_one_token > 0;
  if (sd_.n_sparse_seqs > 0) {
    SelectParams P{};
    P.g = geo;
    P.nh = nh;
    P.tau = c.attn_scale();
    P.init_blocks = sp.init_blocks;
    P.local_blocks = sp.local_blocks();
    P.total_topk = sp.total_topk();
    P.nb_stride = select_nb_stride_;
    P.et_stride = select_et_stride_;
    P.lse_splits = one_token_calls ? kSelectSplits : 1;
    P.score_splits = one_token_calls ? kScoreSplits : 1;
    if constexpr (kBf16) {
      for (int t0 = 0; t0 < sd_.n_tiles; t0 += kSelectChunkTiles)
        launch_infllm_select(d, ptr<const bf16>(q), rows, sd_.tiles, t0,
                             std::min(kSelectChunkTiles, sd_.n_tiles - t0), cache.c1, cache.c2, P,
                             select_work_, sel_, sel_cnt_, stream_);
    } else {
      launch_f32_select(ptr<const float>(q), rows, cache.c1, cache.c2, P, max_smem_optin_, sel_,
                        sel_cnt_, stream_);
    }
    tick("sparse select");
    if (meta_->capture) {
      const int K = sp.total_topk();
      std::vector<int32_t> hsel(size_t(T_rows) * kvh * K), hcnt(size_t(T_rows) * kvh);
      CUDA_CHECK(cudaMemcpyAsync(hsel.data(), sel_, hsel.size() * 4, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaMemcpyAsync(hcnt.data(), sel_cnt_, hcnt.size() * 4, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      auto& selc = meta_->capture->selections;
      if (selc.size() < size_t(si) + 1) selc.resize(size_t(si) + 1);
      selc[size_t(si)].assign(size_t(kvh), std::vector<std::vector<int32_t>>(size_t(T_rows)));
      for (const SeqSlice& s : meta_->seqs) {
        if (!(meta_->dense_as_sparse || s.total_len() >= sp.dense_len)) continue;
        for (int i = 0; i < s.num_tokens; ++i)
          for (int g = 0; g < kvh; ++g) {
            const size_t rg = size_t(s.token_begin + i) * kvh + size_t(g);
            selc[size_t(si)][size_t(g)][size_t(s.token_begin + i)].assign(
                hsel.begin() + int64_t(rg) * K, hsel.begin() + int64_t(rg) * K + hcnt[rg]);
          }
      }
    }
  } else if (meta_->capture) {
    auto& selc = meta_->capture->selections;
    if (selc.size() < size_t(si) + 1) selc.resize(size_t(si) + 1);
    selc[size_t(si)].assign(size_t(kvh), std::vector<std::vector<int32_t>>(size_t(T_rows)));
  }

  // Attention: rows of one-token calls (decode) split over 16 parts of their keys (a fixed
  // count: a recorded decode step launches the same grid at every length), other rows never;
  // so a row's numbers depend only on its own call, not on what shares its step.
  const int splits = one_token_calls ? decode_attn_splits() : 1;
  // Long dense calls (prefill chunks) on the tensor cores; the rest (decode rows, short
  // calls) in attention_kernel; sparse rows in sparse_attn. SALA_CUDA_FLASH=0 turns the
  // first off.
  static const bool flash_on = [] {
    const char* e = std::getenv("SALA_CUDA_FLASH");
    return !(e && std::string(e) == "0");
  }();
  constexpr int kFlashMin = 64;
  const bool flash = kBf16 && flash_on && flash_prefill_supported(d);
  AttnParams A{geo, GH, nh, c.attn_scale(), flash ? kFlashMin : 1 << 30, sp.total_topk()};
  if constexpr (kBf16) {
    if (flash) {
      for (const SeqSlice& s : meta_->seqs) {
        const bool sparse_rows = meta_->dense_as_sparse || s.total_len() >= sp.dense_len;
        if (sparse_rows || s.num_tokens < kFlashMin) continue;
        const FlashSeq fs{s.token_begin, s.num_tokens, s.page_begin, s.past_len};
        launch_flash_prefill(ptr<const bf16>(q), fs, sd_.page_table, cache.k, cache.v, geo, GH, nh,
                             c.attn_scale(), ptr<bf16>(out), stream_);
      }
      tick("flash prefill attention");
    }
  }
  // bf16: dense rows not on the flash kernel go through the stage-2 kernel (every block
  // selected) where its shapes allow and a dense row's tiles fit its list; else (and in fp32
  // mode) attention_kernel. SALA_CUDA_DENSE_MMA=0 keeps them on attention_kernel.
  static const bool dense_mma_on = [] {
    const char* e = std::getenv("SALA_CUDA_DENSE_MMA");
    return !(e && std::string(e) == "0");
  }();
  const bool dense_mma = kBf16 && dense_mma_on && GH == 16 && infllm_head_dim_supported(d) &&
                         (sp.dense_len + 63) / 64 <= attn_list_cap_;
  const bool dense_rows = sd_.n_sparse_seqs < sd_.S;
  const size_t attn_smem = attention_smem_bytes(GH, d);
  if (dense_rows && !dense_mma) {
    SALA_CHECK(attn_smem <= size_t(max_smem_optin_), "attention needs {} bytes of shared memory",
               attn_smem);
    launch_attention<T>(ptr<const T>(q), rows, cache.k, cache.v, A, splits, ptr<T>(out),
                        attn_part_, attn_ml_, max_smem_optin_, stream_);
    tick("dense attention");
  }
  if (sd_.n_sparse_seqs > 0 || (dense_rows && dense_mma)) {
    if constexpr (kBf16) {
      SparseAttnParams SA{geo, nh, c.attn_scale(), sp.total_topk(), attn_nb_words_,
                          attn_nkt_words_, attn_list_cap_, 0};
      SA.dense_below = dense_mma ? A.flash_min : 0;  // dense rows of shorter calls too
      SA.splits = splits;
      SA.spb = decode_parts_per_block(sd_.n_tiles * kvh, splits);
      const size_t smem = sparse_attn_smem_bytes(d, SA);
      SALA_CHECK(smem + 4096 <= size_t(max_smem_optin_),
                 "sparse attention needs {} bytes of shared memory", smem);
      launch_sparse_attention(d, ptr<const bf16>(q), rows, sd_.tiles, sd_.n_tiles, cache.k,
                              cache.v, sel_, sel_cnt_, SA, ptr<bf16>(out), attn_part_,
                              attn_ml_, stream_);
    } else {
      SALA_CHECK(attn_smem <= size_t(max_smem_optin_), "attention needs {} bytes of shared memory",
                 attn_smem);
      launch_attention_selected_f32(ptr<const float>(q), rows, cache.k, cache.v, A, sel_, sel_cnt_,
                                    splits, ptr<float>(out), attn_part_, attn_ml_,
                                    max_smem_optin_, stream_);
    }
    tick("sparse attention");
  }
  SALA_CHECK(!gate || splits > 1, "gate for a step whose attention is not split");
  launch_combine<T>(sd_.seqs, sd_.S, attn_part_, attn_ml_, splits, nh, d,
                    gate ? ptr<const T>(*gate) : nullptr, ptr<T>(out), stream_);
}

template void CudaBackend::sparse_attention_t<bf16>(int, const Tensor&, const Tensor&, const Tensor&,
                                                    Tensor&, const Tensor*);
template void CudaBackend::sparse_attention_t<float>(int, const Tensor&, const Tensor&, const Tensor&,
                                                     Tensor&, const Tensor*);

}  // namespace sala
