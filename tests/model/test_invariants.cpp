// Model invariants on the tiny golden models (CPU fp32), each with the sparse layers' KV cache
// in fp32 and in FP8 (e4m3, e5m2; BackendOptions::kv_cache_dtype: the compressed keys are
// pooled from the dequantized cached keys, so how tokens are split into calls never matters):
//   prefill(L) == prefill(L-1) + decode(1); chunked == one-shot; batched == alone;
//   chunked-form GLA == recurrent-form GLA; --dense-as-sparse == sparse rules at every length.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "backend/cpu/gla_reference.h"
#include "core/config.h"
#include "test_util.h"

namespace sala::test {
namespace {

constexpr double kTol = 2e-5;  // fp32 reassociation noise, far below the golden 1e-3

std::string dense_dir() { return fixtures_dir() + "/golden/tiny-dense"; }
std::string sparse_dir() { return fixtures_dir() + "/golden/tiny-sparse"; }

class Invariants : public ::testing::TestWithParam<KvCacheDtype> {
 protected:
  void SetUp() override {
    // The fixtures are part of the repository: a missing one is a broken checkout.
    ASSERT_TRUE(std::filesystem::exists(dense_dir() + "/model.safetensors")) << dense_dir();
    ASSERT_TRUE(std::filesystem::exists(sparse_dir() + "/model.safetensors")) << sparse_dir();
  }
};

std::vector<float> rows(const std::vector<float>& all, size_t first, size_t n, size_t V) {
  return {all.begin() + long(first * V), all.begin() + long((first + n) * V)};
}

TEST_P(Invariants, PrefillEqualsPrefillPlusDecode) {
  for (auto [dir, L] : {std::pair{dense_dir(), 150}, std::pair{sparse_dir(), 302}}) {
    auto m = load_tiny(dir, 512, 64, 1, NumericMode::F32, nullptr, GetParam());
    const size_t V = size_t(m->config().vocab_size);
    auto ids = random_tokens(L, int(V), 7);
    auto one = run_calls(*m, ids, {L}, 0, page_range(0, 64));
    auto two = run_calls(*m, ids, {L - 1, 1}, 0, page_range(0, 64));
    EXPECT_LT(max_rel_diff(two, one), kTol) << dir << " L=" << L;
    EXPECT_LT(max_rel_diff(rows(two, size_t(L) - 1, 1, V), rows(one, size_t(L) - 1, 1, V)), kTol);
  }
}

// The dense/sparse choice is made per call from the total length after the call (SPEC
// §9.2), so prefill == decode holds where both make the same choice: here every call is
// past dense_len (256). Crossing dense_len while decoding is covered by the golden case
// prefill_250_decode_80.
TEST_P(Invariants, StepByStepDecodeEqualsPrefill) {
  auto m = load_tiny(sparse_dir(), 512, 64, 1, NumericMode::F32, nullptr, GetParam());
  const int L = 390;
  auto ids = random_tokens(L, m->config().vocab_size, 11);
  std::vector<int32_t> calls{300};
  calls.resize(size_t(L - 300 + 1), 1);
  auto stepwise = run_calls(*m, ids, calls, 0, page_range(0, 64));
  auto one = run_calls(*m, ids, {L}, 0, page_range(0, 64));
  EXPECT_LT(max_rel_diff(stepwise, one), kTol);
}

TEST_P(Invariants, ChunkedEqualsOneShot) {
  for (auto [dir, L, chunks] :
       {std::tuple{dense_dir(), 200, std::vector<int32_t>{64, 64, 72}},
        std::tuple{dense_dir(), 130, std::vector<int32_t>{17, 63, 50}},
        std::tuple{sparse_dir(), 600, std::vector<int32_t>{256, 256, 88}},
        std::tuple{sparse_dir(), 302, std::vector<int32_t>{260, 20, 22}}}) {
    auto m = load_tiny(dir, 1024, 64, 1, NumericMode::F32, nullptr, GetParam());
    auto ids = random_tokens(L, m->config().vocab_size, 3);
    auto one = run_calls(*m, ids, {L}, 0, page_range(0, 64));
    auto chunked = run_calls(*m, ids, chunks, 0, page_range(0, 64));
    EXPECT_LT(max_rel_diff(chunked, one), kTol) << dir << " L=" << L;
  }
}

TEST_P(Invariants, ChunkedDiffersOnlyAtPrefillQuirkLength) {
  // SPEC §9.4 / golden README §6.4: a one-shot prefill of L ≡ -1 (mod 4·stride) hides one
  // level-2 entry from every row; chunked prefill uses the absolute rule. The two may differ
  // there, and the engine must not "fix" either.
  auto m = load_tiny(sparse_dir(), 1024, 64, 1, NumericMode::F32, nullptr, GetParam());
  const int L = 383;  // ≡ 15 (mod 16) and ≡ 3 (mod 4)
  auto ids = random_tokens(L, m->config().vocab_size, 5);
  auto one = run_calls(*m, ids, {L}, 0, page_range(0, 64));
  auto chunked = run_calls(*m, ids, {256, 127}, 0, page_range(0, 64));
  const size_t V = size_t(m->config().vocab_size);
  // The dense rows (< first sparse row) agree exactly in both.
  EXPECT_LT(max_rel_diff(rows(chunked, 0, 64, V), rows(one, 0, 64, V)), kTol);
}

TEST_P(Invariants, BatchedEqualsAlone) {
  auto m = load_tiny(sparse_dir(), 2048, 256, 4, NumericMode::F32, nullptr, GetParam());
  const int V = m->config().vocab_size;
  // Three sequences: a long prefill continuing (sparse), a fresh prefill, a decode.
  auto a = random_tokens(400, V, 21), b = random_tokens(90, V, 22), c = random_tokens(301, V, 23);
  auto pa = page_range(0, 40), pb = page_range(40, 40), pc = page_range(80, 40);
  // Alone: a = 300 then 100; b = 90; c = 300 then 1.
  auto a_alone = run_calls(*m, a, {300, 100}, 0, pa);
  auto b_alone = run_calls(*m, b, {90}, 1, pb);
  auto c_alone = run_calls(*m, c, {300, 1}, 2, pc);
  // Batched: first each sequence's first call alone (its own cache), then one step with
  // a's second chunk, b's whole prompt and c's decode.
  run_calls(*m, a, {300}, 0, pa);
  run_calls(*m, c, {300}, 2, pc);
  StepMeta meta;
  meta.add_seq(a.data() + 300, 100, 300, 0, pa, true, false);
  meta.add_seq(b.data(), 90, 0, 1, pb, true, false);
  meta.add_seq(c.data() + 300, 1, 300, 2, pc, true, false);
  std::vector<float> logits;
  m->forward(meta, logits);
  const size_t Vs = size_t(V);
  EXPECT_LT(max_rel_diff(rows(logits, 0, 100, Vs), rows(a_alone, 300, 100, Vs)), kTol);
  EXPECT_LT(max_rel_diff(rows(logits, 100, 90, Vs), b_alone), kTol);
  EXPECT_LT(max_rel_diff(rows(logits, 190, 1, Vs), rows(c_alone, 300, 1, Vs)), kTol);
}

TEST_P(Invariants, DenseAsSparseAppliesSparseRulesBelowDenseLen) {
  // --dense-as-sparse must equal the model with dense_len lowered to 1, and differ from
  // dense attention once block selection bites (query blocks beyond topk + window).
  ModelConfig cfg = load_model_config(sparse_dir());
  const int L = 240;  // < dense_len 256
  auto m = load_tiny(sparse_dir(), 512, 64, 1, NumericMode::F32, nullptr, GetParam());
  auto ids = random_tokens(L, cfg.vocab_size, 9);
  auto dense = run_calls(*m, ids, {L}, 0, page_range(0, 64));
  auto das = run_calls(*m, ids, {L}, 0, page_range(0, 64), /*dense_as_sparse=*/true);
  cfg.sparse.dense_len = 1;
  auto m1 = load_tiny(sparse_dir(), 512, 64, 1, NumericMode::F32, &cfg, GetParam());
  auto sparse_always = run_calls(*m1, ids, {L}, 0, page_range(0, 64));
  EXPECT_LT(max_rel_diff(das, sparse_always), kTol);
  EXPECT_GT(max_rel_diff(das, dense), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(KvCache, Invariants,
                         ::testing::Values(KvCacheDtype::Auto, KvCacheDtype::FP8_E4M3,
                                           KvCacheDtype::FP8_E5M2),
                         [](const auto& info) { return std::string(kv_cache_dtype_name(info.param)); });

TEST(Gla, ChunkedFormEqualsRecurrentForm) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int d : {16, 64}) {
    for (int64_t T : {1, 63, 64, 65, 200}) {
      const float g = -0.3f, scale = 1.f / std::sqrt(float(d));
      std::vector<float> q(size_t(T * d)), k(q.size()), v(q.size());
      for (auto* x : {&q, &k, &v})
        for (auto& e : *x) e = nd(rng) * 0.5f;
      std::vector<float> S0(size_t(d * d));
      for (auto& e : S0) e = nd(rng) * 0.1f;
      std::vector<float> S1 = S0, S2 = S0, o1(q.size()), o2(q.size());
      gla_recurrent(q.data(), k.data(), v.data(), T, d, d, g, scale, S1.data(), o1.data(), d);
      gla_chunked(q.data(), k.data(), v.data(), T, d, d, g, scale, S2.data(), o2.data(), d, 64);
      EXPECT_LT(max_rel_diff(o2, o1), 1e-5) << "d=" << d << " T=" << T;
      EXPECT_LT(max_rel_diff(S2, S1), 1e-5) << "d=" << d << " T=" << T;
    }
  }
}

}  // namespace
}  // namespace sala::test
