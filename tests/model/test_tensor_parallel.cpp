// Tensor parallelism on the CPU backend (issue 24): the in-process communicator, and TP=2
// against TP=1 on the golden tiny models, bit for bit in both numeric modes
// (model/tensor_parallel.h: every GEMM element is TP=1's dot product, every norm TP=1's row).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "backend/comm.h"
#include "core/error.h"
#include "model/tensor_parallel.h"
#include "test_util.h"

namespace sala::test {
namespace {

std::string golden(const std::string& c) { return fixtures_dir() + "/golden/" + c; }

std::unique_ptr<Model> load(const std::string& c, int tp, NumericMode mode = NumericMode::F32,
                            int32_t max_tokens = 512) {
  return load_tiny(golden(c), max_tokens, 64, 2, mode, nullptr, KvCacheDtype::Auto, tp);
}

// Elements whose bits differ; max |a - b| into *max_abs.
int64_t bits_differ(const std::vector<float>& a, const std::vector<float>& b, double* max_abs) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  int64_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    m = std::max(m, std::abs(double(a[i]) - double(b[i])));
    n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  }
  *max_abs = m;
  return n;
}

// Runs f(comm) on `n` ranks, one thread each.
void on_ranks(int n, const std::function<void(Communicator&)>& f) {
  CpuCommGroup g(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(g.comm(r));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) th.emplace_back([&, r] { f(*comms[size_t(r)]); });
  for (auto& t : th) t.join();
}

TEST(CpuComm, AllGatherColsAndGatherToRoot) {
  on_ranks(3, [](Communicator& c) {
    std::vector<float> local(2 * 2), full(2 * 6, -1.f);
    for (int t = 0; t < 2; ++t)
      for (int j = 0; j < 2; ++j) local[size_t(t * 2 + j)] = float(100 * c.rank() + 10 * t + j);
    Tensor l{local.data(), DType::F32, 2, 2}, f{full.data(), DType::F32, 2, 6};
    c.all_gather_cols(l, f);
    for (int t = 0; t < 2; ++t)
      for (int j = 0; j < 6; ++j) EXPECT_EQ(full[size_t(t * 6 + j)], float(100 * (j / 2) + 10 * t + j % 2));
    std::fill(full.begin(), full.end(), -1.f);
    c.gather_cols(l, f, 1);
    EXPECT_EQ(full[5], c.rank() == 1 ? 201.f : -1.f);  // only the root's full is written
  });
}

TEST(CpuComm, AllReduceSumsInRankOrder) {
  // (1e8 + 1) - 1e8 = 0 in fp32 while 1e8 + (1 - 1e8) = 8: rank order, identical on every rank.
  const float v[3] = {1e8f, 1.f, -1e8f};
  std::vector<float> got(3);
  on_ranks(3, [&](Communicator& c) {
    float x[2] = {v[c.rank()], float(c.rank())};
    Tensor t{x, DType::F32, 1, 2};
    c.all_reduce_sum(t);
    got[size_t(c.rank())] = x[0];
    EXPECT_EQ(x[1], 3.f);
  });
  for (float g : got) EXPECT_EQ(g, (1e8f + 1.f) + -1e8f);
}

TEST(CpuComm, ArgmaxTiesGoToTheLowestId) {
  on_ranks(2, [](Communicator& c) {
    // Row 0: the maximum 5 on both ranks (ids 1 and 4): id 1. Row 1: rank 1's 7 (id 5).
    // Row 2: a tie inside rank 0's slice (ids 0 and 2): id 0.
    const float rows[2][9] = {{0, 5, 1, 3, 3, 3, 9, 9, 9}, {5, 2, 0, 3, 7, 1, 0, 0, 0}};
    std::vector<float> l(9);
    for (int r = 0; r < 3; ++r)
      for (int j = 0; j < 3; ++j) l[size_t(r * 3 + j)] = rows[c.rank()][r * 3 + j];
    Tensor t{l.data(), DType::F32, 3, 3};
    int32_t out[3] = {-1, -1, -1};
    c.argmax_rows(t, 3 * c.rank(), out, 0);
    if (c.rank() == 0) {
      EXPECT_EQ(out[0], 1);
      EXPECT_EQ(out[1], 4);  // rank 1's row 1 = {3, 7, 1}: id 3 + 1
      EXPECT_EQ(out[2], 0);  // rank 0's {9, 9, 9}: its first, id 0
    } else {
      EXPECT_EQ(out[0], -1);  // only the root's out is written
    }
  });
}

