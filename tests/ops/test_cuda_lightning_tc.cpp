// The lightning layers' chunk kernels for calls of >= 64 tokens: bf16 mode's tensor-core
// kernel (cuda_lightning_seq_tc.cu) and fp32 mode's chunk-parallel kernels
// (cuda_lightning_chunk3.cu):
//   SplitEmulation  host only (runs without a GPU): x = hi + lo + lo2 in bf16 is exact for
//                   fp32 x, and an emulation of one chunk's ΔS and outputs (mma: 16 exact
//                   products added to the fp32 accumulator, truncated) against a double
//                   reference, next to the serial fmaf order: errors printed and bounded
//   MatchesCpu      bf16 mode against the CPU oracle, head dims 16/32/64/128, calls of 1..3000
//                   tokens, several sequences per step, carried states, decode after
//   Fp32Windows     fp32 mode the same way, with the default workspace and with one that
//                   forces windows of chunks and groups of sequences
//   Speed           us per call, nh 32, d 128, T 2048 and 8192; the timed calls repeat the
//                   first one's bits
// Without a GPU the GPU tests GTEST_SKIP (cuda_test_util.h).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace sala::test {
namespace {

// ---- host emulation ------------------------------------------------------------------------

// The kernel's split of an fp32 value into n bf16 terms (cuda_lightning_seq_tc.cu split3).
std::vector<float> split(float x, int n) {
  std::vector<float> t;
  float r = x;
  for (int u = 0; u < n; ++u) {
    t.push_back(round_bf16(r));
    r -= t.back();  // exact in fp32
  }
  return t;
}

// acc + s (s: an exact sum of products) rounded toward zero to fp32: a pessimistic model of
// the tensor core's fp32 accumulation (truncating alignment, Fasi et al. 2021).
float acc_rz(float acc, double s) {
  const double r = double(acc) + s;
  float f = float(r);
  if (std::abs(double(f)) > std::abs(r)) f = std::nextafter(f, 0.f);
  return f;
}

// sum_j a[j] b[j] over j in [0, n): serial fmaf (the CUDA-core kernels), or mma k-steps of
// 16 with `terms` bf16 terms of a (b is bf16), or double.
float dot_fma(const std::vector<float>& a, const std::vector<float>& b) {
  float acc = 0.f;
  for (size_t j = 0; j < a.size(); ++j) acc = std::fma(a[j], b[j], acc);
  return acc;
}
float dot_mma(const std::vector<float>& a, const std::vector<float>& b, int terms) {
  float acc = 0.f;
  for (size_t j0 = 0; j0 < a.size(); j0 += 16) {
    std::vector<std::vector<float>> t;
    for (size_t j = j0; j < j0 + 16 && j < a.size(); ++j) t.push_back(split(a[j], terms));
    for (int u = terms - 1; u >= 0; --u) {
      double s = 0;
      for (size_t j = j0; j < j0 + t.size(); ++j) s += double(t[j - j0][size_t(u)]) * b[j];
      acc = acc_rz(acc, s);
    }
  }
  return acc;
}
double dot_ref(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t j = 0; j < a.size(); ++j) s += double(a[j]) * b[j];
  return s;
}

struct Err {
  double num = 0, den = 0, max_abs = 0, max_ref = 0;
  void add(double e, double r) {
    num += (e - r) * (e - r), den += r * r;
    max_abs = std::max(max_abs, std::abs(e - r)), max_ref = std::max(max_ref, std::abs(r));
  }
  double rel_l2() const { return std::sqrt(num / den); }
  double rel_max() const { return max_abs / max_ref; }
};

