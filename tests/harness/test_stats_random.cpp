// numpy-compatible statistics and Python-compatible shuffling (reference values from
// CPython 3 `random` and numpy).
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "harness/bench_serve.h"
#include "harness/py_random.h"
#include "harness/stats.h"

using namespace sala::harness;

TEST(Stats, MatchesNumpy) {
  std::vector<double> v{3.0, 1.0, 4.0, 1.5, 9.0, 2.6};
  EXPECT_NEAR(percentile(v, 99), 8.75, 1e-12);
  EXPECT_NEAR(percentile(v, 50), 2.8, 1e-12);
  EXPECT_NEAR(percentile(v, 90), 6.5, 1e-12);
  EXPECT_NEAR(stddev(v), 2.639707475375928, 1e-12);
  auto s = summarize(v);
  EXPECT_NEAR(s.mean, 21.1 / 6, 1e-12);
  EXPECT_EQ(s.max, 9.0);
  EXPECT_EQ(summarize({}).p99, 0.0);  // np.percentile(x or 0, 99) for empty x
  EXPECT_EQ(percentile({5.0}, 99), 5.0);
}

TEST(PyRandom, MatchesCPython) {
  PyRandom r(42);
  EXPECT_EQ(r.genrand_uint32(), 2746317213u);
  EXPECT_EQ(r.genrand_uint32(), 478163327u);
  EXPECT_EQ(r.genrand_uint32(), 107420369u);
  auto shuffled = [](uint64_t seed, int n) {
    std::vector<int> x(n);
    std::iota(x.begin(), x.end(), 0);
    PyRandom(seed).shuffle(x);
    return x;
  };
  EXPECT_EQ(shuffled(42, 10), (std::vector<int>{7, 3, 2, 8, 5, 6, 9, 4, 0, 1}));
  EXPECT_EQ(shuffled(1, 7), (std::vector<int>{3, 6, 5, 2, 0, 4, 1}));
  EXPECT_EQ(shuffled(0, 5), (std::vector<int>{2, 1, 0, 4, 3}));
  EXPECT_EQ(shuffled((1ull << 40) + 5, 12), (std::vector<int>{3, 5, 2, 9, 6, 7, 1, 10, 0, 4, 11, 8}));
}

TEST(BenchMetrics, ConcurrencyListAndWeightedFigure) {
  EXPECT_EQ(parse_concurrency_list("1,8,inf"), (std::vector<int>{1, 8, 0}));
  EXPECT_EQ(parse_concurrency_list(" 4 , MAX"), (std::vector<int>{4, 0}));
  EXPECT_THROW(parse_concurrency_list("1,x"), sala::Error);
  EXPECT_EQ(tier_label(0), "Sinf");
  EXPECT_EQ(tier_label(8), "S8");
  EXPECT_DOUBLE_EQ(weighted_duration({{"S1", 10}, {"S8", 20}, {"Sinf", 30}}), 4 + 6 + 9);
  EXPECT_LT(weighted_duration({{"S1", 10}}), 0);
}

TEST(BenchMetrics, ComputeMetricsAsBenchServing) {
  TierResult t;
  t.duration_s = 2.0;
  RequestOutput a;
  a.success = true;
  a.start_s = 0.0;
  a.ttft_s = 0.5;
  a.latency_s = 1.0;
  a.prompt_len = 100;
  a.output_len = 3;
  a.itl = {0.25, 0.25};
  RequestOutput b = a;
  b.start_s = 0.5;
  b.ttft_s = 0.1;
  b.latency_s = 1.2;
  b.itl = {0.1, 0.9};
  RequestOutput c;
  c.success = false;
  c.error = "x";
  t.outputs = {a, b, c};
  compute_metrics(t);
  EXPECT_EQ(t.completed, 2);
  EXPECT_EQ(t.failed, 1);
  EXPECT_EQ(t.total_input, 200);
  EXPECT_EQ(t.total_output, 6);
  EXPECT_DOUBLE_EQ(t.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(t.output_throughput, 3.0);
  EXPECT_NEAR(t.ttft_ms.mean, 300, 1e-9);
  EXPECT_NEAR(t.tpot_ms.mean, (250.0 + 550.0) / 2, 1e-9);  // (latency - ttft) / (out - 1)
  EXPECT_NEAR(t.itl_ms.p50, 250, 1e-9);
  EXPECT_NEAR(t.achieved_concurrency, 1.1, 1e-12);
  // Token times: a at 0.5, 0.75, 1.0; b at 0.6, 0.7, 1.6 -> buckets [0,1): 4, [1,2): 2.
  ASSERT_EQ(t.tokens_per_second.size(), 3u);  // ceil(1.7) + 1
  EXPECT_EQ(t.tokens_per_second[0], 4);
  EXPECT_EQ(t.tokens_per_second[1], 2);
  EXPECT_EQ(t.max_output_tokens_per_s, 4);
  EXPECT_EQ(t.max_concurrent_requests, 2);
}