// The premise of the column split: y[:, n0:n1] of one GEMM equals the GEMM of the weight's
// rows n0..n1 (the CPU backend's sgemv per row, sgemm over fixed column blocks), at any
// thread count.
TEST(TensorParallel, LinearColumnSlicesAreExact) {
  for (int threads : {1, 2, 3}) {
    auto be = make_cpu_backend(BackendOptions{NumericMode::F32, threads});
    for (int64_t T : {1, 5, 16, 17, 300}) {
      for (int64_t K : {256, 512}) {
        const int64_t N = 512;
        Tensor x = be->alloc(T, K, DType::F32), w = be->alloc(N, K, DType::F32);
        uint32_t s = 1;
        auto rnd = [&] {
          s = s * 1664525u + 1013904223u;
          return float(int32_t(s >> 8) % 2001 - 1000) / 997.f;
        };
        for (int64_t i = 0; i < x.numel(); ++i) static_cast<float*>(x.data)[i] = rnd();
        for (int64_t i = 0; i < w.numel(); ++i) static_cast<float*>(w.data)[i] = rnd();
        Tensor y = be->alloc(T, N, DType::F32);
        be->linear(x, w, y);
        for (int64_t part : {2, 4}) {
          const int64_t n = N / part;
          Tensor yp = be->alloc(T, n, DType::F32);
          for (int64_t p = 0; p < part; ++p) {
            be->linear(x, Weight(w).slice_rows(p * n, n), yp);
            int64_t bad = 0;
            for (int64_t t = 0; t < T; ++t)
              bad += std::memcmp(static_cast<float*>(y.data) + t * N + p * n,
                                 static_cast<float*>(yp.data) + t * n, size_t(n) * 4) != 0;
            EXPECT_EQ(bad, 0) << "threads " << threads << " T " << T << " K " << K << " slice "
                              << p << "/" << part;
          }
        }
      }
    }
  }
}

class TpModes : public ::testing::TestWithParam<NumericMode> {};

// One prefill of 300 rows (the sparse model past dense_len: InfLLM-v2 rows), every row's
// logits and the residual stream after every layer.
TEST_P(TpModes, PrefillHiddenStatesAndLogitsEqualTp1) {
  for (const char* c : {"tiny-dense", "tiny-sparse"}) {
    auto m1 = load(c, 1, GetParam());
    auto m2 = load(c, 2, GetParam());
    ASSERT_EQ(m2->tp_size(), 2);
    const auto ids = random_tokens(300, m1->config().vocab_size, 7);
    StepMeta meta;
    const auto pages = page_range(0, 64);
    meta.add_seq(ids.data(), int32_t(ids.size()), 0, 0, pages, true, false);
    BlockCapture cap1, cap2;
    ForwardTrace t1, t2;
    std::vector<float> l1, l2;
    meta.capture = &cap1;
    m1->forward(meta, l1, &t1);
    meta.capture = &cap2;
    m2->forward(meta, l2, &t2);
    ASSERT_EQ(t1.hidden.size(), t2.hidden.size());
    double d = 0;
    for (size_t k = 0; k < t1.hidden.size(); ++k)
      EXPECT_EQ(bits_differ(t1.hidden[k], t2.hidden[k], &d), 0) << c << " hidden[" << k << "] " << d;
    EXPECT_EQ(bits_differ(l1, l2, &d), 0) << c << " logits max abs diff " << d;
    EXPECT_EQ(cap1.selections, cap2.selections) << c;  // InfLLM-v2's blocks, every head
  }
}

// prefill == prefill + step-by-step decode under TP=2 (fp32), and each of them == TP=1's bits.
TEST_P(TpModes, StepByStepDecodeEqualsPrefill) {
  auto m1 = load("tiny-sparse", 1, GetParam());
  auto m2 = load("tiny-sparse", 2, GetParam());
  const int L = 330;
  const auto ids = random_tokens(L, m1->config().vocab_size, 11);
  std::vector<int32_t> calls{300};
  calls.resize(size_t(L - 300 + 1), 1);
  const auto step2 = run_calls(*m2, ids, calls, 0, page_range(0, 64));
  const auto one2 = run_calls(*m2, ids, {L}, 1, page_range(0, 64));  // the other slot: fresh
  const auto step1 = run_calls(*m1, ids, calls, 0, page_range(0, 64));
  const auto one1 = run_calls(*m1, ids, {L}, 1, page_range(0, 64));
  double d = 0;
  if (GetParam() == NumericMode::F32)  // test_invariants' bound for TP=1 (fp32 only: bf16
    EXPECT_LT(max_rel_diff(step2, one2), 2e-5);  // rounds the chunked and recurrent GLA apart)
  EXPECT_EQ(bits_differ(step2, step1, &d), 0) << "decode, max abs diff " << d;
  EXPECT_EQ(bits_differ(one2, one1, &d), 0) << "prefill, max abs diff " << d;
}

INSTANTIATE_TEST_SUITE_P(Mode, TpModes, ::testing::Values(NumericMode::F32, NumericMode::BF16));