TEST(CudaLightningTc, SplitEmulation) {
  // 1. Three terms are exact over the fp32 range the states and scores live in.
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> mant(0, (1u << 23) - 1);
  std::uniform_int_distribution<int> ex(-100, 100);
  int64_t inexact3 = 0;
  double worst2 = 0;
  for (int i = 0; i < 10'000'000; ++i) {
    const float x = std::ldexp(1.f + float(mant(rng)) * 0x1p-23f, ex(rng)) * (i % 2 ? -1.f : 1.f);
    const auto t = split(x, 3);
    if (double(t[0]) + double(t[1]) + double(t[2]) != double(x)) ++inexact3;
    worst2 = std::max(worst2, std::abs((double(t[0]) + t[1]) - x) / std::abs(double(x)));
  }
  std::printf("[ gla tc ] split of 1e7 fp32 values: 3 terms inexact %lld, 2 terms worst rel %.3g\n",
              (long long)inexact3, worst2);
  EXPECT_EQ(inexact3, 0);
  // 2. One chunk of 64 tokens, d = 128: ΔS = Σ_j k_jᵀ (λ^(63-j) v_j) and the outputs, errors
  //    against double with the same fp32 decay table and scores.
  constexpr int D = 128, C = 64;
  std::normal_distribution<float> nd(0.f, 1.f);
  auto bf = [&](float s) { return round_bf16(s * nd(rng)); };
  for (double slope : {0.84, 0.0625, 0.0039}) {  // fast / medium / slow heads of nh = 32
    std::vector<float> decay(65);
    for (int n = 0; n <= 64; ++n) decay[size_t(n)] = float(std::exp(-slope * n));
    const float scale = 1.f / std::sqrt(float(D));
    std::vector<std::vector<float>> q(C, std::vector<float>(D)), k = q, v = q;
    std::vector<std::vector<float>> S(D, std::vector<float>(D));  // incoming state, fp32
    for (int i = 0; i < C; ++i)
      for (int x = 0; x < D; ++x) q[size_t(i)][size_t(x)] = bf(1), k[size_t(i)][size_t(x)] = bf(1), v[size_t(i)][size_t(x)] = bf(1);
    for (auto& r : S)
      for (float& s : r) s = 4.f * nd(rng);
    Err dS[3], out[3];  // fma, mma 3 terms, mma 2 terms
    int64_t flips = 0, n_out = 0;
    for (int x = 0; x < D; ++x)
      for (int c = 0; c < D; ++c) {
        std::vector<float> a(C), b(C);
        for (int j = 0; j < C; ++j)
          a[size_t(j)] = v[size_t(j)][size_t(c)] * decay[size_t(C - 1 - j)], b[size_t(j)] = k[size_t(j)][size_t(x)];
        const double r = dot_ref(a, b);
        dS[0].add(dot_fma(a, b), r), dS[1].add(dot_mma(a, b, 3), r), dS[2].add(dot_mma(a, b, 2), r);
      }
    for (int i = 0; i < C; ++i) {
      // P[i][j] (fp32, as both kernels form it from their own q·k) and q_i S
      std::vector<float> pf(size_t(i + 1)), pm(size_t(i + 1));
      std::vector<double> pr(size_t(i + 1));
      for (int j = 0; j <= i; ++j) {
        pf[size_t(j)] = scale * dot_fma(q[size_t(i)], k[size_t(j)]) * decay[size_t(i - j)];
        pm[size_t(j)] = scale * dot_mma(q[size_t(i)], k[size_t(j)], 1) * decay[size_t(i - j)];
        pr[size_t(j)] = double(scale) * dot_ref(q[size_t(i)], k[size_t(j)]) * decay[size_t(i - j)];
      }
      for (int c = 0; c < D; ++c) {
        std::vector<float> sc(D), vc(size_t(i + 1));
        for (int x = 0; x < D; ++x) sc[size_t(x)] = S[size_t(x)][size_t(c)];
        for (int j = 0; j <= i; ++j) vc[size_t(j)] = v[size_t(j)][size_t(c)];
        const float f = scale * decay[size_t(i + 1)];
        double r = double(f) * dot_ref(q[size_t(i)], sc);
        for (int j = 0; j <= i; ++j) r += pr[size_t(j)] * vc[size_t(j)];
        float o[3];
        o[0] = dot_fma(q[size_t(i)], sc) * f;
        for (int j = 0; j <= i; ++j) o[0] = std::fma(pf[size_t(j)], vc[size_t(j)], o[0]);
        for (int u = 1; u < 3; ++u) {  // S and P in 3 (2) terms, q and v exact
          const int nt = u == 1 ? 3 : 2;
          float acc = 0.f;
          for (int x0 = 0; x0 < D; x0 += 16) {
            std::vector<float> qs(q[size_t(i)].begin() + x0, q[size_t(i)].begin() + x0 + 16);
            std::vector<float> ss(sc.begin() + x0, sc.begin() + x0 + 16);
            for (int t = nt - 1; t >= 0; --t) {
              double s = 0;
              for (int x = 0; x < 16; ++x) s += double(split(ss[size_t(x)], nt)[size_t(t)]) * qs[size_t(x)];
              acc = acc_rz(acc, s);
            }
          }
          acc *= f;
          std::vector<float> pv(pm.begin(), pm.end());
          pv.resize(size_t((i / 16 + 1) * 16), 0.f), vc.resize(pv.size(), 0.f);
          o[u] = acc;
          for (size_t j0 = 0; j0 < pv.size(); j0 += 16)
            for (int t = nt - 1; t >= 0; --t) {
              double s = 0;
              for (size_t j = j0; j < j0 + 16; ++j) s += double(split(pv[j], nt)[size_t(t)]) * vc[j];
              o[u] = acc_rz(o[u], s);
            }
          vc.resize(size_t(i + 1));
        }
        for (int u = 0; u < 3; ++u) out[u].add(o[u], r);
        flips += round_bf16(o[0]) != round_bf16(o[1]);
        ++n_out;
      }
    }
    std::printf("[ gla tc ] slope %.4f  dS rel_l2 / rel_max vs double: fma %.3g / %.3g, mma 3 terms "
                "%.3g / %.3g, 2 terms %.3g / %.3g\n",
                slope, dS[0].rel_l2(), dS[0].rel_max(), dS[1].rel_l2(), dS[1].rel_max(),
                dS[2].rel_l2(), dS[2].rel_max());
    std::printf("[ gla tc ]               o rel_l2 / rel_max vs double: fma %.3g / %.3g, mma 3 terms "
                "%.3g / %.3g, 2 terms %.3g / %.3g; bf16 o fma != mma3: %lld of %lld\n",
                out[0].rel_l2(), out[0].rel_max(), out[1].rel_l2(), out[1].rel_max(),
                out[2].rel_l2(), out[2].rel_max(), (long long)flips, (long long)n_out);
    // The 3-term products are exact: only the accumulation (truncating here) differs from
    // the serial fmaf chain, so the error stays at the fp32 level (fp32 ulp 6e-8).
    EXPECT_LE(dS[1].rel_l2(), std::max(4 * dS[0].rel_l2(), 1e-7));
    EXPECT_LE(dS[1].rel_max(), 1e-6);
    EXPECT_LE(out[1].rel_l2(), std::max(4 * out[0].rel_l2(), 1e-7));
    EXPECT_LE(out[1].rel_max(), 1e-6);
    EXPECT_LE(double(flips), 0.01 * double(n_out));
  }
}

