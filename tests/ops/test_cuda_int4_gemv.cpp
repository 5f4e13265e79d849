// W4A16 on the GPU (cuda_gemv_int4.cu, GemmDispatch::linear_int4 in cuda_gemm_int4.cpp)
// against its CPU oracle, CpuBackend::linear_int4 (cpu_int4.cpp), both fed the same
// pack-quantized codes and scales through upload_int4 (the GPU repacks them at upload):
//   MatchesCpu       the model's shapes (4096 x 4096, 12288 x 4096, 32768 x 4096 gate_up, 4096
//                    x 16384) and odd ones, M = 1..64 (the int4 GEMV: exact products, fp32 sums,
//                    one bf16 rounding: at most 1-2 ulp on a few % of outputs) and prefill row
//                    counts (dequantized to bf16 + cuBLASLt: the GEMM contract), groups 128,
//                    256, per channel, and 64 / K % 128 != 0 (no GEMV: the dequantized path)
//   OutputModes      linear_multi parts (up to 4, split inside the 32-row tiles), fp32 logits,
//                    linear_silu_mul (the GEMV's silu_pair) against the CPU's composition
//   RowInvariance    every row of M = 2..64 bit-identical to the row alone (plain, fp32, parts,
//                    silu_pair): what the speculative verify path relies on
//   WideDecodeSteps  decode-only steps of 100 / 256 rows (runs of 64): rows independent of the
//                    step's other rows
//   Fp32Mode         fp32 mode (exact dequantization to fp32 + cuBLASLt fp32) at the fp32 level
//   MixedFormats     int4, FP8 and bf16 weights on one backend, each through GemmDispatch
//   UploadErrors     malformed codes / scales: sala::Error naming the tensor
//   Speed            the GEMV at M = 1, 8, 16, 64: us and GB/s of packed + scale bytes
//   DequantSpeed     the prefill path's dequantization per shape and per 9B forward
// Without a GPU every test GTEST_SKIPs (cuda_test_util.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/step.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/error.h"
#include "core/int4.h"
#include "cuda_test_util.h"
#include "int4_test_util.h"