// Greedy steps take the distributed argmax; masked steps, prompt logprobs and logprobs of
// the gathered logits equal TP=1's.
TEST(TensorParallel, ArgmaxMasksAndLogprobsEqualTp1) {
  auto m1 = load("tiny-sparse", 1);
  auto m2 = load("tiny-sparse", 2);
  const int V = m1->config().vocab_size;
  const auto ids = random_tokens(280, V, 5);
  const auto pages = page_range(0, 64);
  std::vector<int32_t> a1, a2;
  std::vector<float> unused;
  RowLogprobs e1, e2;
  for (RowLogprobs* e : {&e1, &e2}) {
    e->rows = {3, 4, 5, 100, 279};
    e->targets = {1, 2, 3, 4, 5};
    e->top_n = 5;
  }
  StepMeta meta;
  meta.add_seq(ids.data(), 280, 0, 0, pages, false, true);
  meta.logit_rows = {0, 17, 279};
  m1->forward(meta, unused, nullptr, &a1, &e1);
  m2->forward(meta, unused, nullptr, &a2, &e2);
  EXPECT_EQ(a1, a2);
  EXPECT_EQ(e1.logprob, e2.logprob);
  EXPECT_EQ(e1.top_ids, e2.top_ids);
  EXPECT_EQ(e1.top_logprobs, e2.top_logprobs);
  // A masked greedy step (only even ids allowed): the gathered logits, masked on rank 0.
  LogitMasks masks;
  masks.words = (V + 31) / 32;
  masks.rows = {0};
  masks.bits.assign(size_t(masks.words), 0x55555555u);
  StepMeta d;
  const int32_t tok = 7;
  for (int i = 0; i < 2; ++i) {
    Model& m = i == 0 ? *m1 : *m2;
    d = StepMeta{};
    d.add_seq(&tok, 1, 280, 0, pages, false, true);
    m.forward(d, unused, nullptr, i == 0 ? &a1 : &a2, nullptr, &masks);
  }
  EXPECT_EQ(a1, a2);
  EXPECT_EQ(a2[0] % 2, 0);
  RowLogprobs l1, l2;
  for (RowLogprobs* l : {&l1, &l2}) {
    l->rows = {0};
    l->targets = {a1[0]};
    l->top_n = 3;
  }
  m1->logprobs(l1);
  m2->logprobs(l2);
  EXPECT_EQ(l1.logprob, l2.logprob);
  EXPECT_EQ(l1.top_ids, l2.top_ids);
}

TEST(TensorParallel, VocabSlicesStartAtGemmBlocks) {
  EXPECT_EQ(vocab_begin(73448, 2, 1), 36736);  // the real model: 36736 + 36712 ids
  EXPECT_EQ(vocab_begin(73448, 2, 2), 73448);
  EXPECT_EQ(vocab_begin(800, 2, 1), 448);  // sala-tiny-chat: 448 + 352
  EXPECT_EQ(vocab_begin(512, 2, 1), 256);
  for (int n : {2, 3, 4, 8})
    for (int r = 0; r < n; ++r) EXPECT_EQ(vocab_begin(73448, n, r) % kLinearColBlock, 0);
  ModelConfig c = load_model_config(golden("tiny-sparse"));
  c.vocab_size = 64;  // one block: nothing left for rank 1
  EXPECT_NE(error_of([&] { check_tp_config(c, 2); }).find("vocab_size = 64 is too small"),
            std::string::npos);
}

TEST(TensorParallel, RefusesWhatItCannotSplit) {
  // No NCCL communicator: GPUs refused with a clear message.
  EXPECT_NE(error_of([] { make_tp_peers("cuda", BackendOptions{}, 2); }).find("CPU backend only"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_tp_peers("cpu", BackendOptions{}, 0); }).find("must be >= 1"),
            std::string::npos);
  EXPECT_TRUE(make_tp_peers("cpu", BackendOptions{}, 1).empty());
  ModelConfig c = load_model_config(golden("tiny-sparse"));
  EXPECT_EQ(error_of([&] { check_tp_config(c, 2); }), "");
  EXPECT_NE(error_of([&] { check_tp_config(c, 3); }).find("not divisible by --tp-size 3"),
            std::string::npos);
  c.lightning_nh = 6;  // TP=4 splits everything else of tiny-sparse
  EXPECT_EQ(error_of([&] { check_tp_config(load_model_config(golden("tiny-sparse")), 4); }), "");
  EXPECT_NE(error_of([&] { check_tp_config(c, 4); }).find("lightning_nh = 6 is not divisible"),
            std::string::npos);
  // Load-time FP8 weights are not split.
  EXPECT_NE(error_of([] {
              BackendOptions bo;
              bo.fp8_weights = true;
              const std::string dir = golden("tiny-dense");
              ModelLimits lim;
              lim.max_step_tokens = lim.max_logit_rows = 16;
              lim.caches = {4, 64, 1};
              Model m(load_model_config(dir), make_backend("cpu", bo), Checkpoint(dir), lim,
                      make_tp_peers("cpu", bo, 2));
            }).find("dense weights only"),
            std::string::npos);
}

}  // namespace
}  // namespace sala::test
