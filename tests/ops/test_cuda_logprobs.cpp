// Log-probabilities on the device (CudaBackend::logprobs_rows, cuda_logprobs.cu) against the
// CPU backend (logprobs_of_row, the oracle): the top ids exactly, everywhere (both order raw
// fp32 logits by value, then id: there is no arithmetic in the order, so no near-tie can
// split them; the test builds exact ties deliberately: bf16-valued rows, the maximum copied to
// ids that different threads read, -0 and +0 as the largest values, -inf fillers when fewer
// finite logits than top_n); the log-probabilities within one fp32 ulp plus 16 double ulps of
// the log-sum-exp (the kernel's sum is a tree where the host's runs left to right, and CUDA's
// exp / log may differ from glibc's by a double ulp), nearly all of them bit for bit; NaN
// where the host has NaN (target -1, rows without a finite maximum, a NaN logit). Also:
// batched == alone, growing buffers, and the speed against Backend's default (download each
// row, compute on the host). Part of test_cuda_ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/logprobs.h"
#include "backend/sampling.h"  // argmax
#include "cuda_test_util.h"

namespace sala::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Lp {
  std::vector<float> lp, top_lp;
  std::vector<int32_t> top_ids;
};

Lp run(Backend& be, const Tensor& logits, const std::vector<int32_t>& rows,
       const std::vector<int32_t>& targets, int top_n) {
  const size_t n = rows.size();
  Lp r{std::vector<float>(n), std::vector<float>(n * size_t(top_n)),
       std::vector<int32_t>(n * size_t(top_n))};
  be.logprobs_rows(logits, rows.data(), targets.data(), int64_t(n), top_n, r.lp.data(),
                   r.top_ids.data(), r.top_lp.data());
  return r;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Tallies of the value comparisons over a test.
struct Tally {
  int64_t n = 0, identical = 0;
  double max_ulps = 0;
};

// gpu against cpu (the host's value): NaN where the host has NaN, infinities exactly, finite
// values within one fp32 ulp of cpu plus 16 double ulps of a log-sum-exp of magnitude <= lse_mag.
void expect_value(float gpu, float cpu, double lse_mag, Tally& t, const std::string& what) {
  ++t.n;
  if (std::isnan(cpu)) {
    EXPECT_TRUE(std::isnan(gpu)) << what << ": host NaN, device " << gpu;
    t.identical += std::isnan(gpu);
    return;
  }
  if (std::isinf(cpu)) {
    EXPECT_EQ(gpu, cpu) << what;
    t.identical += gpu == cpu;
    return;
  }
  const double ulp = double(std::nextafter(std::fabs(cpu), kInf) - std::fabs(cpu));
  const double d = std::fabs(double(gpu) - double(cpu));
  EXPECT_LE(d, ulp + 16 * 0x1.0p-52 * lse_mag) << what << ": device " << gpu << ", host " << cpu;
  t.identical += same_bits(gpu, cpu);
  if (std::fabs(cpu) > 1e-30f) t.max_ulps = std::max(t.max_ulps, d / ulp);  // (0: no ulp scale)
}

// R rows of V logits whose values tie often (bf16 values) or not (fp32), scale 3, and the
// special rows (each only where V allows):
//   1: -inf at every third id and at the row's argmax      2: all -inf
//   3: three finite logits, the rest -inf                  4: the maximum copied to 8 ids
//   5: negative, with -0 and +0 as the largest values      6: one logit 40 above the rest
//   7: a NaN logit (NaN log-probabilities)                 8: a +inf logit (NaN everywhere)
HostMatF32 build_rows(int64_t R, int64_t V, uint32_t seed, bool ties) {
  HostMatF32 x = ties ? HostMatF32{R, V, randn(R, V, seed, 3.f).f32()} : randn_f32(R, V, seed, 3.f);
  auto row = [&](int64_t r) { return x.v.data() + r * V; };
  auto amax = [&](int64_t r) {
    int64_t b = 0;
    for (int64_t j = 1; j < V; ++j) b = row(r)[j] > row(r)[b] ? j : b;
    return b;
  };
  const int64_t a1 = amax(1);
  for (int64_t j = 0; j < V; j += 3) row(1)[j] = -kInf;
  row(1)[a1] = -kInf;
  for (int64_t j = 0; j < V; ++j) row(2)[j] = -kInf;
  for (int64_t j = 0; j < V; ++j)
    if (j != 1 && j != V / 2 && j != V - 2) row(3)[j] = -kInf;
  const float m4 = row(4)[amax(4)];
  for (int k = 0; k < 8; ++k) row(4)[(V - 1) - k * (V / 8)] = m4;  // ids 513 apart at V 4097
  for (int64_t j = 0; j < V; ++j) row(5)[j] = -std::fabs(row(5)[j]) - 0.5f;
  row(5)[1] = -0.0f;  // ids 1, 2, V-2, V-1: -0, +0, +0, -0 (one tie group, in id order)
  row(5)[2] = 0.0f;
  row(5)[V - 2] = 0.0f;
  row(5)[V - 1] = -0.0f;
  row(6)[V / 2] = row(6)[amax(6)] + 40.f;
  row(7)[V / 3] = std::numeric_limits<float>::quiet_NaN();
  row(8)[V - 1] = kInf;
  return x;
}

// Every requested row of every (V, bf16 ties or not, top_n): both backends on the same
// uploaded logits, rows requested out of order and repeated, targets -1, at the argmax, at a
// -inf logit and random.
void check_against_host(std::initializer_list<int64_t> Vs, std::initializer_list<int> top_ns) {
  Tally t;
  int64_t ids_compared = 0;
  for (int64_t V : Vs) {
    for (bool ties : {false, true}) {
      Pair p(NumericMode::F32);
      const int64_t R = 16;
      const HostMatF32 x = build_rows(R, V, uint32_t(V) * 2 + ties, ties);
      const auto logits = p.up(x);
      std::vector<int32_t> rows, targets;
      std::mt19937 rng(uint32_t(V) + 5);
      for (int64_t r = R - 1; r >= 0; --r) {  // descending, then rows 1..4 again
        rows.push_back(int32_t(r));
        rows.push_back(int32_t(r % 4 + 1));
      }
      for (size_t i = 0; i < rows.size(); ++i) {
        const float* row = x.v.data() + rows[i] * V;
        int32_t tgt = int32_t(rng() % uint32_t(V));
        if (i % 4 == 0) tgt = -1;
        if (i % 4 == 1) tgt = argmax(row, int32_t(V));
        if (rows[i] == 1 && i % 2) tgt = 0;  // a -inf logit: logprob -inf
        targets.push_back(tgt);
      }
      for (int top_n : top_ns) {
        const Lp c = run(*p.cpu, logits.c, rows, targets, top_n);
        const Lp g = run(*p.gpu, logits.g, rows, targets, top_n);
        for (size_t i = 0; i < rows.size(); ++i) {
          const int32_t r = rows[i];
          const float* row = x.v.data() + r * V;
          float mx = -kInf;
          for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
          const double lse_mag = std::isfinite(mx) ? std::fabs(double(mx)) + std::log(double(V)) + 1 : 1;
          const std::string what = "V " + std::to_string(V) + " ties " + std::to_string(ties) +
                                   " top_n " + std::to_string(top_n) + " row " + std::to_string(r) +
                                   " target " + std::to_string(targets[i]);
          expect_value(g.lp[i], c.lp[i], lse_mag, t, what + " logprob");
          for (int k = 0; k < top_n; ++k) {
            const size_t e = i * size_t(top_n) + size_t(k);
            if (r == 7) {  // a NaN logit: the host's list is position-dependent there
              EXPECT_TRUE(g.top_ids[e] >= -1 && g.top_ids[e] < V && g.top_ids[e] != V / 3) << what;
              EXPECT_TRUE(std::isnan(g.top_lp[e]) || g.top_ids[e] < 0) << what;
              continue;
            }
            EXPECT_EQ(g.top_ids[e], c.top_ids[e]) << what << " top " << k;
            ++ids_compared;
            expect_value(g.top_lp[e], c.top_lp[e], lse_mag, t, what + " top " + std::to_string(k));
          }
        }
        // The deliberate ties came out in id order on the host (the test builds what it means).
        if (top_n == 20 && V >= 1000) {
          const size_t i4 = 2 * (R - 1 - 4);  // rows[i4] == 4
          ASSERT_EQ(rows[i4], 4);
          for (int k = 0; k + 1 < 8; ++k)
            EXPECT_LT(c.top_ids[i4 * 20 + size_t(k)], c.top_ids[i4 * 20 + size_t(k) + 1]);
        }
      }
    }
  }
  std::printf("logprobs: %lld values, %lld bit-identical, max %.2f fp32 ulps; %lld top ids, all "
              "compared exactly\n", (long long)t.n, (long long)t.identical, t.max_ulps,
              (long long)ids_compared);
  // Expected: every value bit-identical (a difference needs x - lse within a few double ulps
  // of an fp32 rounding boundary: ~1e-8 per value, more for log-probabilities near 0).
  EXPECT_GE(double(t.identical), 0.99 * double(t.n));
}

TEST(CudaLogprobs, MatchesTheHost) {
  REQUIRE_GPU();
  check_against_host({7, 1000, 4097, 73448}, {0, 1, 5, 20});
}

// The same at small shapes (the sanitizers' case: scripts/gpu_check.sh SAN_FILTER_OPS).
TEST(CudaLogprobs, Small) {
  REQUIRE_GPU();
  check_against_host({7, 50}, {0, 3, 20});
}

// 1,000 requested rows (more than the first buffer), against the host and each row against
// a one-row call of its own, bit for bit.
TEST(CudaLogprobs, ManyRowsAndBatchedEqualsAlone) {
  REQUIRE_GPU();
  const int64_t V = 4097, R = 64;
  Pair p(NumericMode::F32);
  const HostMatF32 x = build_rows(R, V, 17, true);
  const auto logits = p.up(x);
  std::mt19937 rng(3);
  std::vector<int32_t> rows(1000), targets(1000);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i] = 9 + int32_t(rng() % uint32_t(R - 9));  // the random rows
    targets[i] = i % 3 ? int32_t(rng() % uint32_t(V)) : -1;
  }
  const std::vector<int32_t> one_row{rows[0]}, one_target{targets[0]};
  run(*p.gpu, logits.g, one_row, one_target, 20);  // a small first call: the buffers grow
  const Lp c = run(*p.cpu, logits.c, rows, targets, 20);
  const Lp g = run(*p.gpu, logits.g, rows, targets, 20);
  EXPECT_EQ(g.top_ids, c.top_ids);
  Tally t;
  for (size_t i = 0; i < rows.size(); ++i) {
    expect_value(g.lp[i], c.lp[i], 30, t, "row " + std::to_string(rows[i]));
    for (size_t k = 0; k < 20; ++k)
      expect_value(g.top_lp[i * 20 + k], c.top_lp[i * 20 + k], 30, t, "top");
  }
  for (size_t i = 0; i < rows.size(); i += 97) {
    const Lp a = run(*p.gpu, logits.g, {rows[i]}, {targets[i]}, 20);
    EXPECT_TRUE(same_bits(a.lp[0], g.lp[i]) || (std::isnan(a.lp[0]) && std::isnan(g.lp[i]))) << i;
    for (size_t k = 0; k < 20; ++k) {
      EXPECT_EQ(a.top_ids[k], g.top_ids[i * 20 + k]) << i;
      EXPECT_TRUE(same_bits(a.top_lp[k], g.top_lp[i * 20 + k])) << i;
    }
  }
  EXPECT_GE(double(t.identical), 0.99 * double(t.n));
}

