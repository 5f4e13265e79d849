// The int4 GEMV's direct-load kernel (cuda_gemv_int4_direct.cu) against the ring kernel
// (cuda_gemv_int4.cu), both launched on the same uploaded weight:
//   DirectMatchesRing  every output bit-identical for M = 1..8, every depth (2..4), plain
//                      bf16, fp32 outputs, 3 parts and silu_pair, over the model's shapes and
//                      odd ones (N not a multiple of 16, groups of 256 and 640, short K): the
//                      two kernels do the same arithmetic in the same order
//   DirectSpeed        µs per GEMV of the 9B's projections at M = 1 and 8, the ring beside each
//                      depth, weights rotated over more than the L2; one decode step's GEMVs
// Without a GPU every test GTEST_SKIPs (cuda_test_util.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/int4.h"
#include "cuda_test_util.h"
#include "int4_test_util.h"

namespace sala::test {
namespace {

struct DeviceBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuf(size_t n) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess);
    cudaMemset(p, 0, n);
  }
  ~DeviceBuf() { cudaFree(p); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  std::vector<uint8_t> bytes_back() const {
    std::vector<uint8_t> h(bytes);
    cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
    return h;
  }
};

enum class Out { kBf16, kF32, kParts, kSiluPair };

const char* out_name(Out o) {
  switch (o) {
    case Out::kBf16: return "bf16";
    case Out::kF32: return "f32";
    case Out::kParts: return "3 parts";
    case Out::kSiluPair: return "silu_pair";
  }
  return "?";
}

// The outputs of one launch (every part's buffer, in order) as bytes. Buffers are pre-filled
// with 0xff so that a store past M or N, or a missing one, shows as a difference too.
std::vector<uint8_t> run(const Weight& w, const void* x, int64_t K, int M, Out out,
                         cuda::Int4GemvKernel kernel, int depth) {
  const int64_t N = w.rows;
  cuda::GemvOut o{};
  std::vector<int64_t> cols;
  if (out == Out::kParts) cols = {N / 3, N / 2 - N / 3 + 1, N - N / 2 - 1};
  else cols = {out == Out::kSiluPair ? N / 2 : N};
  std::vector<std::unique_ptr<DeviceBuf>> ys;
  int64_t end = 0;
  for (size_t i = 0; i < cols.size(); ++i) {
    const size_t elem = out == Out::kF32 ? 4 : 2;
    ys.push_back(std::make_unique<DeviceBuf>(size_t(M * cols[i]) * elem));
    cudaMemset(ys.back()->p, 0xff, ys.back()->bytes);
    end += cols[i];
    o.y[i] = ys.back()->p, o.end[i] = end, o.cols[i] = cols[i];
  }
  o.nparts = int(cols.size());
  o.f32 = out == Out::kF32;
  o.silu_pair = out == Out::kSiluPair;
  const auto* xb = static_cast<const cuda::bf16*>(x);
  const auto* wd = static_cast<const uint32_t*>(w.data);
  if (kernel == cuda::Int4GemvKernel::kDirect && depth != cuda::kInt4DirectDepth)
    cuda::launch_gemv_int4_direct(xb, K, wd, w.scales, N, int(K), w.group, M, o, 0, depth);
  else  // the dispatch's route to each kernel
    cuda::launch_gemv_int4(xb, K, wd, w.scales, N, int(K), w.group, M, o, 0, kernel);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> all;
  for (auto& y : ys) {
    const std::vector<uint8_t> h = y->bytes_back();
    all.insert(all.end(), h.begin(), h.end());
  }
  return all;
}