namespace sala::test {
namespace {

TEST(CudaInt4Gemv, MatchesCpu) {
  REQUIRE_GPU();
  struct S {
    int64_t N, K;
    int32_t group;
    bool all_m;
  };
  uint32_t seed = 4400;
  for (S s : {S{77, 1024, 128, true}, S{1000, 2048, 128, true}, S{130, 384, 128, true},
              S{96, 512, 256, true}, S{100, 640, 640, false}, S{64, 200, 40, false},
              S{70, 512, 64, false}, S{4096, 4096, 128, true}, S{12288, 4096, 128, false},
              S{32768, 4096, 128, false}, S{4096, 16384, 128, false}}) {
    Pair p;
    const Int4Host q = weight(s.N, s.K, s.group, seed++);
    const Weight wc = upload_int4_host(*p.cpu, q), wg = upload_int4_host(*p.gpu, q);
    const HostMat hx = activations(s.K, seed++);
    const bool gemv = cuda::gemv_int4_supported(wg.data, s.K, s.group, 1);
    EXPECT_EQ(gemv, s.K % 128 == 0 && s.group % 128 == 0) << s.N << " x " << s.K;
    std::vector<int64_t> ms;
    if (s.all_m) {
      for (int64_t m = 1; m <= 17; ++m) ms.push_back(m);
      for (int64_t m : {24, 31, 32, 33, 40, 47, 48, 57, 63, 64}) ms.push_back(m);
    } else {
      ms = {1, 2, 9, 16, 17, 33, 40, 64};
    }
    ms.push_back(65);  // prefill rows: dequantized + cuBLASLt
    ms.push_back(s.N > 8192 ? 160 : 300);
    for (int64_t M : ms) {
      const HostMat x = M <= kRowsMax ? hx : randn(M, s.K, seed++, 1.f);
      auto xt = p.up(x);
      const std::string name = shape("int4 linear", {s.N, s.K, s.group, M});
      expect_int4_close(name, run_linear(*p.gpu, xt.g, wg, 0, M, DType::BF16),
                        run_linear(*p.cpu, xt.c, wc, 0, M, DType::F32), M, s.N,
                        gemv && M <= kRowsMax, 1);
    }
  }
}

TEST(CudaInt4Gemv, OutputModes) {
  REQUIRE_GPU();
  uint32_t seed = 4500;
  Pair p;
  const int64_t K = 2048;
  const HostMat hx = activations(K, seed++, 100);  // M = 100 below: the dequantized path
  auto xt = p.up(hx);
  const Int4Host q = weight(2048, K, 128, seed++);
  const Weight wc = upload_int4_host(*p.cpu, q), wg = upload_int4_host(*p.gpu, q);
  const std::vector<int64_t> cols = {1000, 77, 531, 440};
  for (int64_t M : {1, 5, 8, 12, 16, 24, 40, 64, 100}) {
    for (size_t np : {size_t(1), size_t(2), size_t(4)}) {
      std::vector<int64_t> pc(cols.begin(), cols.begin() + np);
      for (size_t i = np; i < cols.size(); ++i) pc.back() += cols[i];
      std::vector<Pair::T2> ys;
      std::vector<Tensor*> yg, yc;
      for (int64_t c : pc) ys.push_back(p.out(M, c));
      for (auto& t : ys) yg.push_back(&t.g), yc.push_back(&t.c);
      p.gpu->linear_multi(xt.g.slice_rows(0, M), wg, yg);
      p.cpu->linear_multi(xt.c.slice_rows(0, M), wc, yc);
      for (size_t i = 0; i < ys.size(); ++i) {
        auto [c, g] = p.download(ys[i]);
        expect_int4_close(shape(("int4 parts=" + std::to_string(np)).c_str(), {M, pc[i]}), g, c,
                          M, pc[i], M <= kRowsMax, 1);
      }
    }
    expect_int4_close(shape("int4 f32 out", {M, 2048}),
                      run_linear(*p.gpu, xt.g, wg, 0, M, DType::F32),
                      run_linear(*p.cpu, xt.c, wc, 0, M, DType::F32), M, 2048, M <= kRowsMax, 1);
  }
  // silu_pair: [gate; up] stacked; bf16(bf16(silu(g)) · u) against linear_multi + silu_mul.
  for (int64_t I : {int64_t(1024), int64_t(16384)}) {
    const int64_t Kg = 4096;
    const Int4Host qg = weight(2 * I, Kg, 128, seed++);
    const Weight gc = upload_int4_host(*p.cpu, qg), gg = upload_int4_host(*p.gpu, qg);
    auto xg = p.up(activations(Kg, seed++));
    for (int64_t M : {1, 7, 16, 33, 64}) {
      if (I > 1024 && (M == 7 || M == 33)) continue;
      auto g = p.out(M, I), u = p.out(M, I);
      p.gpu->linear_silu_mul(xg.g.slice_rows(0, M), gg, g.g, u.g);
      p.cpu->linear_silu_mul(xg.c.slice_rows(0, M), gc, g.c, u.c);
      auto [c, e] = p.download(g);
      expect_int4_close(shape("int4 silu_pair", {M, Kg, I}), e, c, M, I, true, 2);
    }
  }
}

// Row r alone (M = 1, x offset by r rows) and as row r of M = 2..64 give the same bits.
TEST(CudaInt4Gemv, RowInvariance) {
  REQUIRE_GPU();
  Pair p;
  uint32_t seed = 4600;
  const int64_t kMs[] = {2, 3, 5, 8, 9, 11, 16, 17, 24, 31, 32, 33, 40, 57, 64};
  auto check = [&](const std::string& what, int64_t cols,
                   const std::function<std::vector<float>(int64_t, int64_t)>& run) {
    std::vector<std::vector<float>> alone(kRowsMax);
    for (int64_t r = 0; r < kRowsMax; ++r) alone[size_t(r)] = run(r, 1);
    for (int64_t M : kMs) {
      const std::vector<float> got = run(0, M);
      int bad = 0;
      for (int64_t r = 0; r < M; ++r)
        if (std::memcmp(alone[size_t(r)].data(), got.data() + r * cols, size_t(cols) * 4) != 0 &&
            bad++ < 4)
          ADD_FAILURE() << what << ": row " << r << " at M=" << M << " differs from the row alone";
      EXPECT_EQ(bad, 0) << what << " M=" << M;
    }
  };
  for (auto [N, K] : {std::pair<int64_t, int64_t>{1024, 4096}, {512, 16384}, {77, 1024}}) {
    const Int4Host q = weight(N, K, 128, seed++);
    const Weight w = upload_int4_host(*p.gpu, q);
    auto x = p.up(activations(K, seed++));
    for (DType yt : {DType::BF16, DType::F32})
      check(shape(yt == DType::F32 ? "int4 rows f32" : "int4 rows", {N, K}), N,
            [&](int64_t r0, int64_t M) { return run_linear(*p.gpu, x.g, w, r0, M, yt); });
    const std::vector<int64_t> parts = {N / 2 - 13, 26, N - N / 2 - 13};
    check(shape("int4 rows parts", {N, K}), N, [&](int64_t r0, int64_t M) {
      std::vector<Tensor> ys;
      std::vector<Tensor*> yp;
      for (int64_t c : parts) ys.push_back(p.gpu->alloc(M, c, DType::BF16));
      for (Tensor& t : ys) yp.push_back(&t);
      p.gpu->linear_multi(x.g.slice_rows(r0, M), w, yp);
      std::vector<float> r(size_t(M * N));
      int64_t c0 = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        std::vector<float> h(size_t(M * parts[i]));
        p.gpu->download_f32(ys[i], h.data());
        for (int64_t m = 0; m < M; ++m)
          std::copy_n(h.begin() + m * parts[i], parts[i], r.begin() + m * N + c0);
        c0 += parts[i];
      }
      return r;
    });
    if (N % 64 == 0)
      check(shape("int4 rows silu_pair", {N, K}), N / 2, [&](int64_t r0, int64_t M) {
        Tensor g = p.gpu->alloc(M, N / 2, DType::BF16), u = p.gpu->alloc(M, N / 2, DType::BF16);
        p.gpu->linear_silu_mul(x.g.slice_rows(r0, M), w, g, u);
        std::vector<float> r(size_t(M * N / 2));
        p.gpu->download_f32(g, r.data());
        return r;
      });
  }
}

TEST(CudaInt4Gemv, Fp32Mode) {
  REQUIRE_GPU();
  Pair p(NumericMode::F32);
  uint32_t seed = 4700;
  for (auto [N, K, group] : {std::tuple<int64_t, int64_t, int32_t>{300, 1024, 128},
                             {64, 200, 40}, {2048, 4096, 128}}) {
    const Int4Host q = weight(N, K, group, seed++);
    const Weight wc = upload_int4_host(*p.cpu, q), wg = upload_int4_host(*p.gpu, q);
    for (int64_t M : {1, 16, 64, 130}) {
      auto x = p.up(randn_f32(M, K, seed++, 1.f));
      const Stat st = compare(shape("int4 fp32 mode", {N, K, M}),
                              run_linear(*p.gpu, x.g, wg, 0, M, DType::F32),
                              run_linear(*p.cpu, x.c, wc, 0, M, DType::F32));
      expect_close(st, kF32RelL2, kF32RelMax);
    }
  }
}

// A mixed plan's three formats on one backend, each through GemmDispatch by what the weight is.
TEST(CudaInt4Gemv, MixedFormats) {
  REQUIRE_GPU();
  Pair p;
  uint32_t seed = 4800;
  const int64_t K = 4096, N = 1024;
  const HostMat h4 = randn(N, K, seed++, 1.f / 64.f), h8 = randn(N, K, seed++, 1.f / 64.f);
  const Int4Host q = int4_rtn(h4, 128);
  TensorView v8;
  v8.name = "fp8 weight";
  v8.dtype = DType::BF16;
  v8.shape = {N, K};
  v8.data = reinterpret_cast<const uint8_t*>(h8.bits.data());
  v8.nbytes = h8.bits.size() * 2;
  auto dense = p.up(randn(N, K, seed++, 1.f / 64.f));
  const std::pair<Weight, Weight> ws[] = {
      {upload_int4_host(*p.cpu, q), upload_int4_host(*p.gpu, q)},
      {p.cpu->upload_linear(v8, WeightFormat::FP8_E4M3),
       p.gpu->upload_linear(v8, WeightFormat::FP8_E4M3)},
      {Weight(dense.c), Weight(dense.g)}};
  for (int64_t M : {1, 8, 64, 200}) {
    auto x = p.up(randn(M, K, seed++, 1.f));
    for (const auto& [wc, wg] : ws)
      expect_close(compare(shape((std::string("mixed ") + weight_format_name(wg.format)).c_str(),
                                 {N, K, M}),
                           run_linear(*p.gpu, x.g, wg, 0, M, DType::BF16),
                           run_linear(*p.cpu, x.c, wc, 0, M, DType::F32)),
                   4e-3, 1.6e-2);
  }
}

// Decode-only steps of 65..256 rows run in runs of 64 rows (on Hopper the W4A16 skinny GEMM,
// else the GEMV): every row of a 100-row step equals the same row in a 256-row step, bit for
// bit (a row's bits do not depend on the step's other rows), and stays close to the CPU.
TEST(CudaInt4Gemv, WideDecodeSteps) {
  REQUIRE_GPU();
  Pair p;
  const int64_t K = 4096, N = 1536;
  const Int4Host q = weight(N, K, 128, 4900);
  const Weight wc = upload_int4_host(*p.cpu, q), wg = upload_int4_host(*p.gpu, q);
  auto x = p.up(randn(256, K, 4901, 1.f));
  std::vector<float> wide;
  for (int32_t B : {256, 100}) {
    p.begin_decode_step(B);
    const std::vector<float> step = run_linear(*p.gpu, x.g, wg, 0, B, DType::BF16);
    expect_int4_close(shape("int4 wide decode step", {B, K, N}), step,
                      run_linear(*p.cpu, x.c, wc, 0, B, DType::F32), B, N, true, 2);
    if (wide.empty()) {
      wide = step;
      continue;
    }
    int bad = 0;
    for (int32_t r = 0; r < B; ++r)
      if (std::memcmp(wide.data() + int64_t(r) * N, step.data() + int64_t(r) * N,
                      size_t(N) * 4) != 0 &&
          bad++ < 4)
        ADD_FAILURE() << "row " << r << " of a " << B << "-row decode step differs from the "
                      << "same row in a 256-row step";
    EXPECT_EQ(bad, 0) << "decode step of " << B << " rows";
  }
}

// A malformed W4A16 tensor is a sala::Error naming it, never a crash.
TEST(CudaInt4Gemv, UploadErrors) {
  REQUIRE_GPU();
  auto gpu = make_cuda_backend({NumericMode::BF16, 0});
  const Int4Host q = int4_rtn(randn(64, 256, 5000, 1.f), 128);
  auto expect_error = [&](Int4Host bad, DType dt, const char* what) {
    TensorView v;
    v.name = "model.layers.0.mlp.down_proj.weight_packed";
    v.dtype = dt;
    v.shape = {bad.rows, bad.cols / kInt4PerWord};
    v.data = reinterpret_cast<const uint8_t*>(bad.words.data());
    v.nbytes = bad.words.size() * 4;
    try {
      gpu->upload_int4(v, bad.scales, bad.group);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("down_proj.weight_packed"), std::string::npos)
          << what << ": " << e.what();
    }
  };
  Int4Host few = q;
  few.scales.pop_back();
  expect_error(few, DType::I32, "one scale missing");
  Int4Host odd = q;
  odd.group = 96;  // does not divide 256
  expect_error(odd, DType::I32, "group 96");
  expect_error(q, DType::F32, "F32 words");
}

