// The CUDA backend's fused ops (part of the test_cuda_ops binary; harness: cuda_test_util.h).
// A fused op's contract is the composition it replaces (the Backend:: default): the CUDA
// fused result must equal the CUDA unfused one bit for bit, in bf16 and fp32 mode; each is
// also compared with the CPU backend (the oracle) within the bounds of the ops it fuses.
// Without a GPU the tests GTEST_SKIP; with SALA_REQUIRE_GPU=1 that is a failure.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"
#include "core/safetensors.h"
#include "cuda_test_util.h"
#include "backend/step.h"

namespace sala::test {
namespace {

constexpr NumericMode kModes[] = {NumericMode::BF16, NumericMode::F32};

// rows x cols starting `off` elements into t (a pointer that is not 16-byte aligned for off 1).
Tensor view(const Tensor& t, int64_t off, int64_t rows, int64_t cols) {
  return {static_cast<char*>(t.data) + size_t(off) * dtype_size(t.dtype), t.dtype, rows, cols};
}

// rmsnorm_mul_sigmoid over every rmsnorm kernel (warp: n <= 512; 16-byte vectors: bf16, n = 8
// · threads <= 8192; block: 1032, 12288, and 4096 / 8192 in fp32 mode), whole rows and
// per-head groups of 128, a gate that is 16-byte aligned or not, out apart from a or in place
// (as the model calls it).
TEST(CudaFused, RmsNormMulSigmoid) {
  REQUIRE_GPU();
  uint32_t seed = 700;
  for (const NumericMode mode : kModes)
    for (int64_t T : {1, 7, 33}) {
      const bool f32 = mode == NumericMode::F32;
      Pair p(mode);
      StepMeta m = rows_meta(int(T));
      p.begin(m);
      // Two uploads of the same values (the second: a copy for the unfused run in place).
      auto in2 = [&](int64_t r, int64_t c, float scale, float mean) {
        const uint32_t s = seed++;
        if (f32) {
          const HostMatF32 h = randn_f32(r, c, s, scale, mean);
          return std::make_pair(p.up(h), p.up(h));
        }
        const HostMat h = randn(r, c, s, scale, mean);
        return std::make_pair(p.up(h), p.up(h));
      };
      // rmsnorm's 2 ulps (two roundings after an fp32 sum in another order) can become 4 after
      // the product with the gate lands in a lower binade; mul_sigmoid's own ulp on top.
      auto expect_bound = [&](const Stat& s) {
        if (f32)
          expect_close(s, kF32RelL2, kF32RelMax);
        else
          expect_ulp(s, 4, 0.03);
      };
      const float eps = 1e-6f;
      for (int64_t cols : {256, 1032, 4096, 8192, 12288})
        for (int64_t n : {cols, int64_t(128)})
          for (int64_t goff : {0, 1}) {
            if (cols % n != 0) continue;
            const std::string name =
                std::string(f32 ? "fp32 " : "") + shape("rmsnorm_mul_sigmoid", {T, cols, n, goff});
            auto [x, xcopy] = in2(T, cols, 2.f, 0.f);
            const Pair::T2 w = in2(1, n, 0.2f, 1.f).first;
            const Pair::T2 gbuf = in2(1, T * cols + 1, 2.f, 0.f).first;
            const Tensor gc = view(gbuf.c, goff, T, cols), gg = view(gbuf.g, goff, T, cols);
            auto o = p.out(T, cols), o2 = p.out(T, cols);
            p.cpu->rmsnorm_mul_sigmoid(x.c, w.c, eps, gc, o.c);
            p.gpu->rmsnorm_mul_sigmoid(x.g, w.g, eps, gg, o.g);
            p.gpu->Backend::rmsnorm_mul_sigmoid(x.g, w.g, eps, gg, o2.g);
            expect_same_bits(*p.gpu, o.g, *p.gpu, o2.g, name);
            expect_bound(p.cmp(name, o));
            // In place, as the model calls it.
            p.cpu->rmsnorm_mul_sigmoid(x.c, w.c, eps, gc, x.c);
            p.gpu->rmsnorm_mul_sigmoid(x.g, w.g, eps, gg, x.g);
            p.gpu->Backend::rmsnorm_mul_sigmoid(xcopy.g, w.g, eps, gg, xcopy.g);
            expect_same_bits(*p.gpu, x.g, *p.gpu, xcopy.g, name + " in place");
            expect_bound(p.cmp(name + " in place", x));
          }
    }
}

// lightning_qk_attention with nh heads of head_dim d in `mode`: three backends step together
// through the same calls, each with its own state slots — the CPU (the default composition,
// the oracle), CUDA (fused: one kernel in steps of calls of < 64 tokens) and a second CUDA
// backend running the default (qk_norm_rope, then lightning_attention). The fused q, k (rotated
// in place) and o equal the unfused ones bit for bit at every step, so do the states (later
// steps read them); q, k and o are compared with the CPU at the lightning tests' rel L2 bound. Steps: first calls at position 0 and at 131000 / 524000 (past_len > 0 on a zero
// state), decode rows, a subset in another order, a step with a 64-token call (the default
// path on the fused backend too) and decode after it. A lightning-only model (no KV pool),
// one page of 2^20 tokens per sequence.
void run_lightning_qk(int nh, int d, NumericMode mode) {
  const bool f32 = mode == NumericMode::F32;
  ModelConfig cfg = layer_config(16, 1, 16, nh, d, SparseConfig{});
  cfg.num_hidden_layers = 2;
  cfg.mixer_types = {MixerType::Lightning, MixerType::Lightning};
  const CacheShape shape{1, 1 << 20, 4};
  Pair p(mode);
  std::unique_ptr<Backend> g2 = make_cuda_backend({mode, 0});
  for (Backend* be : {p.cpu.get(), p.gpu.get(), g2.get()}) be->init_caches(cfg, shape);
  const auto slopes = cfg.lightning_slopes();
  const float scale = float(cfg.lightning_scale), eps = 1e-6f;
  const double theta = 10000.0;
  std::vector<int64_t> len = {0, 0, 131000, 524000};
  const std::vector<Calls> steps = {
      {{0, 1}, {1, 5}, {2, 63}, {3, 2}},  // first calls
      {{0, 1}, {1, 1}, {2, 1}, {3, 1}},   // decode
      {{3, 1}, {1, 17}, {0, 1}},          // a subset, other order
      {{0, 1}, {2, 64}, {1, 1}},          // a chunked call: the default on every backend
      {{0, 1}, {1, 1}, {2, 1}, {3, 1}},   // decode after it
  };
  uint32_t seed = 900;
  // The same values on the three backends: {CPU, CUDA} and the second CUDA backend.
  auto in = [&](int64_t r, int64_t c, float sc, float mean) {
    const uint32_t s = seed++;
    if (f32) {
      const HostMatF32 h = randn_f32(r, c, s, sc, mean);
      return std::make_pair(p.up(h), upload_checkpoint(*g2, DType::F32, r, c, h.v.data()));
    }
    const HostMat h = randn(r, c, s, sc, mean);
    return std::make_pair(p.up(h), upload_checkpoint(*g2, DType::BF16, r, c, h.bits.data()));
  };
  for (const Calls& calls : steps) {
    StepMeta m;
    std::vector<int64_t> past;
    for (auto [si, n] : calls) {
      const std::vector<int32_t> ids(size_t(n), 9);
      past.push_back(len[size_t(si)]);
      m.add_seq(ids.data(), n, len[size_t(si)], si, {0}, false, false);
      len[size_t(si)] += n;
    }
    p.begin(m);
    g2->begin_step(m);
    const int64_t T = m.num_tokens(), C = int64_t(nh) * d;
    for (int li = 0; li < 2; ++li) {
      auto [q, q2] = in(T, C, 2.f, 0.f);
      auto [k, k2] = in(T, C, 1.f, 0.f);
      auto [v, v2] = in(T, C, 1.f, 0.f);
      auto [qn, qn2] = in(1, d, 0.2f, 1.f);
      auto [kn, kn2] = in(1, d, 0.2f, 1.f);
      auto o = p.out(T, C);
      Tensor o2 = g2->alloc(T, C, g2->act_dtype());
      p.cpu->lightning_qk_attention(li, q.c, k.c, v.c, qn.c, kn.c, eps, d, theta, slopes, scale,
                                    o.c);
      p.gpu->lightning_qk_attention(li, q.g, k.g, v.g, qn.g, kn.g, eps, d, theta, slopes, scale,
                                    o.g);
      g2->Backend::lightning_qk_attention(li, q2, k2, v2, qn2, kn2, eps, d, theta, slopes, scale,
                                          o2);
      const std::string name = std::string(f32 ? "fp32 " : "") + "lightning_qk nh" +
                               std::to_string(nh) + " d" + std::to_string(d) + " L" +
                               std::to_string(li) + " " + calls_str(calls, past);
      expect_same_bits(*p.gpu, q.g, *g2, q2, name + " q");
      expect_same_bits(*p.gpu, k.g, *g2, k2, name + " k");
      expect_same_bits(*p.gpu, o.g, *g2, o2, name + " o");
      for (const Stat& s : {p.cmp(name + " q", q), p.cmp(name + " k", k)}) {
        if (f32)
          expect_close(s, kF32RelL2, kF32RelMax);
        else  // not QkNormRope's 1 ulp: over these many rows (positions to 524K) an fp32 ulp of
              // inv flips bf16(x * inv) somewhere, and RoPE carries that ulp of a value ~2 into
              // a smaller output, several of its ulps: hence the GEMM-style bound
          expect_close(s, 4e-3, 1.6e-2);
      }
      const Stat so = p.cmp(name + " o", o);
      if (f32)
        expect_close(so, kF32RelL2, kF32RelMax);
      else
        expect_close(so, 4e-3, 1.6e-2);  // as the lightning tests
    }
  }
}

TEST(CudaFused, LightningQkAttentionHead16) {
  REQUIRE_GPU();
  for (const NumericMode mode : kModes) run_lightning_qk(4, 16, mode);
}
TEST(CudaFused, LightningQkAttentionHead32) {
  REQUIRE_GPU();
  for (const NumericMode mode : kModes) run_lightning_qk(3, 32, mode);
}
TEST(CudaFused, LightningQkAttentionHead64) {
  REQUIRE_GPU();
  for (const NumericMode mode : kModes) run_lightning_qk(2, 64, mode);
}
TEST(CudaFused, LightningQkAttentionHead128) {
  REQUIRE_GPU();
  for (const NumericMode mode : kModes) run_lightning_qk(3, 128, mode);
}

}  // namespace
}  // namespace sala::test