// ---- GPU ------------------------------------------------------------------------------------

// Steps over 5 sequences (state slots in reverse order): first calls of 64..3000 tokens next
// to recurrent ones, continuations that read the carried states, decode rows (which read the
// final states of the chunk kernels), a subset in another order.
const std::vector<Calls>& tc_steps() {
  static const std::vector<Calls> steps = {
      {{0, 64}, {1, 3000}, {2, 65}, {3, 200}, {4, 1}},
      {{1, 130}, {0, 1000}, {3, 64}, {2, 5}, {4, 127}},
      {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}},
      {{4, 777}, {2, 64}, {1, 2}},
  };
  return steps;
}
constexpr int64_t kTcMaxLen = 4096;

BackendOptions tc_opts(int64_t ws_floats, NumericMode mode = NumericMode::BF16) {
  BackendOptions o{mode, 0};
  o.gla_workspace_floats = ws_floats;
  return o;
}

// GPU (in `mode`; fp32 mode's workspace of ws_floats, 0: default) against the CPU oracle, both
// layers of every step of tc_steps(), with the bounds of CudaOps.Lightning* for the mode.
void run_tc_vs_cpu(int nh, int d, NumericMode mode, int64_t ws_floats) {
  LayerHarness H(layer_config(16, 1, 16, nh, d, SparseConfig{}), 64, kTcMaxLen, 5, mode,
                 tc_opts(ws_floats, mode));
  const auto slopes = H.cfg.lightning_slopes();
  const float scale = float(H.cfg.lightning_scale);
  for (const auto& calls : tc_steps()) {
    std::vector<int64_t> past;
    for (auto [si, n] : calls) past.push_back(H.seqs[size_t(si)].len);
    StepMeta m = H.step(calls);
    H.p.begin(m);
    const int64_t T = m.num_tokens(), C = int64_t(nh) * d;
    for (int li = 0; li < 2; ++li) {
      auto q = H.p.up(randn(T, C, H.seed++)), k = H.p.up(randn(T, C, H.seed++)),
           v = H.p.up(randn(T, C, H.seed++));
      auto o = H.p.out(T, C);
      H.p.cpu->lightning_attention(li, q.c, k.c, v.c, slopes, scale, o.c);
      H.p.gpu->lightning_attention(li, q.g, k.g, v.g, slopes, scale, o.g);
      const Stat s = H.p.cmp(std::string(mode == NumericMode::BF16 ? "lightning tc" : "lightning fp32") +
                                 " nh" + std::to_string(nh) + " d" + std::to_string(d) +
                                 " ws" + std::to_string(ws_floats) + " L" + std::to_string(li) +
                                 " " + calls_str(calls, past),
                             o);
      if (mode == NumericMode::F32)
        expect_close(s, kF32RelL2, kF32RelMax);  // H200, session 27: rel L2 <= 3.5e-7, max 7.4e-7
      else
        expect_close(s, 4e-3, 1.6e-2);
    }
  }
}

