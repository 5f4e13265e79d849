// Host driver of scripts/select_sim/run.sh: the selection kernels of this tree (newk) and of a
// reference revision (refk) on small steps, against each other and a double reference
// (SPEC §9.4–9.5: level-2 log-sum-exp per head, level-1 scores Σ_h exp(s1 − lse_h), block
// max-pool, forced blocks and top-k).
// Criteria: the score kernel fed the reference revision's (m, l) reproduces its block scores
// and edges bit for bit, and so does it with the entry tiles of unsplit rows in 3 parts; (m, l): m
// equal, l within 1e-5 relative; block scores and edges of the whole new pipeline within 1 bf16 ulp
// of the reference revision's, at most 0.5 % of them different; every pooled score of both within 1
// bf16 ulp of the double reference; the level-2 normalisers within 2e-5 of it; top-k selections
// (sel, sel_cnt) reported.
#include <algorithm>
#include <random>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "kern_new.inc"
#include "kern_ref.inc"
#include "sim.h"
using namespace sala::cuda;

struct SeqSpec {
  int past, n;
  bool split = false, sparse = true;
};
struct Case {
  const char* name;
  int D, kf, s1, bs, page_size;
  std::vector<SeqSpec> seqs;
  int lse_splits = 3, score_splits = 5;  // used when a sequence is split
};

float code_val(int kf, uint32_t c) {
  return kf == kKvE4m3 ? kv_code_f32<kKvE4m3>(c) : kv_code_f32<kKvE5m2>(c);
}
uint16_t bits(bf16 x) {
  uint16_t u;
  std::memcpy(&u, &x, 2);
  return u;
}
bf16 from_bits(uint16_t u) {
  bf16 x;
  std::memcpy(&x, &u, 2);
  return x;
}
double ulp_bf16(double x) {
  return std::ldexp(1.0, std::ilogb(std::max(std::abs(x), 1e-30)) - 7);
}