// Packed weights rotated over more than the L2 (random codes; scales 1e-3); bf16 output.
TEST(CudaInt4Gemv, Speed) {
  REQUIRE_GPU();
  std::printf("\n[ gemv int4 ] %-22s %4s %10s %12s %12s  %s\n", "shape N x K", "M", "us",
              "GB/s packed", "GB/s +scales", "output bits");
  const HostMat hx = randn(kRowsMax, 16384, 899, 1.f);
  void *x = nullptr, *y = nullptr;
  cudaMalloc(&x, hx.bits.size() * 2);
  cudaMemcpy(x, hx.bits.data(), hx.bits.size() * 2, cudaMemcpyHostToDevice);
  cudaMalloc(&y, size_t(kRowsMax) * 32768 * 2);
  double step_us = 0;
  for (const SpeedShape s : kShapes) {
    const Int4SpeedWeights sw(s.N, s.K);
    cuda::GemvOut o{};
    o.y[0] = y, o.end[0] = s.N, o.cols[0] = s.N, o.nparts = 1;
    for (int M : {1, 8, 16, 64}) {
      const double us = time_us(
          [&](int i) {
            cuda::launch_gemv_int4(static_cast<const cuda::bf16*>(x), s.K, sw.words(i),
                                   sw.scale(i), s.N, int(s.K), 128, M, o, 0);
          },
          60);
      if (M == 1) step_us += us * s.per_forward;
      // The output bits of copy 0 (FNV-1a of the bf16 outputs): equal across builds whose
      // kernels do the same arithmetic, so an A/B run shows whether a change kept the bits.
      cuda::launch_gemv_int4(static_cast<const cuda::bf16*>(x), s.K, sw.words(0), sw.scale(0),
                             s.N, int(s.K), 128, M, o, 0);
      std::vector<uint16_t> out(size_t(M * s.N));
      cudaMemcpy(out.data(), y, out.size() * 2, cudaMemcpyDeviceToHost);
      uint64_t h = 1469598103934665603ull;
      for (uint16_t v : out) h = (h ^ v) * 1099511628211ull;
      std::printf("[ gemv int4 ] %8lld x %-12lld %4d %10.2f %12.0f %12.0f  bits %016llx\n",
                  (long long)s.N, (long long)s.K, M, us, double(sw.packed) / us / 1e3,
                  double(sw.packed + sw.scales) / us / 1e3, (unsigned long long)h);
    }
  }
  std::printf("[ gemv int4 ] 9B projections at M = 1, one decode step: %.3f ms of GEMVs\n",
              step_us / 1e3);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(x);
  cudaFree(y);
}