TEST(CudaLightningTc, MatchesCpu) {
  REQUIRE_GPU();
  for (int d : {16, 32, 64, 128}) run_tc_vs_cpu(d == 128 ? 4 : 3, d, NumericMode::BF16, 0);
  run_tc_vs_cpu(32, 128, NumericMode::BF16, 0);  // the model's heads
}

TEST(CudaLightningTc, Fp32Windows) {
  REQUIRE_GPU();
  for (int d : {16, 32, 64, 128}) {
    const int nh = d == 128 ? 4 : 3;
    run_tc_vs_cpu(nh, d, NumericMode::F32, 0);
    // 2 states: groups of 2 sequences, windows of 1 chunk (3000 tokens: 47 windows)
    run_tc_vs_cpu(nh, d, NumericMode::F32, 2 * int64_t(nh) * d * d);
  }
  // the model's heads, windows of 4..20
  run_tc_vs_cpu(32, 128, NumericMode::F32, int64_t(32) * 128 * 128 * 20);
}

TEST(CudaLightningTc, Speed) {
  REQUIRE_GPU();
  constexpr int nh = 32, d = 128;
  const ModelConfig cfg = layer_config(16, 1, 16, nh, d, SparseConfig{});
  const auto slopes = cfg.lightning_slopes();
  const float scale = float(cfg.lightning_scale);
  for (int T : {2048, 8192}) {
    auto be = make_cuda_backend(tc_opts(0));
    CacheShape shape;
    shape.page_size = 64;
    shape.num_pages = T / 64;
    shape.num_slots = 1;
    be->init_caches(cfg, shape);
    std::vector<int32_t> pages(size_t(T / 64));
    for (size_t i = 0; i < pages.size(); ++i) pages[i] = int32_t(i);
    StepMeta m;
    std::vector<int32_t> ids(size_t(T), 9);
    m.add_seq(ids.data(), T, 0, 0, pages, false, false);
    be->begin_step(m);
    const int64_t C = int64_t(nh) * d;
    const Tensor q = upload_checkpoint(*be, DType::BF16, T, C, randn(T, C, 1).bits.data());
    const Tensor k = upload_checkpoint(*be, DType::BF16, T, C, randn(T, C, 2).bits.data());
    const Tensor v = upload_checkpoint(*be, DType::BF16, T, C, randn(T, C, 3).bits.data());
    Tensor o = be->alloc(T, C, DType::BF16);
    for (int i = 0; i < 3; ++i) be->lightning_attention(0, q, k, v, slopes, scale, o);
    be->synchronize();
    std::vector<float> first(size_t(T * C)), last(size_t(T * C));
    be->download_f32(o, first.data());  // a first call (no past state): the timed calls repeat it
    const int iters = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) be->lightning_attention(0, q, k, v, slopes, scale, o);
    be->synchronize();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    std::printf("[ gla tc ] T %5d nh %d d %d: %9.1f us per call\n", T, nh, d, us);
    be->download_f32(o, last.data());
    EXPECT_EQ(std::memcmp(first.data(), last.data(), first.size() * 4), 0)
        << "T " << T << ": the same call gave other bits";
  }
}

}  // namespace
}  // namespace sala::test
