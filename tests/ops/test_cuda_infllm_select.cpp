// InfLLM-v2 stage 1 at the kernel level (launch_infllm_select, cuda_infllm_select.cu): the
// transposed lse / score kernels against the row-per-warp ones they replace
// (cuda_infllm_select_v1.cu, BackendOptions::select_v1) on the same random step.
//   TransposedMatchesV1  head dims 16/64/128, bf16 / e4m3 / e5m2 caches, first chunks, later
//                        chunks, partial tiles, split decode rows: level-2 (m, l) within fp32
//                        rounding, block scores and edges equal but for rare one-ulp bf16
//                        flips (≤ 0.5 %), selections equal for ≥ 99 % of (row, KV head)
//   Speed                µs per launch (lse + score + top-k) of both, the released geometry
//                        (d 128, 2 KV heads × 16 query heads, stride 16 / 64, block 64), the
//                        last 2048-row chunk of 32K and 128K prompts; the transposed kernels
//                        must be faster
// The host simulation scripts/select_sim/run.sh checks the same without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cache_layout.h"
#include "backend/cuda/cuda_kernels.h"
#include "cuda_test_util.h"

namespace sala::test {
namespace {

using cuda::CacheGeom;
using cuda::DevSeq;
using cuda::SelectParams;
using cuda::SelectWork;

template <typename T>
struct Dev {  // one device array, freed with the test
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

struct SeqSpec {
  int past, n;
  bool split = false;
};

// One step of sparse sequences with random q and compressed caches (pages shuffled), d = D,
// 2 KV heads × 16 query heads; level-1 stride s1 and window 2·s1, level 2 4·s1 / 8·s1.
struct Step {
  CacheGeom G{};
  SelectParams P{};
  int T = 0, n_tiles = 0, kf = cuda::kKvAct;
  std::vector<DevSeq> seqs;
  std::vector<int32_t> row_seq, pages;
  std::vector<int2> tiles;
  std::vector<uint16_t> q;      // bf16 bits [T, 32, d]
  std::vector<uint8_t> c1, c2;  // cache bytes (bf16 or FP8 codes)
};

Step make_step(int d, int kf, int s1, int bs, int page_size, const std::vector<SeqSpec>& specs,
               uint32_t seed) {
  Step s;
  const int kvh = 2, nh = 32;
  s.kf = kf;
  s.G = CacheGeom{page_size, kvh, d, s1, 4 * s1, 2 * s1, 8 * s1, bs, int64_t(kvh) * d};
  std::mt19937 rng(seed);
  int npages = 0, nsplit = 0;
  int64_t max_len = 0;
  for (const auto& sp : specs) {
    const int64_t L = sp.past + sp.n;
    max_len = std::max(max_len, L);
    const int np = int(cache_layout::pages_for(L, page_size));
    s.seqs.push_back(
        DevSeq{s.T, sp.n, 0, int32_t(s.pages.size()), np, 1, sp.split ? nsplit : -1, sp.past});
    if (sp.split) nsplit += sp.n;
    for (int p = 0; p < np; ++p) s.pages.push_back(npages++);
    for (int i = 0; i < sp.n; ++i) s.row_seq.push_back(int32_t(s.seqs.size() - 1));
    const int tr = sp.split ? 1 : cuda::kSparseTileRows;
    for (int r = 0; r < sp.n; r += tr) s.tiles.push_back(int2{s.T + r, std::min(tr, sp.n - r)});
    s.T += sp.n;
  }
  std::vector<int32_t> perm(static_cast<size_t>(npages));
  for (int i = 0; i < npages; ++i) perm[size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (auto& p : s.pages) p = perm[size_t(p)];
  s.n_tiles = int(s.tiles.size());
  s.q = randn(s.T, int64_t(nh) * d, seed + 1).bits;
  const size_t esz = kf == cuda::kKvAct ? 2 : 1;
  auto cache = [&](int stride, uint32_t sd) {
    const int64_t entries = int64_t(npages) * (page_size / stride);
    std::vector<uint8_t> b(size_t(entries) * kvh * d * esz);
    if (kf == cuda::kKvAct) {
      const auto m = randn(entries, int64_t(kvh) * d, sd, 0.7f).bits;
      std::memcpy(b.data(), m.data(), b.size());
    } else {  // codes of moderate magnitude, no NaN / inf
      for (auto& x : b)
        x = uint8_t((rng() & 0x80u) | (rng() % (kf == cuda::kKvE4m3 ? 0x58u : 0x48u)));
    }
    return b;
  };
  s.c1 = cache(s1, seed + 2);
  s.c2 = cache(4 * s1, seed + 3);
  SelectParams& P = s.P;
  P.g = s.G;
  P.nh = nh;
  P.tau = (kf == cuda::kKvAct ? 1.f : 0.25f) / std::sqrt(float(d));
  P.init_blocks = 1, P.local_blocks = 2, P.total_topk = 8;
  P.nb_stride = int(max_len / bs) + 2;
  P.et_stride = int(max_len / s1 / cuda::kEntryTile) + 2;
  P.lse_splits = nsplit > 0 ? 32 : 1;  // the runner's kSelectSplits / kScoreSplits
  P.score_splits = nsplit > 0 ? 64 : 1;
  return s;
}

struct Outputs {
  std::vector<float2> ml;
  std::vector<uint16_t> bscore;
  std::vector<float> edge;
  std::vector<int32_t> sel, cnt;
};

// Runs launch_infllm_select `reps` times (v1: the row-per-warp kernels); the outputs of the
// last run, and µs per run in *us.
Outputs run_select(const Step& s, bool v1, int reps = 1, double* us = nullptr) {
  const int rows = s.n_tiles * cuda::kSparseTileRows, kvh = s.G.kvh;
  Dev<DevSeq> seqs(s.seqs);
  Dev<int32_t> row_seq(s.row_seq), pages(s.pages);
  Dev<int2> tiles(s.tiles);
  Dev<uint16_t> q(s.q);
  Dev<uint8_t> c1(s.c1), c2(s.c2);
  Dev<float2> ml(std::vector<float2>(size_t(rows) * s.P.nh * s.P.lse_splits, float2{NAN, NAN}));
  Dev<uint16_t> bscore(std::vector<uint16_t>(size_t(rows) * kvh * s.P.nb_stride, 0x7fa5));
  Dev<float> edge(std::vector<float>(size_t(rows) * kvh * s.P.et_stride, 12345.f));
  Dev<int32_t> sel(std::vector<int32_t>(size_t(s.T) * kvh * s.P.total_topk, -7));
  Dev<int32_t> cnt(std::vector<int32_t>(size_t(s.T) * kvh, -7));
  const cuda::StepRows R{s.T, row_seq.p, seqs.p, pages.p};
  const SelectWork W{ml.p, reinterpret_cast<cuda::bf16*>(bscore.p), edge.p};
  cudaStream_t st;
  cudaEvent_t e0, e1;
  EXPECT_EQ(cudaStreamCreate(&st), cudaSuccess);
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i <= reps; ++i) {  // the first run warms up
    if (i == 1) cudaEventRecord(e0, st);
    cuda::launch_infllm_select(s.G.d, reinterpret_cast<const cuda::bf16*>(q.p), R, tiles.p, 0,
                               s.n_tiles, c1.p, c2.p, s.P, W, sel.p, cnt.p, st, s.kf, v1);
  }
  cudaEventRecord(e1, st);
  EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  if (us) *us = 1e3 * ms / std::max(1, reps);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(st);
  return Outputs{ml.get(), bscore.get(), edge.get(), sel.get(), cnt.get()};
}

float bf16_val(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void expect_matches_v1(const char* what, const Step& s) {
  const Outputs a = run_select(s, true), b = run_select(s, false);
  // (m, l): written by both or neither; m within fp32 rounding, l within 1e-5.
  int64_t ml_n = 0, ml_bad = 0;
  for (size_t i = 0; i < a.ml.size(); ++i) {
    if (std::isnan(a.ml[i].x) && std::isnan(b.ml[i].x)) continue;
    ++ml_n;
    const bool m_ok = a.ml[i].x == b.ml[i].x ||
                      std::abs(a.ml[i].x - b.ml[i].x) <= 1e-6f * std::max(1.f, std::abs(a.ml[i].x));
    const bool l_ok = std::abs(a.ml[i].y - b.ml[i].y) <= 1e-5f * std::abs(a.ml[i].y);
    ml_bad += !(m_ok && l_ok);
  }
  // Block scores and edges: equal bits, or one bf16 ulp apart.
  int64_t n = 0, flips = 0, worse = 0;
  auto cmp = [&](double x, double y, bool same) {
    ++n;
    if (same) return;
    (std::abs(x - y) <= bf16_ulp(std::max(std::abs(x), std::abs(y))) ? flips : worse)++;
  };
  for (size_t i = 0; i < a.bscore.size(); ++i) {
    if (a.bscore[i] == 0x7fa5 && b.bscore[i] == 0x7fa5) continue;
    cmp(bf16_val(a.bscore[i]), bf16_val(b.bscore[i]), a.bscore[i] == b.bscore[i]);
  }
  for (size_t i = 0; i < a.edge.size(); ++i) {
    if (a.edge[i] == 12345.f && b.edge[i] == 12345.f) continue;
    cmp(a.edge[i], b.edge[i], std::memcmp(&a.edge[i], &b.edge[i], 4) == 0);
  }
  int64_t sel_n = 0, sel_eq = 0;
  const int K = s.P.total_topk;
  for (size_t k = 0; k < a.cnt.size(); ++k) {
    ++sel_n;
    bool eq = a.cnt[k] == b.cnt[k];
    for (int i = 0; eq && i < std::max(0, a.cnt[k]); ++i)
      eq = a.sel[k * K + size_t(i)] == b.sel[k * K + size_t(i)];
    sel_eq += eq;
  }
  std::printf(
      "[ select ] %s: (m, l) %lld, off %lld; scores + edges %lld, 1-ulp flips %lld, worse %lld; "
      "selections %lld of %lld equal\n",
      what, (long long)ml_n, (long long)ml_bad, (long long)n, (long long)flips, (long long)worse,
      (long long)sel_eq, (long long)sel_n);
  EXPECT_GT(ml_n, 0) << what;
  EXPECT_EQ(ml_bad, 0) << what;
  EXPECT_EQ(worse, 0) << what;
  EXPECT_LE(double(flips), 0.005 * double(n)) << what;
  EXPECT_GE(double(sel_eq), 0.99 * double(sel_n)) << what;
}

TEST(CudaInfllmSelect, TransposedMatchesV1) {
  REQUIRE_GPU();
  // tiny geometry (stride 4, block 16): first chunk, later chunk, quirk lengths
  expect_matches_v1("d16 bf16",
                    make_step(16, cuda::kKvAct, 4, 16, 64, {{0, 300}, {300, 20}, {0, 319}}, 1));
  expect_matches_v1("d64 e5m2 page 48", make_step(64, cuda::kKvE5m2, 4, 16, 48,
                                                  {{0, 280}, {517, 13}, {700, 1, true}}, 2));
  expect_matches_v1("d128 e4m3",
                    make_step(128, cuda::kKvE4m3, 4, 16, 64, {{0, 270}, {611, 10}}, 3));
  // released geometry (stride 16, block 64): a chunk beside split decode rows
  expect_matches_v1("d128 bf16 released",
                    make_step(128, cuda::kKvAct, 16, 64, 256,
                              {{6000, 300}, {1500, 1, true}, {9100, 2, true}}, 4));
}

TEST(CudaInfllmSelect, Speed) {
  REQUIRE_GPU();
  for (int kf : {cuda::kKvAct, cuda::kKvE4m3})
    for (int len : {32768, 131072}) {
      const Step s = make_step(128, kf, 16, 64, 256, {{len - 2048, 2048}}, 5);
      double us_v1 = 0, us_new = 0;
      run_select(s, true, 10, &us_v1);
      run_select(s, false, 10, &us_new);
      std::printf(
          "[ select ] %s, last 2048-row chunk of %d tokens: row-per-warp %.1f us, "
          "transposed %.1f us per launch (lse + score + top-k)\n",
          kf == cuda::kKvAct ? "bf16" : "e4m3", len, us_v1, us_new);
      EXPECT_LT(us_new, us_v1) << "the transposed kernels must be faster";
    }
}

}  // namespace
}  // namespace sala::test
