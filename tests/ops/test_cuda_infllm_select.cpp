// InfLLM-v2 stage 1 at the kernel level (launch_infllm_select: cuda_infllm_select.cu's
// transposed lse / score kernels, then cuda_infllm_topk.cu) on random steps. Their numbers
// against the CPU oracle are CudaOps.SparseLayer*'s (test_cuda_sparse.cpp); here:
//   Deterministic  head dims 16/64/128, bf16 / e4m3 / e5m2 caches, first chunks, later
//                  chunks, partial tiles, split decode rows: every output written, and the
//                  same bits when launched again (batched == alone rests on it)
//   Sm90MatchesMmaSync  the wgmma score kernel (Hopper) against the mma.sync one: level-2
//                  sums equal, block scores within one bf16 ulp on ≤ 0.5 % of them,
//                  ≥ 99 % of selections equal, deterministic
//   Speed          µs per launch (lse + score + top-k), the released geometry (d 128, 2 KV
//                  heads × 16 query heads, stride 16 / 64, block 64), the last 2048-row chunk
//                  of 32K and 128K prompts (H200, session 14: 273 / 948 µs bf16, 336 / 1,218
//                  µs e4m3; the row-per-warp kernels they replaced took 461 / 1,767 and
//                  519 / 2,005), outputs equal to a single launch's
// The host simulation scripts/select_sim/run.sh checks them against the former kernels and a
// double reference without a GPU.
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
    // By name: a field added to DevSeq must not shift the others (a positional list once put
    // the past into state_dst_slot, so every case ran with no past).
    s.seqs.push_back(DevSeq{.token_begin = s.T,
                            .num_tokens = sp.n,
                            .state_slot = 0,
                            .page_begin = int32_t(s.pages.size()),
                            .num_pages = np,
                            .sparse = 1,
                            .split_row = sp.split ? nsplit : -1,
                            .state_dst_slot = 0,
                            .past_len = sp.past});
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

// Runs launch_infllm_select `reps` times; the outputs of the last run, and µs per run in *us.
Outputs run_select(const Step& s, int reps = 1, double* us = nullptr) {
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
                               s.n_tiles, c1.p, c2.p, s.P, W, sel.p, cnt.p, st, s.kf);
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

// Outputs of two launches: bit-equal. written: every (row, KV head) of the step has a count.
void expect_same(const char* what, const Outputs& a, const Outputs& b) {
  EXPECT_EQ(std::memcmp(a.ml.data(), b.ml.data(), a.ml.size() * sizeof(float2)), 0) << what;
  EXPECT_EQ(a.bscore, b.bscore) << what;
  EXPECT_EQ(std::memcmp(a.edge.data(), b.edge.data(), a.edge.size() * 4), 0) << what;
  EXPECT_EQ(a.sel, b.sel) << what;
  EXPECT_EQ(a.cnt, b.cnt) << what;
  int64_t unwritten = 0;
  for (int32_t c : a.cnt) unwritten += c < 0;
  EXPECT_EQ(unwritten, 0) << what;
}

void expect_deterministic(const char* what, const Step& s) {
  const Outputs a = run_select(s), b = run_select(s, 3);
  expect_same(what, a, b);
}

TEST(CudaInfllmSelect, Deterministic) {
  REQUIRE_GPU();
  // tiny geometry (stride 4, block 16): first chunk, later chunk, quirk lengths
  expect_deterministic("d16 bf16",
                       make_step(16, cuda::kKvAct, 4, 16, 64, {{0, 300}, {300, 20}, {0, 319}}, 1));
  expect_deterministic("d64 e5m2 page 48", make_step(64, cuda::kKvE5m2, 4, 16, 48,
                                                     {{0, 280}, {517, 13}, {700, 1, true}}, 2));
  expect_deterministic("d128 e4m3",
                       make_step(128, cuda::kKvE4m3, 4, 16, 64, {{0, 270}, {611, 10}}, 3));
  // released geometry (stride 16, block 64): a chunk beside split decode rows
  expect_deterministic("d128 bf16 released",
                       make_step(128, cuda::kKvAct, 16, 64, 256,
                                 {{6000, 300}, {1500, 1, true}, {9100, 2, true}}, 4));
}