// The device path against Backend's default (each row downloaded, logprobs_of_row on the
// host), at the model's vocabulary, top_n 5.
TEST(CudaLogprobs, Speed) {
  REQUIRE_GPU();
  const int64_t V = 73448;
  Pair p(NumericMode::F32);
  const auto logits = p.up(build_rows(64, V, 99, true));
  for (int64_t R : {int64_t(1), int64_t(8), int64_t(64)}) {
    std::vector<int32_t> rows(static_cast<size_t>(R)), targets(rows);
    for (int64_t i = 0; i < R; ++i) rows[size_t(i)] = int32_t(i), targets[size_t(i)] = int32_t(i * 997 % V);
    std::vector<float> lp(static_cast<size_t>(R)), tlp(static_cast<size_t>(R) * 5);
    std::vector<int32_t> tid(static_cast<size_t>(R) * 5);
    auto time_us = [&](auto&& f, int reps) {
      f();
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < reps; ++k) f();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
    };
    Backend& gpu = *p.gpu;
    const double dev = time_us([&] {
      gpu.logprobs_rows(logits.g, rows.data(), targets.data(), R, 5, lp.data(), tid.data(), tlp.data());
    }, 50);
    const double host = time_us([&] {
      gpu.Backend::logprobs_rows(logits.g, rows.data(), targets.data(), R, 5, lp.data(), tid.data(),
                                 tlp.data());
    }, 5);
    std::printf("R %3lld, top_n 5: logprobs_rows on the device %.1f us, download path %.1f us "
                "(%.1fx)\n", (long long)R, dev, host, host / dev);
    EXPECT_LT(dev, host) << "R " << R;
  }
}

}  // namespace
}  // namespace sala::test
