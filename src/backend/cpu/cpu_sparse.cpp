// Sparse (minicpm4) layers on the CPU: paged KV append, incremental two-level key
// compression, and dense or InfLLM-v2 block-sparse attention (SPEC §9, golden README §6).
// With an FP8 KV cache (BackendOptions::kv_cache_dtype) K, V and the compressed keys are
// stored as FP8 codes (cpu_kv_store.h) and every read below (compression, stage 1, stage 2,
// dense) sees their dequantized values; the queries stay fp32 (bf16 values in BF16 mode).
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cache_layout.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/infllm_rules.h"
#include "core/check.h"

namespace sala {
namespace {

// Pointers into the paged cache of one sequence.
struct SeqCache {
  const int32_t* pages;
  int32_t num_pages;
  int page_size;
  int64_t row;  // floats per token: kvh * d
  int s1, s2;   // compressed-entry strides

  size_t token_off(int64_t p) const {
    SALA_CHECK(cache_layout::page_index(p, page_size) < num_pages,
               "position {} beyond the sequence's {} pages", p, num_pages);
    return size_t(cache_layout::token_offset(pages, p, page_size, row));
  }
  // Compressed entry j of a level with stride s lives in the page of its first token.
  size_t entry_off(int64_t j, int s) const {
    SALA_CHECK(cache_layout::page_index(j * s, page_size) < num_pages);
    return size_t(cache_layout::entry_offset(pages, j, s, page_size, row));
  }
};

// ptrs[i] = the d values of `a` at element offset off(i), i < n; `buf` backs them when the
// array is FP8 (dequantized, n * d floats).
template <class Off>
void row_ptrs(const CpuKvArray& a, int64_t n, Off off, std::vector<const float*>& ptrs,
              std::vector<float>& buf, int d) {
  ptrs.resize(size_t(n));
  const bool fp8 = kv_is_fp8(a.dtype());
  if (fp8) buf.resize(size_t(n * d));
  for (int64_t i = 0; i < n; ++i)
    ptrs[size_t(i)] = a.read(off(i), d, fp8 ? buf.data() + i * d : nullptr);
}

float dot(const float* a, const float* b, int d) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void CpuBackend::sparse_attention(int si, const Tensor& q, const Tensor& k, const Tensor& v,
                                  Tensor& out) {
  const ModelConfig& c = cfg_;
  const auto& sp = c.sparse;
  const int kvh = c.num_key_value_heads, d = c.head_dim, group = c.kv_group();
  const int k1 = sp.kernel_size, s1 = sp.kernel_stride, k2 = sp.level2_window(),
            s2 = sp.level2_stride(), bs = sp.block_size;
  const int64_t row = int64_t(kvh) * d;
  SparseLayerCache& cache = sparse_[size_t(si)];
  const StepMeta& m = *meta_;
  const float tau = c.attn_scale();

  auto seq_cache = [&](const SeqSlice& s) {
    return SeqCache{m.page_table.data() + s.page_begin, s.num_pages, cache_shape_.page_size, row,
                    s1, s2};
  };

  // 1. Append k, v and emit the compressed entries completed by the new tokens.
  for (const SeqSlice& s : m.seqs) {
    const SeqCache sc = seq_cache(s);
    for (int64_t i = 0; i < s.num_tokens; ++i) {
      const int64_t p = s.past_len + i;
      const size_t off = sc.token_off(p);
      const int64_t src = (s.token_begin + i) * row;
      cache.k.store(off, static_cast<const float*>(k.data) + src, row);
      cache.v.store(off, static_cast<const float*>(v.data) + src, row);
    }
    // The windows are pooled from the keys as the cache gives them back (dequantized in an
    // FP8 cache), never from the step's k: a window spanning earlier calls then gets the same
    // values however the tokens were split into calls (chunked == one-shot, decode == prefill).
    auto compress = [&](int w, int st, CpuKvArray& dst) {
      std::vector<float> acc(static_cast<size_t>(row)), kbuf(static_cast<size_t>(row));
      for (int64_t p = s.past_len; p < s.total_len(); ++p) {
        const int64_t j = cache_layout::entry_completed_at(p, w, st);
        if (j < 0) continue;
        std::fill(acc.begin(), acc.end(), 0.f);  // fp32 accumulation of the window
        for (int64_t x = j * st; x < j * st + w; ++x) {
          const float* kx = cache.k.read(sc.token_off(x), row, kbuf.data());
          for (int64_t e = 0; e < row; ++e) acc[size_t(e)] += kx[e];
        }
        for (int64_t e = 0; e < row; ++e) acc[size_t(e)] = r(acc[size_t(e)] / float(w));
        dst.store(sc.entry_off(j, st), acc.data(), row);
      }
    };
    compress(k1, s1, cache.c1);
    compress(k2, s2, cache.c2);
  }

  // 2. Attention, one work item per (row, kv head).
  std::vector<std::pair<int32_t, int32_t>> items;  // (seq index, row within seq)
  for (size_t si2 = 0; si2 < m.seqs.size(); ++si2)
    for (int32_t i = 0; i < m.seqs[si2].num_tokens; ++i) items.push_back({int32_t(si2), i});
  const int64_t n_items = int64_t(items.size()) * kvh;
  if (m.capture) {
    auto& sel = m.capture->selections;
    if (sel.size() < size_t(si) + 1) sel.resize(size_t(si) + 1);
    sel[size_t(si)].assign(size_t(kvh), std::vector<std::vector<int32_t>>(size_t(q.rows)));
    if (m.capture->want_scores) {
      auto& bsc = m.capture->block_scores;
      if (bsc.size() < size_t(si) + 1) bsc.resize(size_t(si) + 1);
      bsc[size_t(si)].assign(size_t(kvh), std::vector<std::vector<float>>(size_t(q.rows)));
    }
  }

#pragma omp parallel
  {
    std::vector<float> scores, block_score, probs;
    std::vector<int32_t> idx, selected;
    std::vector<int64_t> keys;
    // Rows [d] the attention reads (K, V, compressed keys of KV head g): pointers into the
    // cache, or into the *buf scratch holding them dequantized (FP8 KV cache).
    std::vector<const float*> kp, vp, c1p, c2p;
    std::vector<float> kbuf, vbuf, c1buf, c2buf;
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < n_items; ++it) {
      const auto [seq_i, i] = items[size_t(it / kvh)];
      const int g = int(it % kvh);
      const SeqSlice& s = m.seqs[size_t(seq_i)];
      const SeqCache sc = seq_cache(s);
      const int64_t t = s.past_len + i;  // absolute position of the query
      const int64_t L = s.total_len();
      const int64_t trow = s.token_begin + i;
      const bool sparse = sp.sparse_call(L, m.dense_as_sparse);

      keys.clear();
      if (!sparse) {
        for (int64_t p = 0; p <= t; ++p) keys.push_back(p);
      } else {
        // Stage 1: level-1 scores normalised by the level-2 log-sum-exp, summed over the
        // group's query heads.
        const bool first = s.past_len == 0;
        const int64_t n1 = cache_layout::num_entries(L, k1, s1),
                      n2 = cache_layout::num_entries(L, k2, s2);
        const int64_t T = s.num_tokens;
        const int64_t cnt1 = infllm::visible_count(t, n1, T, k1, s1, first);
        const int64_t cnt2 = infllm::visible_count(t, n2, T, k2, s2, first);
        scores.assign(size_t(n1), 0.f);
        if (cnt2 > 0) {
          probs.resize(size_t(cnt2));
          // KV head g's visible entries of both levels, read once for the group's heads.
          row_ptrs(cache.c2, cnt2, [&](int64_t j) { return sc.entry_off(j, s2) + size_t(g * d); },
                   c2p, c2buf, d);
          row_ptrs(cache.c1, cnt1, [&](int64_t j) { return sc.entry_off(j, s1) + size_t(g * d); },
                   c1p, c1buf, d);
          for (int hh = 0; hh < group; ++hh) {
            const int h = g * group + hh;
            const float* qh = static_cast<const float*>(q.data) + trow * q.cols + int64_t(h) * d;
            float mx = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < cnt2; ++j) {
              probs[size_t(j)] = tau * dot(qh, c2p[size_t(j)], d);
              mx = std::max(mx, probs[size_t(j)]);
            }
            double l = 0;
            for (int64_t j = 0; j < cnt2; ++j) l += std::exp(double(probs[size_t(j)]) - mx);
            for (int64_t j = 0; j < cnt1; ++j) {
              const float s1v = tau * dot(qh, c1p[size_t(j)], d);
              scores[size_t(j)] += float(std::exp(double(s1v) - mx) / l);
            }
          }
          for (auto& x : scores) x = std::isnan(x) ? 0.f : r(x);
        }
        const int64_t nb = (L + bs - 1) / bs, qb = t / bs;
        block_score.resize(size_t(nb));
        infllm::pool_blocks(scores.data(), n1, nb, qb, bs / s1, sp.init_blocks,
                            sp.local_blocks(), block_score.data());
        infllm::select_topk(block_score.data(), nb, qb, sp.total_topk(), idx, selected);
        if (m.capture) m.capture->selections[size_t(si)][size_t(g)][size_t(trow)] = selected;
        if (m.capture && m.capture->want_scores)
          m.capture->block_scores[size_t(si)][size_t(g)][size_t(trow)] = block_score;
        for (int32_t b : selected)
          for (int64_t p = int64_t(b) * bs; p < std::min<int64_t>((int64_t(b) + 1) * bs, t + 1);
               ++p)
            keys.push_back(p);
      }

      // Stage 2 (or dense): softmax attention of the group's heads over `keys`.
      const int64_t nk = int64_t(keys.size());
      probs.resize(size_t(nk));
      auto key_off = [&](int64_t x) { return sc.token_off(keys[size_t(x)]) + size_t(g * d); };
      row_ptrs(cache.k, nk, key_off, kp, kbuf, d);
      row_ptrs(cache.v, nk, key_off, vp, vbuf, d);
      for (int hh = 0; hh < group; ++hh) {
        const int h = g * group + hh;
        const float* qh = static_cast<const float*>(q.data) + trow * q.cols + int64_t(h) * d;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t x = 0; x < nk; ++x) {
          probs[size_t(x)] = tau * dot(qh, kp[size_t(x)], d);
          mx = std::max(mx, probs[size_t(x)]);
        }
        double sum = 0;
        for (int64_t x = 0; x < nk; ++x) {
          probs[size_t(x)] = float(std::exp(double(probs[size_t(x)]) - mx));
          sum += probs[size_t(x)];
        }
        float* o = static_cast<float*>(out.data) + trow * out.cols + int64_t(h) * d;
        std::fill(o, o + d, 0.f);
        for (int64_t x = 0; x < nk; ++x) {
          const float pw = float(probs[size_t(x)] / sum);
          const float* vx = vp[size_t(x)];
#pragma omp simd
          for (int e = 0; e < d; ++e) o[e] += pw * vx[e];
        }
        for (int e = 0; e < d; ++e) o[e] = r(o[e]);
      }
    }
  }
}

}  // namespace sala