// The wgmma score kernel (Hopper, d = 128) against the mma.sync one on the same steps: the
// level-2 sums are the same kernel's (bit-equal); a level-1 score may differ by one bf16 ulp
// (S's fp32 order inside a k-step), on few entries; selections nearly all equal.
void expect_sm90_close(const char* what, Step s) {
  s.P.sm90_scores = false;
  const Outputs a = run_select(s);
  s.P.sm90_scores = true;
  const Outputs b = run_select(s);
  expect_deterministic(what, s);
  EXPECT_EQ(std::memcmp(a.ml.data(), b.ml.data(), a.ml.size() * sizeof(float2)), 0) << what;
  auto ulps = [](uint16_t x, uint16_t y) {  // distance in bf16 order (finite, same sign)
    auto key = [](uint16_t v) { return (v & 0x8000u) ? -int(v & 0x7fffu) : int(v); };
    return std::abs(key(x) - key(y));
  };
  int64_t diff = 0, far = 0;
  for (size_t i = 0; i < a.bscore.size(); ++i)
    if (a.bscore[i] != b.bscore[i]) ++diff, far += ulps(a.bscore[i], b.bscore[i]) > 1;
  EXPECT_EQ(far, 0) << what;
  EXPECT_LE(diff, int64_t(a.bscore.size()) / 200) << what;
  int64_t edge_diff = 0;
  for (size_t i = 0; i < a.edge.size(); ++i) edge_diff += a.edge[i] != b.edge[i];
  EXPECT_LE(edge_diff, int64_t(a.edge.size()) / 200 + 1) << what;
  const int K = s.P.total_topk;
  int64_t rows = 0, same = 0;
  for (size_t r = 0; r < a.cnt.size(); ++r) {
    ++rows;
    same += a.cnt[r] == b.cnt[r] && std::equal(a.sel.begin() + int64_t(r) * K,
                                                a.sel.begin() + int64_t(r) * K + a.cnt[r],
                                                b.sel.begin() + int64_t(r) * K);
  }
  EXPECT_GE(same, rows - std::max<int64_t>(1, rows / 100)) << what;
  std::printf("[ select ] %s: %lld of %zu block scores and %lld of %zu edges differ (1 ulp), "
              "%lld of %lld selections equal\n",
              what, static_cast<long long>(diff), a.bscore.size(),
              static_cast<long long>(edge_diff), a.edge.size(), static_cast<long long>(same),
              static_cast<long long>(rows));
}

TEST(CudaInfllmSelect, Sm90MatchesMmaSync) {
  REQUIRE_GPU();
  if (!cuda::select_score_sm90_supported(128)) GTEST_SKIP() << "needs sm_90";
  expect_sm90_close("d128 bf16 tiny geometry",
                    make_step(128, cuda::kKvAct, 4, 16, 64, {{0, 270}, {611, 10}, {90, 37}}, 6));
  expect_sm90_close("d128 e4m3 tiny geometry",
                    make_step(128, cuda::kKvE4m3, 4, 16, 64, {{0, 270}, {611, 10}}, 7));
  expect_sm90_close("d128 bf16 released, beside split decode rows",
                    make_step(128, cuda::kKvAct, 16, 64, 256,
                              {{6000, 300}, {1500, 1, true}, {9100, 2, true}, {0, 517}}, 8));
  expect_sm90_close("d128 e5m2 released, page 128",
                    make_step(128, cuda::kKvE5m2, 16, 64, 128, {{12000, 203}, {0, 64}}, 9));
  expect_sm90_close("d128 bf16 released, last chunk of 32K",
                    make_step(128, cuda::kKvAct, 16, 64, 256, {{32768 - 2048, 2048}}, 10));
}

TEST(CudaInfllmSelect, Speed) {
  REQUIRE_GPU();
  const bool sm90 = cuda::select_score_sm90_supported(128);
  for (int kf : {cuda::kKvAct, cuda::kKvE4m3})
    for (int len : {32768, 131072})
      for (bool wg : {false, true}) {
        if (wg && !sm90) continue;
        Step s = make_step(128, kf, 16, 64, 256, {{len - 2048, 2048}}, 5);
        s.P.sm90_scores = wg;
        double us = 0;
        const Outputs timed = run_select(s, 10, &us);
        std::printf("[ select ] %s, last 2048-row chunk of %d tokens, %s scores: %.1f us per "
                    "launch (lse + score + top-k)\n",
                    kf == cuda::kKvAct ? "bf16" : "e4m3", len, wg ? "wgmma" : "mma.sync", us);
        expect_same("speed", timed, run_select(s));
      }
}

}  // namespace
}  // namespace sala::test