template <int D, int KF>
int run(const Case& c) {
  const int kvh = 2, nh = 16 * kvh, s1 = c.s1, s2 = 4 * s1, k1 = 2 * s1, k2 = 8 * s1,
            ps = c.page_size;
  CacheGeom G{ps, kvh, D, s1, s2, k1, k2, c.bs, int64_t(kvh) * D};
  std::mt19937 rng(unsigned(D * 131 + KF * 7 + c.s1));
  std::normal_distribution<float> nd(0.f, 1.f);
  // Sequences, rows, pages (a random permutation of the pool), tiles.
  std::vector<DevSeq> seqs;
  std::vector<int32_t> row_seq, page_table;
  std::vector<int2> tiles;
  int T = 0, npages = 0, nsplit = 0;
  long long maxL = 0;
  bool any_split = false;
  for (const auto& sp : c.seqs) {
    const long long L = sp.past + sp.n;
    maxL = std::max(maxL, L);
    const int np = int((L + ps - 1) / ps);
    // By name (a positional list put the past into state_dst_slot once that field was added).
    const DevSeq d{.token_begin = T,
                   .num_tokens = sp.n,
                   .state_slot = 0,
                   .page_begin = int(page_table.size()),
                   .num_pages = np,
                   .sparse = sp.sparse ? 1 : 0,
                   .split_row = sp.split ? nsplit : -1,
                   .state_dst_slot = 0,
                   .past_len = sp.past};
    if (sp.split) nsplit += sp.n, any_split = true;
    seqs.push_back(d);
    for (int p = 0; p < np; ++p) page_table.push_back(npages++);
    for (int i = 0; i < sp.n; ++i) row_seq.push_back(int32_t(seqs.size() - 1));
    const int tr = sp.split ? 1 : kSparseTileRows;
    for (int r = 0; r < sp.n; r += tr) tiles.push_back(make_int2(T + r, std::min(tr, sp.n - r)));
    T += sp.n;
  }
  std::vector<int32_t> perm(size_t(npages + 3));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (auto& p : page_table) p = perm[size_t(p)];
  const int pool = npages + 3;
  // q [T, nh, D] bf16; caches [pool, ps / s, kvh, D] of bf16 or codes (no NaN / inf codes).
  std::vector<bf16> q(size_t(T) * nh * D);
  for (auto& x : q) x = f2b(nd(rng));
  using E = KvElem<KF>;
  auto make_cache = [&](int s) {
    std::vector<E> v(size_t(pool) * (ps / s) * kvh * D);
    for (auto& x : v) {
      if constexpr (KF == kKvAct)
        x = f2b(0.7f * nd(rng));
      else
        x = E((rng() & 0x80u) | (rng() % (KF == kKvE4m3 ? 0x58u : 0x48u)));
    }
    return v;
  };
  const auto c1 = make_cache(s1), c2 = make_cache(s2);
  auto val = [&](const std::vector<E>& v, int s, const int32_t* pages, int64_t j, int g,
                 int d) -> double {
    const E e = v[size_t(sala::cache_layout::entry_offset(pages, j, s, ps, G.row) + g * D + d)];
    if constexpr (KF == kKvAct)
      return b2f(e);
    else
      return code_val(KF, e);
  };
  SelectParams P{};
  P.g = G, P.nh = nh;
  P.tau = (KF == kKvAct ? 1.f : 0.25f) / std::sqrt(float(D));
  P.init_blocks = 1, P.local_blocks = 1, P.total_topk = 4;
  P.nb_stride = int(maxL / c.bs) + 2;
  P.et_stride = int(maxL / s1 / kEntryTile) + 2;
  P.lse_splits = any_split ? c.lse_splits : 1;
  P.score_splits = any_split ? c.score_splits : 1;
  const int nt = int(tiles.size()), rows = nt * kSparseTileRows;
  StepRows R{T, row_seq.data(), seqs.data(), page_table.data()};
  struct Out {
    std::vector<float2> ml;
    std::vector<bf16> bs;
    std::vector<float> edge;
    std::vector<int32_t> sel, cnt;
  };
  auto fresh = [&] {
    Out o;
    o.ml.assign(size_t(rows) * nh * P.lse_splits, make_float2(NAN, NAN));
    o.bs.assign(size_t(rows) * kvh * P.nb_stride, from_bits(0x7fa5));
    o.edge.assign(size_t(rows) * kvh * P.et_stride, 12345.f);
    o.sel.assign(size_t(T) * kvh * P.total_topk, -7);
    o.cnt.assign(size_t(T) * kvh, -7);
    return o;
  };
  const int NT = P.lse_splits > 1 ? 512 : 128;
  const dim3 g_lse{unsigned(nt), unsigned(kvh), unsigned(P.lse_splits)},
      g_sc{unsigned(nt), unsigned(kvh), unsigned(P.score_splits)};
  const dim3 g_tk{unsigned(rows), unsigned(kvh), 1u};
  auto topk = [&](auto kern512, auto kern128, Out& o) {
    if (NT == 512)
      sim::launch(g_tk, 512, [&] {
        kern512(R, tiles.data(), 0, P, o.bs.data(), o.edge.data(), o.sel.data(), o.cnt.data());
      });
    else
      sim::launch(g_tk, 128, [&] {
        kern128(R, tiles.data(), 0, P, o.bs.data(), o.edge.data(), o.sel.data(), o.cnt.data());
      });
  };
  const E* C1 = c1.data();
  const E* C2 = c2.data();
  // A: the reference revision; B: this tree; X: this tree's score kernel on A's (m, l).
  Out A = fresh(), B = fresh(), X = fresh();
  sim::g_warp[0].mma = 0;
  sim::launch(g_lse, 256, [&] {
    refk::select_lse_kernel<D, KF>(q.data(), R, tiles.data(), 0, C2, P, A.ml.data());
  });
  sim::launch(g_sc, 256, [&] {
    refk::select_score_kernel<D, KF>(q.data(), R, tiles.data(), 0, C1, P, A.ml.data(), A.bs.data(),
                                     A.edge.data());
  });
  topk(refk::select_topk_kernel<512>, refk::select_topk_kernel<128>, A);
  const long mma_ref = sim::g_warp[0].mma;
  sim::g_warp[0].mma = 0;
  sim::launch(g_lse, 256, [&] {
    newk::select_lse_kernel<D, KF>(q.data(), R, tiles.data(), 0, C2, P, B.ml.data());
  });
  sim::launch(g_sc, 256, [&] {
    newk::select_score_kernel<D, KF>(q.data(), R, tiles.data(), 0, C1, P, 1, false, B.ml.data(),
                                     B.bs.data(), B.edge.data());
  });
  topk(newk::select_topk_kernel<512>, newk::select_topk_kernel<128>, B);
  const long mma_new = sim::g_warp[0].mma;
  X.ml = A.ml;
  sim::launch(g_sc, 256, [&] {
    newk::select_score_kernel<D, KF>(q.data(), R, tiles.data(), 0, C1, P, 1, false, X.ml.data(),
                                     X.bs.data(), X.edge.data());
  });
  // Y: this tree's score kernel with the entry tiles of unsplit rows in 3 parts (same numbers).
  Out Y = fresh();
  Y.ml = B.ml;
  const dim3 g_y{unsigned(nt), unsigned(kvh), unsigned(std::max(P.score_splits, 3))};
  sim::launch(g_y, 256, [&] {
    // skip_unsplit false: every row on this kernel (the wgmma kernel, sm_90 only, is not
    // simulated).
    newk::select_score_kernel<D, KF>(q.data(), R, tiles.data(), 0, C1, P, 3, false, Y.ml.data(),
                                     Y.bs.data(), Y.edge.data());
  });
  long y_diff = 0;
  for (size_t i = 0; i < B.bs.size(); ++i) y_diff += bits(Y.bs[i]) != bits(B.bs[i]);
  for (size_t i = 0; i < B.edge.size(); ++i) y_diff += std::memcmp(&Y.edge[i], &B.edge[i], 4) != 0;

  // (m, l): m equal, l relative.
  long ml_n = 0, m_diff = 0;
  double l_rel = 0;
  for (size_t i = 0; i < A.ml.size(); ++i) {
    const float2 a = A.ml[i], b = B.ml[i];
    if (std::isnan(a.x) && std::isnan(b.x)) continue;
    ++ml_n;
    if (!(a.x == b.x)) ++m_diff;
    if (a.y != b.y)
      l_rel = std::max(l_rel, std::abs(double(a.y) - b.y) / std::max(1e-30, std::abs(double(a.y))));
  }
  // Block scores / edges: bits of B and X against A.
  long bs_n = 0, bs_flip = 0, bs_big = 0, x_diff = 0, e_flip = 0, e_big = 0, e_n = 0;
  for (size_t i = 0; i < A.bs.size(); ++i) {
    x_diff += bits(X.bs[i]) != bits(A.bs[i]);
    if (bits(A.bs[i]) == 0x7fa5 && bits(B.bs[i]) == 0x7fa5) continue;
    ++bs_n;
    if (bits(A.bs[i]) != bits(B.bs[i])) {
      const double a = b2f(A.bs[i]), b = b2f(B.bs[i]);
      (std::abs(a - b) <= ulp_bf16(std::max(std::abs(a), std::abs(b))) ? bs_flip : bs_big)++;
    }
  }
  for (size_t i = 0; i < A.edge.size(); ++i) {
    x_diff += std::memcmp(&X.edge[i], &A.edge[i], 4) != 0;
    if (A.edge[i] == 12345.f && B.edge[i] == 12345.f) continue;
    ++e_n;
    if (std::memcmp(&A.edge[i], &B.edge[i], 4) != 0) {
      const double a = A.edge[i], b = B.edge[i];
      (std::abs(a - b) <= ulp_bf16(std::max(std::abs(a), std::abs(b))) ? e_flip : e_big)++;
    }
  }
  long sel_diff = 0, sel_n = 0;
  for (int row = 0; row < T; ++row)
    for (int g = 0; g < kvh; ++g) {
      const size_t k = size_t(row) * kvh + g;
      ++sel_n;
      bool d = A.cnt[k] != B.cnt[k];
      for (int i = 0; !d && i < std::max(0, A.cnt[k]); ++i)
        d = A.sel[k * P.total_topk + i] != B.sel[k * P.total_topk + i];
      sel_diff += d;
    }
  // Double reference per (row, kv head) of the sparse sequences.
  long ref_n = 0, ref_bad[2] = {0, 0}, lse_n = 0, lse_bad[2] = {0, 0};
  double lse_err[2] = {0, 0};
  for (int ti = 0; ti < nt; ++ti)
    for (int w = 0; w < tiles[size_t(ti)].y; ++w) {
      const int row = tiles[size_t(ti)].x + w;
      const DevSeq& s = seqs[size_t(row_seq[size_t(row)])];
      if (!s.sparse) continue;
      const int32_t* pages = page_table.data() + s.page_begin;
      const long long t = s.past_len + (row - s.token_begin), L = s.past_len + s.num_tokens;
      const bool first = s.past_len == 0;
      const long long n1 = num_entries(L, k1, s1), n2 = num_entries(L, k2, s2);
      const long long cnt1 = visible_count(t, n1, s.num_tokens, k1, s1, first);
      const long long cnt2 = visible_count(t, n2, s.num_tokens, k2, s2, first);
      const int64_t lrow = int64_t(ti) * kSparseTileRows + w;
      const int S = s.split_row >= 0 ? P.lse_splits : 1;
      for (int g = 0; g < kvh; ++g) {
        std::vector<double> lse(16, 0.0);
        for (int h = 0; h < 16; ++h) {
          const bf16* qh = q.data() + (size_t(row) * nh + 16 * g + h) * D;
          double mx = -INFINITY, sum = 0;
          std::vector<double> sv;
          for (long long j = 0; j < cnt2; ++j) {
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += double(b2f(qh[d])) * val(c2, s2, pages, j, g, d);
            sv.push_back(double(P.tau) * dot);
            mx = std::max(mx, sv.back());
          }
          for (double x : sv) sum += std::exp(x - mx);
          lse[size_t(h)] = mx + std::log(sum);
          if (cnt2 == 0) continue;
          // The kernels' normaliser m + log2 l (parts merged in double), log2 units.
          for (int v = 0; v < 2; ++v) {
            const Out& o = v ? B : A;
            double M = -INFINITY, Ls = 0;
            for (int z = 0; z < S; ++z)
              M = std::max(M, double(o.ml[(size_t(lrow) * nh + 16 * g + h) * P.lse_splits + z].x));
            for (int z = 0; z < S; ++z) {
              const float2 p = o.ml[(size_t(lrow) * nh + 16 * g + h) * P.lse_splits + z];
              if (p.x != -INFINITY) Ls += double(p.y) * std::exp2(double(p.x) - M);
            }
            const double err = std::abs(M + std::log2(Ls) - lse[size_t(h)] / std::log(2.0));
            lse_err[v] = std::max(lse_err[v], err);
            lse_bad[v] += !(err <= 2e-5 * std::max(1.0, std::abs(M)));
          }
          ++lse_n;
        }
        // Level-1 scores (bf16-rounded as the kernels, for the pool), then the pool.
        std::vector<double> sc(size_t(n1), 0.0);
        for (long long j = 0; j < cnt1 && cnt2 > 0; ++j) {
          double p = 0;
          for (int h = 0; h < 16; ++h) {
            const bf16* qh = q.data() + (size_t(row) * nh + 16 * g + h) * D;
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += double(b2f(qh[d])) * val(c1, s1, pages, j, g, d);
            p += std::exp(double(P.tau) * dot - lse[size_t(h)]);
          }
          sc[size_t(j)] = p;
        }
        const int r = c.bs / s1, nb = int((L + c.bs - 1) / c.bs);
        for (int b = 0; b < nb; ++b) {
          if (1LL * b * r >= n1) continue;
          double ref = -INFINITY;
          for (long long e = std::max(0LL, 1LL * b * r - 1);
               e < std::min<long long>(1LL * b * r + r, n1); ++e)
            ref = std::max(ref, sc[size_t(e)]);
          ++ref_n;
          for (int v = 0; v < 2; ++v) {
            const Out& o = v ? B : A;
            double got = b2f(o.bs[(size_t(lrow) * kvh + g) * P.nb_stride + b]);
            if (b > 0 && (b * r) % kEntryTile == 0)
              got = std::max(
                  got,
                  double(
                      o.edge[(size_t(lrow) * kvh + g) * P.et_stride + (b * r) / kEntryTile - 1]));
            ref_bad[v] += !(std::abs(got - ref) <= ulp_bf16(ref) + 1e-30);
          }
        }
      }
    }
  const bool ok = x_diff == 0 && y_diff == 0 && m_diff == 0 && l_rel <= 1e-5 && bs_big == 0 &&
                  e_big == 0 && bs_flip + e_flip <= 0.005 * double(bs_n + e_n) && ref_bad[0] == 0 &&
                  ref_bad[1] == 0 && lse_bad[0] == 0 && lse_bad[1] == 0 && ref_n > 0;
  std::printf(
      "%-34s D %3d kf %d T %3d tiles %3d | score(ref ml) bit diffs %ld, 3 parts vs 1: %ld | ml "
      "%ld: m diffs %ld, l max rel %.2e | "
      "bscore %ld: 1-ulp %ld, worse %ld | edge %ld: 1-ulp %ld, worse %ld | vs double: pooled %ld "
      "bad ref/new %ld/%ld, "
      "lse %ld max err ref/new %.1e/%.1e bad %ld/%ld | sel %ld differ %ld | mma warp0 ref/new "
      "%ld/%ld %s\n",
      c.name, D, KF, T, nt, x_diff, y_diff, ml_n, m_diff, l_rel, bs_n, bs_flip, bs_big, e_n, e_flip,
      e_big, ref_n, ref_bad[0], ref_bad[1], lse_n, lse_err[0], lse_err[1], lse_bad[0], lse_bad[1],
      sel_n, sel_diff, mma_ref, mma_new, ok ? "OK" : "FAIL");
  std::fflush(stdout);
  return ok ? 0 : 1;
}

