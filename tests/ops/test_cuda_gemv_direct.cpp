// The GEMVs' direct-load kernels (cuda_gemv_direct.cu: bf16, FP8; cuda_gemv_int4_direct.cu)
// against their ring kernels (cuda_gemv.cu, cuda_gemv_fp8.cu, cuda_gemv_int4.cu), both launched
// on the same weights:
//   CudaGemv.DirectMatchesRing, CudaInt4Gemv.DirectMatchesRing, CudaFp8Gemv.DirectMatchesRing
//                      every output bit-identical for M = 1..8, every depth, plain bf16, fp32
//                      outputs, 3 parts and silu_pair, over the model's shapes and odd ones (N
//                      not a multiple of 16; int4: groups of 256 and 640, short K; bf16 / FP8:
//                      K whose warp slices end inside a group of 16 chunks): the same
//                      arithmetic in the same order
//   CudaGemvDirect.BackendOptionSameBits
//                      BackendOptions::direct_gemv on and off give the same bits through the
//                      backend (linear, fp32 outputs, linear_silu_mul; bf16, FP8 and int4
//                      weights)
//   CudaGemv.DirectSpeed, CudaInt4Gemv.DirectSpeed, CudaFp8Gemv.DirectSpeed
//                      µs per GEMV of the 9B's projections at M = 1 and 8, the ring beside each
//                      depth, weights rotated over more than the L2; one decode step's GEMVs
// Without a GPU every test GTEST_SKIPs (cuda_test_util.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/fp8.h"
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

// The outputs of launch(o) for N weight rows and M x rows (every part's buffer, in order) as
// bytes. Buffers are pre-filled with 0xff so that a store past M or N, or a missing one, shows
// as a difference too.
std::vector<uint8_t> outputs(int64_t N, int M, Out out,
                             const std::function<void(const cuda::GemvOut&)>& launch) {
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
  launch(o);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> all;
  for (auto& y : ys) {
    const std::vector<uint8_t> h = y->bytes_back();
    all.insert(all.end(), h.begin(), h.end());
  }
  return all;
}

// Every output mode and M = 1..8 (big shapes: M = 1, 3, 8): ring(o) against direct(o, depth)
// for each depth in [d0, d1].
void expect_direct_matches_ring(
    const std::string& what, int64_t N, int64_t K, int d0, int d1,
    const std::function<void(const cuda::GemvOut&, int M)>& ring,
    const std::function<void(const cuda::GemvOut&, int M, int depth)>& direct) {
  for (Out out : {Out::kBf16, Out::kF32, Out::kParts, Out::kSiluPair}) {
    if (out == Out::kSiluPair && N % 64 != 0) continue;  // the ring's pairs of 32-row tiles
    for (int M = 1; M <= 8; ++M) {
      if (N * K > (int64_t(1) << 26) && M != 1 && M != 3 && M != 8) continue;
      const std::vector<uint8_t> r =
          outputs(N, M, out, [&](const cuda::GemvOut& o) { ring(o, M); });
      for (int depth = d0; depth <= d1; ++depth) {
        const std::vector<uint8_t> d =
            outputs(N, M, out, [&](const cuda::GemvOut& o) { direct(o, M, depth); });
        ASSERT_EQ(d.size(), r.size());
        EXPECT_EQ(std::memcmp(d.data(), r.data(), r.size()), 0)
            << what << " M=" << M << " " << out_name(out) << " depth " << depth;
      }
    }
  }
}

