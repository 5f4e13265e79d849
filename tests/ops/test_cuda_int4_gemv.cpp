// W4A16 on the GPU (cuda_gemv_int4.cu, cuda_gemv_int4_imma.cu, GemmDispatch::linear_int4 in
// cuda_gemm_int4.cpp)
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
//                    silu_pair), with and without the int8 GEMV (runs of <= 8 rows): what the
//                    speculative verify path relies on
//   ImmaEdges        the int8 GEMV on inf / NaN, tiny, huge and mixed-range rows of x
//   WideDecodeSteps  decode-only steps of 100 / 256 rows (runs of 64): rows independent of the
//                    step's other rows
//   Fp32Mode         fp32 mode (exact dequantization to fp32 + cuBLASLt fp32) at the fp32 level
//   MixedFormats     int4, FP8 and bf16 weights on one backend, each through GemmDispatch
//   UploadErrors     malformed codes / scales: sala::Error naming the tensor
//   Speed            the ring GEMV at M = 1..64, the int8 GEMV at M = 1..8: us and GB/s of
//                    packed + scale bytes
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
    Pair p(NumericMode::BF16, int4_opts(cuda::kInt4ImmaMaxRows));
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
  Pair p(NumericMode::BF16, int4_opts(cuda::kInt4ImmaMaxRows));
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

// Row r alone (M = 1, x offset by r rows) and as row r of M = 2..64 give the same bits, on a
// backend with the int8 GEMV for runs of <= kInt4ImmaMaxRows rows and on one without it
// (BackendOptions::int4_imma_rows = 0, speculative decoding's): the first's longer runs give
// the ring GEMV's bits, its shorter ones the int8 GEMV's (ImmaEdges shows that the dispatch
// runs it).
TEST(CudaInt4Gemv, RowInvariance) {
  REQUIRE_GPU();
  Pair p(NumericMode::BF16, int4_opts(cuda::kInt4ImmaMaxRows));
  auto ring = make_cuda_backend(int4_opts(0));
  uint32_t seed = 4600;
  const int64_t kMs[] = {2, 3, 4, 5, 6, 7, 8, 9, 11, 16, 17, 24, 31, 32, 33, 40, 57, 64};
  struct Side {  // one backend's weight and activations
    Backend* be;
    Weight w;
    Tensor x;
  };
  using Run = std::function<std::vector<float>(const Side&, int64_t, int64_t)>;
  auto check = [&](const std::string& what, int64_t cols, const Side& imma, const Side& plain,
                   const Run& run) {
    std::vector<std::vector<float>> alone_imma(kRowsMax), alone_ring(kRowsMax);
    for (int64_t r = 0; r < kRowsMax; ++r) {
      alone_imma[size_t(r)] = run(imma, r, 1);
      alone_ring[size_t(r)] = run(plain, r, 1);
    }
    for (bool on : {true, false})
      for (int64_t M : kMs) {
        const std::vector<float> got = run(on ? imma : plain, 0, M);
        const auto& alone = on && M <= cuda::kInt4ImmaMaxRows ? alone_imma : alone_ring;
        int bad = 0;
        for (int64_t r = 0; r < M; ++r)
          if (std::memcmp(alone[size_t(r)].data(), got.data() + r * cols, size_t(cols) * 4) != 0 &&
              bad++ < 4)
            ADD_FAILURE() << what << (on ? "" : " ring") << ": row " << r << " at M=" << M
                          << " differs from the row alone";
        EXPECT_EQ(bad, 0) << what << (on ? "" : " ring") << " M=" << M;
      }
  };
  for (auto [N, K] : {std::pair<int64_t, int64_t>{1024, 4096}, {512, 16384}, {77, 1024}}) {
    const Int4Host q = weight(N, K, 128, seed++);
    const HostMat hx = activations(K, seed++);
    const Side a{p.gpu.get(), upload_int4_host(*p.gpu, q),
                 upload_checkpoint(*p.gpu, DType::BF16, hx.rows, hx.cols, hx.bits.data())};
    const Side b{ring.get(), upload_int4_host(*ring, q),
                 upload_checkpoint(*ring, DType::BF16, hx.rows, hx.cols, hx.bits.data())};
    for (DType yt : {DType::BF16, DType::F32})
      check(shape(yt == DType::F32 ? "int4 rows f32" : "int4 rows", {N, K}), N, a, b,
            [&](const Side& s, int64_t r0, int64_t M) {
              return run_linear(*s.be, s.x, s.w, r0, M, yt);
            });
    const std::vector<int64_t> parts = {N / 2 - 13, 26, N - N / 2 - 13};
    check(shape("int4 rows parts", {N, K}), N, a, b, [&](const Side& s, int64_t r0, int64_t M) {
      std::vector<Tensor> ys;
      std::vector<Tensor*> yp;
      for (int64_t c : parts) ys.push_back(s.be->alloc(M, c, DType::BF16));
      for (Tensor& t : ys) yp.push_back(&t);
      s.be->linear_multi(s.x.slice_rows(r0, M), s.w, yp);
      std::vector<float> r(size_t(M * N));
      int64_t c0 = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        std::vector<float> h(size_t(M * parts[i]));
        s.be->download_f32(ys[i], h.data());
        for (int64_t m = 0; m < M; ++m)
          std::copy_n(h.begin() + m * parts[i], parts[i], r.begin() + m * N + c0);
        c0 += parts[i];
      }
      return r;
    });
    if (N % 64 == 0)
      check(shape("int4 rows silu_pair", {N, K}), N / 2, a, b,
            [&](const Side& s, int64_t r0, int64_t M) {
              Tensor g = s.be->alloc(M, N / 2, DType::BF16), u = s.be->alloc(M, N / 2, DType::BF16);
              s.be->linear_silu_mul(s.x.slice_rows(r0, M), s.w, g, u);
              std::vector<float> r(size_t(M * N / 2));
              s.be->download_f32(g, r.data());
              return r;
            });
  }
}

