// The CUDA backend's fused ops (part of the test_cuda_ops binary; harness: cuda_test_util.h).
// A fused op's contract is the composition it replaces (the Backend:: default): the CUDA
// fused result must equal the CUDA unfused one bit for bit, in bf16 and fp32 mode; each is
// also compared with the CPU backend (the oracle) within the bounds of the ops it fuses.
// Without a GPU the tests GTEST_SKIP; with SALA_REQUIRE_GPU=1 that is a failure.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "cuda_test_util.h"
#include "model/step.h"

namespace sala::test {
namespace {

// a and b (tensors of one backend) hold the same bits.
void expect_same_bits(Backend& be, const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  std::vector<float> x(size_t(a.numel())), y(size_t(b.numel()));
  be.download_f32(a, x.data());
  be.download_f32(b, y.data());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * 4)) << what << ": fused != unfused";
}

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
  for (const NumericMode mode : {NumericMode::BF16, NumericMode::F32})
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
            expect_same_bits(*p.gpu, o.g, o2.g, name);
            expect_bound(p.cmp(name, o));
            // In place, as the model calls it.
            p.cpu->rmsnorm_mul_sigmoid(x.c, w.c, eps, gc, x.c);
            p.gpu->rmsnorm_mul_sigmoid(x.g, w.g, eps, gg, x.g);
            p.gpu->Backend::rmsnorm_mul_sigmoid(xcopy.g, w.g, eps, gg, xcopy.g);
            expect_same_bits(*p.gpu, x.g, xcopy.g, name + " in place");
            expect_bound(p.cmp(name + " in place", x));
          }
    }
}

}  // namespace
}  // namespace sala::test