// One speed table: for each shape, weights(s) makes its weights (kept for the shape's rows) and
// returns their bytes; each variant v (0: the ring, then the direct kernel's depths) is timed
// at M = 1 and 8 by launch(v, i, M) (i picks the weight copy) and printed as a row with the
// GB/s of the best; last, one 9B decode step's GEMVs per variant at M = 1.
void speed_table(const char* tag, const std::vector<SpeedShape>& shapes,
                 const std::vector<std::string>& variants,
                 const std::function<int64_t(const SpeedShape&)>& weights,
                 const std::function<void(int v, int i, int M)>& launch) {
  std::printf("\n[ %s ] %-16s %3s", tag, "shape N x K", "M");
  for (const std::string& v : variants) std::printf(" %9s", v.c_str());
  std::printf("  (us; GB/s of the best)\n");
  std::vector<double> step(variants.size(), 0.0);
  for (const SpeedShape& s : shapes) {
    const int64_t bytes = weights(s);
    for (int M : {1, 8}) {
      std::vector<double> us;
      for (size_t v = 0; v < variants.size(); ++v)
        us.push_back(time_us([&](int i) { launch(int(v), i, M); }, 60));
      std::printf("[ %s ] %7lld x %-7lld %3d", tag, (long long)s.N, (long long)s.K, M);
      for (size_t v = 0; v < us.size(); ++v) {
        std::printf(" %9.2f", us[v]);
        if (M == 1) step[v] += us[v] * s.per_forward;
      }
      std::printf("  %6.0f\n", double(bytes) / *std::min_element(us.begin(), us.end()) / 1e3);
    }
  }
  std::printf("[ %s ] one decode step's GEMVs at M = 1, ms:", tag);
  for (size_t v = 0; v < variants.size(); ++v)
    std::printf(" %s %.3f", variants[v].c_str(), step[v] / 1e3);
  std::printf("\n");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
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
    const auto* xb = static_cast<const cuda::bf16*>(x.g.data);
    const auto* wd = static_cast<const uint32_t*>(w.data);
    expect_direct_matches_ring(
        shape("int4 direct vs ring", {s.N, s.K, s.group}), s.N, s.K, 2, 4,
        [&](const cuda::GemvOut& o, int M) {
          cuda::launch_gemv_int4(xb, s.K, wd, w.scales, s.N, int(s.K), w.group, M, o, 0,
                                 cuda::GemvKernel::kRing);
        },
        [&](const cuda::GemvOut& o, int M, int depth) {
          if (depth == cuda::kInt4DirectDepth)  // the dispatch's route to it
            cuda::launch_gemv_int4(xb, s.K, wd, w.scales, s.N, int(s.K), w.group, M, o, 0,
                                   cuda::GemvKernel::kDirect);
          else
            cuda::launch_gemv_int4_direct(xb, s.K, wd, w.scales, s.N, int(s.K), w.group, M, o,
                                          0, depth);
        });
  }
}

TEST(CudaInt4Gemv, DirectSpeed) {
  REQUIRE_GPU();
  if (!cuda::gemv_int4_supported(reinterpret_cast<void*>(uintptr_t(256)), 128, 128, 1))
    GTEST_SKIP() << "no int4 GEMV on this GPU";
  const HostMat hx = randn(8, 16384, 901, 1.f);
  DeviceBuf x(hx.bits.size() * 2), y(size_t(8) * 32768 * 2);
  cudaMemcpy(x.p, hx.bits.data(), x.bytes, cudaMemcpyHostToDevice);
  const auto* xb = static_cast<const cuda::bf16*>(x.p);
  std::unique_ptr<Int4SpeedWeights> sw;
  cuda::GemvOut o{};
  SpeedShape s{};
  speed_table(
      "gemv int4 direct", {std::begin(kShapes), std::end(kShapes)},
      {"ring", "depth 2", "depth 3", "depth 4"},
      [&](const SpeedShape& shape) {
        s = shape;
        sw.reset();  // one shape's copies at a time
        sw = std::make_unique<Int4SpeedWeights>(s.N, s.K);
        o.y[0] = y.p, o.end[0] = s.N, o.cols[0] = s.N, o.nparts = 1;
        return sw->packed + sw->scales;
      },
      [&](int v, int i, int M) {
        if (v == 0)
          cuda::launch_gemv_int4(xb, s.K, sw->words(i), sw->scale(i), s.N, int(s.K), 128, M, o,
                                 0, cuda::GemvKernel::kRing);
        else
          cuda::launch_gemv_int4_direct(xb, s.K, sw->words(i), sw->scale(i), s.N, int(s.K), 128,
                                        M, o, 0, v + 1);
      });
}