// The prefill path's cost: one dequantization of each weight per forward (bf16 out).
TEST(CudaInt4Gemv, DequantSpeed) {
  REQUIRE_GPU();
  std::printf("\n[ int4 dequant ] %-22s %10s %14s\n", "shape N x K", "us", "GB/s (r + w)");
  double forward_us = 0;
  for (const SpeedShape s : kShapes) {
    const int64_t packed = s.N * s.K / 2, scales = s.N * (s.K / 128) * 4;
    void *w = nullptr, *sc = nullptr, *out = nullptr;
    ASSERT_EQ(cudaMalloc(&w, size_t(packed)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&sc, size_t(scales)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out, size_t(s.N * s.K) * 2), cudaSuccess);
    cudaMemset(w, 0x5a, size_t(packed));
    cudaMemset(sc, 0, size_t(scales));
    const double us = time_us(
        [&](int) {
          cuda::launch_int4_dequantize(static_cast<const uint32_t*>(w),
                                       static_cast<const float*>(sc), s.N, s.K, 128,
                                       static_cast<cuda::bf16*>(out), 0);
        },
        20);
    forward_us += us * s.per_forward;
    std::printf("[ int4 dequant ] %8lld x %-12lld %10.2f %14.0f\n", (long long)s.N,
                (long long)s.K, us, double(packed + scales + s.N * s.K * 2) / us / 1e3);
    cudaFree(w);
    cudaFree(sc);
    cudaFree(out);
  }
  std::printf("[ int4 dequant ] 9B projections, one prefill forward (any row count): %.3f ms\n",
              forward_us / 1e3);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace sala::test