// The int8 GEMV's inputs at its edges (runs of <= 8 rows, int4_imma_rows 8) against the CPU and
// against the ring GEMV (int4_imma_rows = 0), 8 rows of x: 0 N(0, 1); 1 one +inf (group 3) and
// 2 one NaN (group 0): every output NaN (the ring GEMV makes inf / NaN as the products fall);
// 3 every group tiny (x 1e-25: still exact digits); 4 one group x 1e10 (groups of very different
// E); 5 per group one value x 1e4 over values x 1e-4 (the small ones keep fewer digits: below
// the bound); 6 zeros; 7 N(0, 1) with every 16th value x 1e-5. Plain outputs, parts, fp32 and
// silu_pair at M = 1..8: the rows' bits equal the rows alone (RowInvariance covers more); the
// backend's outputs equal a direct launch_gemv_int4_imma's.
TEST(CudaInt4Gemv, ImmaEdges) {
  REQUIRE_GPU();
  Pair p(NumericMode::BF16, int4_opts(cuda::kInt4ImmaMaxRows));
  auto ring = make_cuda_backend(int4_opts(0));
  const int64_t K = 2048, N = 1024, R = cuda::kInt4ImmaMaxRows;
  const Int4Host q = weight(N, K, 128, 4650);
  HostMat hx = randn(R, K, 4651, 1.f);
  const std::vector<float> f = hx.f32();
  for (int64_t k = 0; k < K; ++k) {
    auto at = [&](int64_t r) -> uint16_t& { return hx.bits[size_t(r * K + k)]; };
    const float v = f[size_t(k)];
    at(1) = k == 3 * 128 + 5 ? uint16_t(0x7f80) : bf16_bits(v);
    at(2) = k == 17 ? uint16_t(0x7fc0) : bf16_bits(v);
    at(3) = bf16_bits(v * 1e-25f);
    at(4) = bf16_bits(k / 128 == 6 ? v * 1e10f : v);
    at(5) = bf16_bits(k % 128 == 9 ? v * 1e4f : v * 1e-4f);
    at(6) = 0;
    at(7) = bf16_bits(k % 16 == 5 ? v * 1e-5f : v);
  }
  const Weight wc = upload_int4_host(*p.cpu, q), wg = upload_int4_host(*p.gpu, q),
               wr = upload_int4_host(*ring, q);
  auto x = p.up(hx);
  const Tensor xr = upload_checkpoint(*ring, DType::BF16, hx.rows, hx.cols, hx.bits.data());
  const std::vector<float> cpu = run_linear(*p.cpu, x.c, wc, 0, R, DType::F32);
  const std::vector<float> plain = run_linear(*ring, xr, wr, 0, R, DType::BF16);
  auto finite_rows = [&](const std::vector<float>& v) {  // rows 0, 3..7
    std::vector<float> r(v.begin(), v.begin() + N);
    r.insert(r.end(), v.begin() + 3 * N, v.end());
    return r;
  };
  for (int64_t M = 1; M <= R; ++M)
    for (DType yt : {DType::BF16, DType::F32}) {
      const std::vector<float> got = run_linear(*p.gpu, x.g, wg, 0, M, yt);
      const std::vector<float> all = M == R ? got : run_linear(*p.gpu, x.g, wg, 0, R, yt);
      EXPECT_EQ(std::memcmp(got.data(), all.data(), got.size() * 4), 0)
          << "int8 GEMV rows 0.." << M - 1 << " differ from the same rows of M = " << R;
    }
  const std::vector<float> got = run_linear(*p.gpu, x.g, wg, 0, R, DType::BF16);
  {  // GemmDispatch ran the int8 GEMV: its outputs are a direct launch's bits
    void* scratch = nullptr;
    ASSERT_EQ(cudaMalloc(&scratch, cuda::gemv_int4_imma_scratch_bytes(K)), cudaSuccess);
    Tensor y = p.gpu->alloc(R, N, DType::BF16);
    cuda::GemvOut o{};
    o.y[0] = y.data, o.end[0] = N, o.cols[0] = N, o.nparts = 1;
    cudaDeviceSynchronize();
    cuda::launch_gemv_int4_imma(static_cast<const cuda::bf16*>(x.g.data), K,
                                static_cast<const uint32_t*>(wg.data), wg.scales, N, int(K),
                                int(R), o, scratch, K, 0);
    cudaDeviceSynchronize();
    std::vector<float> direct(size_t(R * N));
    p.gpu->download_f32(y, direct.data());
    EXPECT_EQ(std::memcmp(direct.data(), got.data(), got.size() * 4), 0)
        << "the backend's W4A16 rows are not the int8 GEMV's";
    cudaFree(scratch);
  }
  for (int64_t r : {1, 2}) {
    int64_t nan = 0;
    for (int64_t n = 0; n < N; ++n) nan += std::isnan(got[size_t(r * N + n)]);
    EXPECT_EQ(nan, N) << "int8 GEMV row " << r << " (inf / NaN in x): not every output is NaN";
  }
  expect_int4_close("int8 GEMV edges vs CPU", finite_rows(got), finite_rows(cpu), R - 2, N, true,
                    1);
  expect_int4_close("ring GEMV edges vs CPU", finite_rows(plain), finite_rows(cpu), R - 2, N,
                    true, 1);
  // silu_pair and parts through the int8 GEMV against the CPU (finite rows only: M = 1).
  const Int4Host qg = weight(2 * N, K, 128, 4652);
  const Weight gc = upload_int4_host(*p.cpu, qg), gg = upload_int4_host(*p.gpu, qg);
  for (int64_t M : {int64_t(1), R}) {
    auto g = p.out(M, N), u = p.out(M, N);
    p.gpu->linear_silu_mul(x.g.slice_rows(0, M), gg, g.g, u.g);
    p.cpu->linear_silu_mul(x.c.slice_rows(0, M), gc, g.c, u.c);
    auto [c, e] = p.download(g);
    const auto keep = [&](const std::vector<float>& v) { return M == 1 ? v : finite_rows(v); };
    expect_int4_close(shape("int8 GEMV silu_pair", {M, K, N}), keep(e), keep(c),
                      M == 1 ? 1 : R - 2, N, true, 2);
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

// Packed weights rotated over more than the L2 (random codes; scales 1e-3); bf16 output. The
// ring GEMV ("gemv int4") and the int8 one ("gemv int4 imma", its digit kernel included).
TEST(CudaInt4Gemv, Speed) {
  REQUIRE_GPU();
  const HostMat hx = randn(kRowsMax, 16384, 899, 1.f);
  void *x = nullptr, *y = nullptr, *digits = nullptr;
  cudaMalloc(&x, hx.bits.size() * 2);
  cudaMemcpy(x, hx.bits.data(), hx.bits.size() * 2, cudaMemcpyHostToDevice);
  cudaMalloc(&y, size_t(kRowsMax) * 32768 * 2);
  cudaMalloc(&digits, cuda::gemv_int4_imma_scratch_bytes(16384));
  for (const bool imma : {false, true}) {
    const char* tag = imma ? "[ gemv int4 imma ]" : "[ gemv int4 ]";
    std::printf("\n%s %-22s %4s %10s %12s %12s  %s\n", tag, "shape N x K", "M", "us",
                "GB/s packed", "GB/s +scales", "output bits");
    double step_us = 0;
    for (const SpeedShape s : kShapes) {
      const Int4SpeedWeights sw(s.N, s.K);
      cuda::GemvOut o{};
      o.y[0] = y, o.end[0] = s.N, o.cols[0] = s.N, o.nparts = 1;
      auto launch = [&](int i, int M) {
        const auto* xb = static_cast<const cuda::bf16*>(x);
        if (imma)
          cuda::launch_gemv_int4_imma(xb, s.K, sw.words(i), sw.scale(i), s.N, int(s.K), M, o,
                                      digits, 16384, 0);
        else
          cuda::launch_gemv_int4(xb, s.K, sw.words(i), sw.scale(i), s.N, int(s.K), 128, M, o, 0);
      };
      const std::vector<int> ms =
          imma ? std::vector<int>{1, 2, 4, 8} : std::vector<int>{1, 2, 4, 8, 16, 64};
      for (int M : ms) {
        const double us = time_us([&](int i) { launch(i, M); }, 60);
        if (M == 1) step_us += us * s.per_forward;
        // The output bits of copy 0 (FNV-1a of the bf16 outputs): equal across builds whose
        // kernels do the same arithmetic, so an A/B run shows whether a change kept the bits.
        launch(0, M);
        std::vector<uint16_t> out(size_t(M * s.N));
        cudaMemcpy(out.data(), y, out.size() * 2, cudaMemcpyDeviceToHost);
        uint64_t h = 1469598103934665603ull;
        for (uint16_t v : out) h = (h ^ v) * 1099511628211ull;
        std::printf("%s %8lld x %-12lld %4d %10.2f %12.0f %12.0f  bits %016llx\n", tag,
                    (long long)s.N, (long long)s.K, M, us, double(sw.packed) / us / 1e3,
                    double(sw.packed + sw.scales) / us / 1e3, (unsigned long long)h);
      }
    }
    std::printf("%s 9B projections at M = 1, one decode step: %.3f ms of GEMVs\n", tag,
                step_us / 1e3);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(x);
  cudaFree(y);
  cudaFree(digits);
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
