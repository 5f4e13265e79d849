// SparseRunner's attention: append / compress, InfLLM-v2 selection, flash prefill, dense and
// sparse attention and the combine kernel. Kernels: cuda_sparse.cu, cuda_flash.cu and the
// InfLLM-v2 kernels (cuda_infllm_select.cu / cuda_infllm_attn.cu in bf16 mode,
// cuda_f32_select.cu and attention_kernel<float, true> in fp32 mode).
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_host_util.h"
#include "backend/cuda/cuda_sparse_runner.h"
#include "core/check.h"

namespace sala::cuda_host {
using namespace sala::cuda;

void SparseRunner::attention(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                             Tensor& out) {
  SALA_CHECK(is_act(q) && is_act(k) && is_act(v) && is_act(out));
  if (bf16_)
    attention_t<bf16>(si, q, k, v, out);
  else
    attention_t<float>(si, q, k, v, out);
}

// Steps of split calls only (decode, verify) whose attention is split: every row's output is
// written by the combine kernel, which then applies the gate as mul_sigmoid would (same
// roundings: the attention value rounded to T, times T(sigmoid(gate))); one kernel less per
// sparse layer. Other steps: the two-op default.
bool SparseRunner::attention_mul_sigmoid(int si, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& gate, Tensor& out) {
  const StepDev& sd = plan_.dev();
  const bool fused = sd.n_split_seqs == sd.S && sd.S > 0 && decode_attn_splits() > 1 &&
                     is_act(gate) && gate.rows == out.rows && gate.cols == out.cols;
  if (!fused) return false;
  SALA_CHECK(is_act(q) && is_act(k) && is_act(v) && is_act(out));
  if (bf16_)
    attention_t<bf16>(si, q, k, v, out, &gate);
  else
    attention_t<float>(si, q, k, v, out, &gate);
  return true;
}

// StepMeta::capture (tests, golden): the selected blocks of every sparse (row, KV head) of
// layer si, ascending; empty for dense rows.
void SparseRunner::capture_selections(int si) const {
  const StepMeta& meta = *plan_.meta();
  const auto& sp = cfg_.sparse;
  const int kvh = cfg_.num_key_value_heads, T_rows = plan_.dev().T;
  auto& selc = meta.capture->selections;
  if (selc.size() < size_t(si) + 1) selc.resize(size_t(si) + 1);
  selc[size_t(si)].assign(size_t(kvh), std::vector<std::vector<int32_t>>(size_t(T_rows)));
  if (plan_.dev().n_sparse_seqs == 0) return;
  const int K = sp.total_topk();
  std::vector<int32_t> hsel(size_t(T_rows) * kvh * K), hcnt(size_t(T_rows) * kvh);
  CUDA_CHECK(cudaMemcpyAsync(hsel.data(), sel_, hsel.size() * 4, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaMemcpyAsync(hcnt.data(), sel_cnt_, hcnt.size() * 4, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (const SeqSlice& s : meta.seqs) {
    if (!sp.sparse_call(s.total_len(), meta.dense_as_sparse)) continue;
    for (int i = 0; i < s.num_tokens; ++i)
      for (int g = 0; g < kvh; ++g) {
        const size_t rg = size_t(s.token_begin + i) * kvh + size_t(g);
        selc[size_t(si)][size_t(g)][size_t(s.token_begin + i)].assign(
            hsel.begin() + int64_t(rg) * K, hsel.begin() + int64_t(rg) * K + hcnt[rg]);
      }
  }
}

// T = bf16: the tensor-core InfLLM-v2 and flash kernels, over a bf16 or an FP8 KV cache. T = float (fp32 mode): the same
// append / compress / dense attention kernels for float, cuda_f32_select.cu's selection and
// attention_kernel<float, true> over the selected blocks; no flash.
template <typename T>
void SparseRunner::attention_t(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                               Tensor& out, const Tensor* gate) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  const ModelConfig& c = cfg_;
  const auto& sp = c.sparse;
  const StepMeta& meta = *plan_.meta();
  const StepDev& sd = plan_.dev();
  const int kvh = c.num_key_value_heads, d = c.head_dim, nh = c.num_attention_heads;
  const int GH = c.kv_group();
  SALA_CHECK(si >= 0 && si < int(caches_.size()));
  SALA_CHECK(q.cols == int64_t(nh) * d && k.cols == int64_t(kvh) * d && v.cols == k.cols &&
             out.cols == q.cols && q.rows == sd.T && out.rows == q.rows);
  const int T_rows = sd.T;
  if (T_rows == 0) return;
  const LayerCache& sc = caches_[size_t(si)];
  struct {
    T *k, *v, *c1, *c2;
  } cache{static_cast<T*>(sc.k), static_cast<T*>(sc.v), static_cast<T*>(sc.c1), static_cast<T*>(sc.c2)};
  CacheGeom geo{shape_.page_size, kvh, d, sp.kernel_stride, sp.level2_stride(),
                sp.kernel_size, sp.level2_window(), sp.block_size, int64_t(kvh) * d};

  const StepRows rows{T_rows, sd.row_seq, sd.seqs, sd.page_table};
  // FP8 KV cache (bf16 mode only, make_cuda_backend): codes with the layer's K / V scales;
  // the K scale goes into every score's tau, the V scale onto every output (cuda_kv_fp8.cuh).
  const bool fp8 = kv_fmt_ != kKvAct;
  SALA_CHECK(!fp8 || kBf16, "an FP8 KV cache runs in bf16 mode only");
  const KvScale ksc = fp8 ? kv_scales_[size_t(si)] : KvScale{};
  const float tau = fp8 ? c.attn_scale() * ksc.k : c.attn_scale();
  if (fp8) {
    if constexpr (kBf16) {
      auto* k8 = static_cast<uint8_t*>(sc.k);
      launch_append_kv_fp8(kv_fmt_, ptr<const bf16>(k), ptr<const bf16>(v), rows, geo, ksc, k8,
                           static_cast<uint8_t*>(sc.v), stream_);
      launch_compress_fp8(kv_fmt_, rows, geo, ksc, k8, static_cast<uint8_t*>(sc.c1),
                          static_cast<uint8_t*>(sc.c2), stream_);
    }
  } else {
    launch_append_kv<T>(ptr<const T>(k), ptr<const T>(v), rows, geo, cache.k, cache.v, stream_);
    launch_compress<T>(rows, geo, cache.k, cache.c1, cache.c2, stream_);
  }
  timer_.tick("sparse append+compress");

  SALA_CHECK(!kBf16 || sd.n_sparse_seqs == 0 || (GH == 16 && infllm_head_dim_supported(d)),
             "InfLLM-v2 layers need 16 query heads per KV head and head_dim 16/32/64/128 (have {} "
             "and {})", GH, d);
  // Selection needs each row's level-2 normaliser, then scores, then top-k. Rows of split
  // calls (decode and verify rows, one row per tile) split their entries over kSelectSplits
  // blocks; a step has that grid whenever it has such a row, so a recorded decode step
  // launches the same grids at every context length.
  const bool split_calls = sd.n_split_rows > 0;
  if (sd.n_sparse_seqs > 0) {
    SelectParams P{};
    P.g = geo;
    P.nh = nh;
    P.tau = tau;
    P.init_blocks = sp.init_blocks;
    P.local_blocks = sp.local_blocks();
    P.total_topk = sp.total_topk();
    P.nb_stride = select_nb_stride_;
    P.et_stride = select_et_stride_;
    P.lse_splits = split_calls ? kSelectSplits : 1;
    P.score_splits = split_calls ? kScoreSplits : 1;
    // Prompt chunks' rows on the wgmma score kernel (a step without one launches none).
    P.sm90_scores = select_score_sm90_supported(d) && !sd.prompt_free;
    if constexpr (kBf16) {
      for (int t0 = 0; t0 < sd.n_tiles; t0 += kSelectChunkTiles)
        launch_infllm_select(d, ptr<const bf16>(q), rows, sd.tiles, t0,
                             std::min(kSelectChunkTiles, sd.n_tiles - t0), sc.c1, sc.c2, P,
                             select_work_, sel_, sel_cnt_, stream_, kv_fmt_);
    } else {
      launch_f32_select(ptr<const float>(q), rows, cache.c1, cache.c2, P, max_smem_optin_, sel_,
                        sel_cnt_, stream_);
    }
    timer_.tick("sparse select");
  }
  if (meta.capture) capture_selections(si);

  // Attention: rows of one-token calls (decode) split over 16 parts of their keys (a fixed
  // count: a recorded decode step launches the same grid at every length), other rows never;
  // so a row's numbers depend only on its own call, not on what shares its step.
  const int splits = split_calls ? decode_attn_splits() : 1;
  // Long dense calls (prefill chunks) on the tensor cores; the rest (decode rows, short
  // calls) in attention_kernel; sparse rows in sparse_attn.
  constexpr int kFlashMin = 64;
  const bool flash = kBf16 && flash_prefill_supported(d);
  AttnParams A{geo, GH, nh, c.attn_scale(), flash ? kFlashMin : 1 << 30, sp.total_topk(), ksc};
  if constexpr (kBf16) {
    if (flash) {
      for (const SeqSlice& s : meta.seqs) {
        const bool sparse_rows = sp.sparse_call(s.total_len(), meta.dense_as_sparse);
        if (sparse_rows || s.num_tokens < kFlashMin) continue;
        const FlashSeq fs{s.token_begin, s.num_tokens, s.page_begin, s.past_len};
        launch_flash_prefill(ptr<const bf16>(q), fs, sd.page_table, sc.k, sc.v, geo, GH, nh, tau,
                             ptr<bf16>(out), stream_, kv_fmt_, ksc.v);
      }
      timer_.tick("flash prefill attention");
    }
  }
  // bf16: dense rows not on the flash kernel go through the stage-2 kernel (every block
  // selected) where its shapes allow and a dense row's tiles fit its list; else (and in fp32
  // mode) attention_kernel.
  // A dense call is shorter than dense_len and than the pool's longest sequence: a small pool
  // (a short-context server, `bench offline` at B = 1) still takes the stage-2 kernel.
  const int64_t dense_max = std::min<int64_t>(sp.dense_len, select_max_len_);
  const bool dense_mma = kBf16 && GH == 16 && infllm_head_dim_supported(d) &&
                         (dense_max + 63) / 64 <= attn_list_cap_;
  const bool dense_rows = sd.n_sparse_seqs < sd.S;
  const size_t attn_smem = attention_smem_bytes(GH, d);
  if (dense_rows && !dense_mma) {
    SALA_CHECK(attn_smem <= size_t(max_smem_optin_), "attention needs {} bytes of shared memory",
               attn_smem);
    if (fp8) {
      if constexpr (kBf16)
        launch_attention_fp8(kv_fmt_, ptr<const bf16>(q), rows, static_cast<const uint8_t*>(sc.k),
                             static_cast<const uint8_t*>(sc.v), A, splits, ptr<bf16>(out),
                             attn_part_, attn_ml_, max_smem_optin_, stream_);
    } else {
      launch_attention<T>(ptr<const T>(q), rows, cache.k, cache.v, A, splits, ptr<T>(out),
                          attn_part_, attn_ml_, max_smem_optin_, stream_);
    }
    timer_.tick("dense attention");
  }
  if (sd.n_sparse_seqs > 0 || (dense_rows && dense_mma)) {
    if constexpr (kBf16) {
      SparseAttnParams SA{geo, nh, tau, sp.total_topk(), attn_nb_words_,
                          attn_nkt_words_, attn_list_cap_, 0};
      SA.kv_fmt = kv_fmt_;
      SA.v_scale = ksc.v;
      SA.dense_below = dense_mma ? A.flash_min : 0;  // dense rows of shorter calls too
      SA.splits = splits;
      // Tiles of several split rows compute one part per block (StepDev::shared_tiles).
      SA.spb = sd.shared_tiles ? 1 : decode_parts_per_block(sd.n_tiles * kvh, splits);
      const size_t smem = sparse_attn_smem_bytes(d, SA);
      SALA_CHECK(smem + 4096 <= size_t(max_smem_optin_),
                 "sparse attention needs {} bytes of shared memory", smem);
      // Prompt chunks' sparse rows on Hopper's wgmma kernel (sm90_prefill_ok_: the device,
      // the head shape and its shared memory; an FP8 cache with its TMA maps); the mma.sync
      // kernel takes the rest.
      SA.sm90_prefill_rows = sm90_prefill_ok_ && (kv_fmt_ == kKvAct || sc.has_maps) &&
                             !sd.prompt_free && sd.n_sparse_seqs > 0;
      // An FP8 cache's pages as bf16 in the shadow where it holds the step's prompt chunks:
      // the same kernel reads them as a bf16 cache (tau and v_scale stay the FP8 ones).
      if (SA.sm90_prefill_rows && fp8 && fill_kv_shadow(si, geo)) {
        timer_.tick("sparse kv shadow");
        if (meta.capture) ++meta.capture->kv_shadow_layers;
        SparseAttnParams SB = SA;
        SB.kv_fmt = kKvAct;
        StepRows shadow_rows = rows;
        shadow_rows.page_table = shadow_pt_;
        launch_sparse_attention_sm90(ptr<const bf16>(q), shadow_rows, sd.tiles, sd.n_tiles,
                                     shadow_k_, shadow_v_, &shadow_maps_, sel_, sel_cnt_, SB,
                                     ptr<bf16>(out), stream_);
      } else if (SA.sm90_prefill_rows) {
        launch_sparse_attention_sm90(ptr<const bf16>(q), rows, sd.tiles, sd.n_tiles, sc.k, sc.v,
                                     sc.has_maps ? &sc.maps : nullptr, sel_, sel_cnt_, SA,
                                     ptr<bf16>(out), stream_);
      }
      launch_sparse_attention(d, ptr<const bf16>(q), rows, sd.tiles, sd.n_tiles, sc.k, sc.v,
                              sel_, sel_cnt_, SA, ptr<bf16>(out), attn_part_, attn_ml_, stream_);
    } else {
      SALA_CHECK(attn_smem <= size_t(max_smem_optin_), "attention needs {} bytes of shared memory",
                 attn_smem);
      launch_attention_selected_f32(ptr<const float>(q), rows, cache.k, cache.v, A, sel_, sel_cnt_,
                                    splits, ptr<float>(out), attn_part_, attn_ml_,
                                    max_smem_optin_, stream_);
    }
    timer_.tick("sparse attention");
  }
  SALA_CHECK(!gate || splits > 1, "gate for a step whose attention is not split");
  launch_combine<T>(sd.seqs, sd.S, attn_part_, attn_ml_, splits, nh, d,
                    gate ? ptr<const T>(*gate) : nullptr, ptr<T>(out), stream_);
}

template void SparseRunner::attention_t<bf16>(int, const Tensor&, const Tensor&, const Tensor&,
                                              Tensor&, const Tensor*);
template void SparseRunner::attention_t<float>(int, const Tensor&, const Tensor&, const Tensor&,
                                               Tensor&, const Tensor*);

}  // namespace sala::cuda_host