int main() {
  int bad = 0;
  // tiny geometry: stride 4, window 8, level 2 stride 16 / window 32, block 16 (r = 4)
  bad += run<16, kKvAct>({"first chunk + later chunk + dense",
                          16,
                          kKvAct,
                          4,
                          16,
                          64,
                          {{0, 29}, {300, 20}, {0, 9, false, false}}});
  bad += run<16, kKvAct>({"first chunk 300 rows", 16, kKvAct, 4, 16, 64, {{0, 300}}});
  bad += run<16, kKvAct>({"quirk lengths 319, 307", 16, kKvAct, 4, 16, 64, {{0, 319}, {0, 307}}});
  bad += run<32, kKvE5m2>({"e5m2 chunk + split decode rows",
                           32,
                           kKvE5m2,
                           4,
                           16,
                           64,
                           {{400, 12}, {700, 1, true}, {333, 3, true}}});
  bad += run<64, kKvAct>(
      {"page 48 (12 entries a page)", 64, kKvAct, 4, 16, 48, {{0, 280}, {517, 13}}});
  bad += run<128, kKvE4m3>(
      {"e4m3 first + later chunk", 128, kKvE4m3, 4, 16, 64, {{0, 270}, {611, 10}}});
  // released geometry: stride 16, window 32, level 2 stride 64 / window 128, block 64 (r = 4)
  bad += run<128, kKvAct>({"released: chunk + split decode",
                           128,
                           kKvAct,
                           16,
                           64,
                           256,
                           {{2000, 11}, {1500, 1, true}, {3100, 2, true}},
                           32,
                           64});
  bad += run<64, kKvAct>({"block 32 (r 8), first chunk", 64, kKvAct, 4, 32, 64, {{0, 200}}});
  std::printf(bad ? "FAILED %d\n" : "ALL OK\n", bad);
  return bad;
}