TEST(CudaInt4Gemv, DirectMatchesRing) {
  REQUIRE_GPU();
  if (!cuda::gemv_int4_supported(reinterpret_cast<void*>(uintptr_t(256)), 128, 128, 1))
    GTEST_SKIP() << "no int4 GEMV on this GPU (the dequantized path runs instead)";
  Pair p;
  struct S {
    int64_t N, K;
    int32_t group;
  };
  uint32_t seed = 5100;
  for (S s : {S{77, 1024, 128}, S{1000, 2048, 128}, S{130, 384, 128}, S{96, 512, 256},
              S{100, 640, 640}, S{4096, 4096, 128}, S{32768, 4096, 128}, S{4096, 16384, 128},
              S{160, 128, 128}, S{192, 512, 128}}) {
    const Int4Host q = weight(s.N, s.K, s.group, seed++);
    const Weight w = upload_int4_host(*p.gpu, q);
    const HostMat hx = activations(s.K, seed++, 8);
    auto x = p.up(hx);
    for (Out out : {Out::kBf16, Out::kF32, Out::kParts, Out::kSiluPair}) {
      if (out == Out::kSiluPair && s.N % 64 != 0) continue;  // the ring's pairs of 32-row tiles
      if (out == Out::kParts && s.N < 3) continue;
      for (int M = 1; M <= cuda::kInt4DirectMaxRows; ++M) {
        if (s.N * s.K > (int64_t(1) << 26) && M != 1 && M != 3 && M != 8) continue;
        const std::vector<uint8_t> ring =
            run(w, x.g.data, s.K, M, out, cuda::Int4GemvKernel::kRing, 0);
        for (int depth = 2; depth <= 4; ++depth) {
          const std::vector<uint8_t> direct =
              run(w, x.g.data, s.K, M, out, cuda::Int4GemvKernel::kDirect, depth);
          ASSERT_EQ(direct.size(), ring.size());
          EXPECT_EQ(std::memcmp(direct.data(), ring.data(), ring.size()), 0)
              << shape("int4 direct vs ring", {s.N, s.K, s.group, M}) << " " << out_name(out)
              << " depth " << depth;
        }
      }
    }
  }
}

TEST(CudaInt4Gemv, DirectSpeed) {
  REQUIRE_GPU();
  if (!cuda::gemv_int4_supported(reinterpret_cast<void*>(uintptr_t(256)), 128, 128, 1))
    GTEST_SKIP() << "no int4 GEMV on this GPU";
  std::printf("\n[ gemv int4 direct ] %-16s %3s %9s %9s %9s %9s  (us; GB/s of the best)\n",
              "shape N x K", "M", "ring", "depth 2", "depth 3", "depth 4");
  const HostMat hx = randn(8, 16384, 901, 1.f);
  DeviceBuf x(hx.bits.size() * 2), y(size_t(8) * 32768 * 2);
  cudaMemcpy(x.p, hx.bits.data(), x.bytes, cudaMemcpyHostToDevice);
  double step[4] = {};
  for (const SpeedShape s : kShapes) {
    const Int4SpeedWeights sw(s.N, s.K);
    cuda::GemvOut o{};
    o.y[0] = y.p, o.end[0] = s.N, o.cols[0] = s.N, o.nparts = 1;
    for (int M : {1, 8}) {
      double us[4];
      for (int v = 0; v < 4; ++v)
        us[v] = time_us(
            [&](int i) {
              const auto* xb = static_cast<const cuda::bf16*>(x.p);
              if (v == 0)
                cuda::launch_gemv_int4(xb, s.K, sw.words(i), sw.scale(i), s.N, int(s.K), 128, M,
                                       o, 0, cuda::Int4GemvKernel::kRing);
              else
                cuda::launch_gemv_int4_direct(xb, s.K, sw.words(i), sw.scale(i), s.N, int(s.K),
                                              128, M, o, 0, v + 1);
            },
            60);
      if (M == 1)
        for (int v = 0; v < 4; ++v) step[v] += us[v] * s.per_forward;
      const double best = std::min({us[0], us[1], us[2], us[3]});
      std::printf("[ gemv int4 direct ] %7lld x %-7lld %3d %9.2f %9.2f %9.2f %9.2f  %6.0f\n",
                  (long long)s.N, (long long)s.K, M, us[0], us[1], us[2], us[3],
                  double(sw.packed + sw.scales) / best / 1e3);
    }
  }
  std::printf("[ gemv int4 direct ] 9B projections at M = 1, one decode step, ms: ring %.3f, "
              "depth 2 %.3f, depth 3 %.3f, depth 4 %.3f\n",
              step[0] / 1e3, step[1] / 1e3, step[2] / 1e3, step[3] / 1e3);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace sala::test