TEST(CudaGemv, DirectMatchesRing) {
  REQUIRE_GPU();
  uint32_t seed = 5400;
  // K = 520, 776: warp slices of 12 / 16 chunks, so groups of 16 chunks end inside a slice.
  for (auto [N, K] : {std::pair<int64_t, int64_t>{77, 520}, {1000, 2048}, {130, 776},
                      {192, 512}, {4096, 4096}, {32768, 4096}, {4096, 16384}, {96, 8}}) {
    const HostMat hw = randn(N, K, seed++, 1.f / 64.f), hx = activations(K, seed++, 8);
    DeviceBuf w(hw.bits.size() * 2), x(hx.bits.size() * 2);
    cudaMemcpy(w.p, hw.bits.data(), w.bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(x.p, hx.bits.data(), x.bytes, cudaMemcpyHostToDevice);
    const auto* xb = static_cast<const cuda::bf16*>(x.p);
    const auto* wb = static_cast<const cuda::bf16*>(w.p);
    expect_direct_matches_ring(
        shape("bf16 direct vs ring", {N, K}), N, K, 1, 2,
        [&](const cuda::GemvOut& o, int M) {
          cuda::launch_gemv(xb, K, wb, N, int(K), M, o, 0, cuda::GemvKernel::kRing);
        },
        [&](const cuda::GemvOut& o, int M, int depth) {
          if (depth == cuda::kGemvDirectDepth)  // the dispatch's route to it
            cuda::launch_gemv(xb, K, wb, N, int(K), M, o, 0, cuda::GemvKernel::kDirect);
          else
            cuda::launch_gemv_direct(xb, K, wb, N, int(K), M, o, 0, depth);
        });
  }
}

// The 9B's projections and lm_head (fp32 logits) in bf16, weights rotated over more than the L2.
TEST(CudaGemv, DirectSpeed) {
  REQUIRE_GPU();
  const HostMat hx = randn(8, 16384, 903, 1.f);
  DeviceBuf x(hx.bits.size() * 2), y(size_t(8) * 73448 * 4);
  cudaMemcpy(x.p, hx.bits.data(), x.bytes, cudaMemcpyHostToDevice);
  const auto* xb = static_cast<const cuda::bf16*>(x.p);
  std::vector<SpeedShape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back({73448, 4096, 1});  // lm_head
  std::unique_ptr<DeviceBuf> w;
  int64_t bytes = 0;
  int copies = 0;
  cuda::GemvOut o{};
  SpeedShape s{};
  speed_table(
      "gemv bf16 direct", shapes, {"ring", "depth 1", "depth 2"},
      [&](const SpeedShape& shape) {
        s = shape;
        bytes = s.N * s.K * 2;
        copies = int(std::max<int64_t>(2, (400ll << 20) / bytes + 1));
        w.reset();
        w = std::make_unique<DeviceBuf>(size_t(bytes) * size_t(copies));
        cudaMemset(w->p, 0x3c, w->bytes);  // bf16 0x3c3c ≈ 0.0115
        o.y[0] = y.p, o.end[0] = s.N, o.cols[0] = s.N, o.nparts = 1;
        o.f32 = s.N == 73448;
        return bytes;
      },
      [&](int v, int i, int M) {
        const auto* wi = reinterpret_cast<const cuda::bf16*>(static_cast<const uint8_t*>(w->p) +
                                                             (i % copies) * bytes);
        if (v == 0)
          cuda::launch_gemv(xb, s.K, wi, s.N, int(s.K), M, o, 0, cuda::GemvKernel::kRing);
        else
          cuda::launch_gemv_direct(xb, s.K, wi, s.N, int(s.K), M, o, 0, v);
      });
}

// Random e4m3 codes (NaN codes 0x7f / 0xff replaced by ±448), scales in [1e-3, 2e-3).
struct Fp8Weights {
  DeviceBuf codes, scales;
  Fp8Weights(int64_t N, int64_t K, uint32_t seed)
      : codes(size_t(N * K)), scales(size_t(N) * 4) {
    std::vector<uint8_t> c(size_t(N * K));
    uint32_t r = seed;
    for (uint8_t& v : c) {
      r = r * 1664525u + 1013904223u;
      v = uint8_t(r >> 24);
      if ((v & 0x7f) == 0x7f) v = uint8_t(v - 1);
    }
    std::vector<float> sc(static_cast<size_t>(N));
    for (float& v : sc) {
      r = r * 1664525u + 1013904223u;
      v = 1e-3f * (1.f + float(r >> 8) / 16777216.f);
    }
    cudaMemcpy(codes.p, c.data(), c.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(scales.p, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice);
  }
};

// x rows quantized on the device as GemmDispatch does (launch_quantize_rows_fp8).
struct Fp8Rows {
  DeviceBuf xq, sx;
  explicit Fp8Rows(const HostMat& x) : xq(size_t(x.rows * x.cols)), sx(size_t(x.rows) * 4) {
    DeviceBuf xb(x.bits.size() * 2);
    cudaMemcpy(xb.p, x.bits.data(), xb.bytes, cudaMemcpyHostToDevice);
    cuda::launch_quantize_rows_fp8(static_cast<const cuda::bf16*>(xb.p), x.rows, x.cols, x.cols,
                                   static_cast<uint8_t*>(xq.p), static_cast<float*>(sx.p), 0);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
};

TEST(CudaFp8Gemv, DirectMatchesRing) {
  REQUIRE_GPU();
  uint32_t seed = 5200;
  // K = 1040, 1552: warp slices of 12 / 16 chunks, so groups of 256 k end inside a slice.
  for (auto [N, K] : {std::pair<int64_t, int64_t>{77, 1040}, {1000, 2048}, {130, 1552},
                      {192, 512}, {4096, 4096}, {32768, 4096}, {4096, 16384}, {96, 16}}) {
    const Fp8Weights w(N, K, seed++);
    const Fp8Rows x(activations(K, seed++, 8));
    const auto* xq = static_cast<const uint8_t*>(x.xq.p);
    const auto* sx = static_cast<const float*>(x.sx.p);
    const auto* wq = static_cast<const uint8_t*>(w.codes.p);
    const auto* ws = static_cast<const float*>(w.scales.p);
    expect_direct_matches_ring(
        shape("fp8 direct vs ring", {N, K}), N, K, 1, 2,
        [&](const cuda::GemvOut& o, int M) {
          cuda::launch_gemv_fp8(xq, K, sx, wq, ws, N, int(K), M, o, 0, cuda::GemvKernel::kRing);
        },
        [&](const cuda::GemvOut& o, int M, int depth) {
          if (depth == cuda::kGemvDirectDepth)  // the dispatch's route to it
            cuda::launch_gemv_fp8(xq, K, sx, wq, ws, N, int(K), M, o, 0,
                                  cuda::GemvKernel::kDirect);
          else
            cuda::launch_gemv_fp8_direct(xq, K, sx, wq, ws, N, int(K), M, o, 0, depth);
        });
  }
}

TEST(CudaFp8Gemv, DirectSpeed) {
  REQUIRE_GPU();
  const Fp8Rows x(randn(8, 16384, 902, 1.f));
  DeviceBuf y(size_t(8) * 32768 * 2);
  const auto* xq = static_cast<const uint8_t*>(x.xq.p);
  const auto* sx = static_cast<const float*>(x.sx.p);
  std::unique_ptr<DeviceBuf> w, sc;
  int64_t bytes = 0;
  int copies = 0;
  cuda::GemvOut o{};
  SpeedShape s{};
  speed_table(
      "gemv fp8 direct", {std::begin(kShapes), std::end(kShapes)}, {"ring", "depth 1", "depth 2"},
      [&](const SpeedShape& shape) {
        s = shape;
        bytes = s.N * s.K;
        copies = int(std::max<int64_t>(2, (400ll << 20) / bytes + 1));
        w.reset();
        w = std::make_unique<DeviceBuf>(size_t(bytes) * size_t(copies));
        cudaMemset(w->p, 0x34, w->bytes);  // 0.75
        sc = std::make_unique<DeviceBuf>(size_t(s.N) * 4);
        std::vector<float> ones(size_t(s.N), 1e-3f);
        cudaMemcpy(sc->p, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice);
        o.y[0] = y.p, o.end[0] = s.N, o.cols[0] = s.N, o.nparts = 1;
        return bytes;
      },
      [&](int v, int i, int M) {
        const uint8_t* wi = static_cast<const uint8_t*>(w->p) + (i % copies) * bytes;
        const auto* ws = static_cast<const float*>(sc->p);
        if (v == 0)
          cuda::launch_gemv_fp8(xq, s.K, sx, wi, ws, s.N, int(s.K), M, o, 0,
                                cuda::GemvKernel::kRing);
        else
          cuda::launch_gemv_fp8_direct(xq, s.K, sx, wi, ws, s.N, int(s.K), M, o, 0, v);
      });
}

// BackendOptions::direct_gemv through GemmDispatch: linear (bf16 and fp32 outputs) and
// linear_silu_mul on bf16, FP8 and int4 weights give the same bits with the option on and off.
TEST(CudaGemvDirect, BackendOptionSameBits) {
  REQUIRE_GPU();
  BackendOptions on{NumericMode::BF16, 0};
  on.direct_gemv = true;
  auto ring = make_cuda_backend({NumericMode::BF16, 0}), direct = make_cuda_backend(on);
  const int64_t K = 4096, N = 2048;
  const HostMat hw = randn(N, K, 5300, 1.f / 64.f);
  TensorView v;
  v.name = "direct gemv test weight";
  v.dtype = DType::BF16;
  v.shape = {N, K};
  v.data = reinterpret_cast<const uint8_t*>(hw.bits.data());
  v.nbytes = hw.bits.size() * 2;
  const Int4Host q = weight(N, K, 128, 5301);
  const HostMat hx = activations(K, 5302, 8);
  auto x_of = [&](Backend& be) { return upload_checkpoint(be, DType::BF16, 8, K, hx.bits.data()); };
  const Tensor xr = x_of(*ring), xd = x_of(*direct);
  const std::pair<Weight, Weight> ws[] = {
      {Weight(upload_checkpoint(*ring, DType::BF16, N, K, hw.bits.data())),
       Weight(upload_checkpoint(*direct, DType::BF16, N, K, hw.bits.data()))},
      {ring->upload_linear(v, WeightFormat::FP8_E4M3),
       direct->upload_linear(v, WeightFormat::FP8_E4M3)},
      {upload_int4_host(*ring, q), upload_int4_host(*direct, q)}};
  for (const auto& [wr, wd] : ws)
    for (int64_t M = 1; M <= 8; ++M) {
      const std::string what = shape(weight_format_name(wr.format), {N, K, M});
      for (DType yt : {DType::BF16, DType::F32})
        EXPECT_EQ(run_linear(*ring, xr, wr, 0, M, yt), run_linear(*direct, xd, wd, 0, M, yt))
            << what << (yt == DType::F32 ? " f32" : " bf16");
      auto silu = [&](Backend& be, const Tensor& x, const Weight& w) {
        Tensor g = be.alloc(M, N / 2, DType::BF16), u = be.alloc(M, N / 2, DType::BF16);
        be.linear_silu_mul(x.slice_rows(0, M), w, g, u);
        std::vector<float> r(size_t(M * N / 2));
        be.download_f32(g, r.data());
        return r;
      };
      EXPECT_EQ(silu(*ring, xr, wr), silu(*direct, xd, wd)) << what << " silu_pair";
    }
}

}  // namespace
}  // namespace sala::test
