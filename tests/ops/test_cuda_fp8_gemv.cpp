// The W8A8 FP8 skinny GEMV (cuda_gemv_fp8.cu: launch_quantize_rows_fp8 then launch_gemv_fp8,
// what GemmDispatch runs) against its CPU oracle, CpuBackend::linear_fp8 in NumericMode::BF16,
// fed the same e4m3 codes and per-channel scales (upload_fp8) and the same bf16 x. Both
// quantize x per row (sx = amax / 448, x / sx by IEEE division, e4m3 nearest-even
// saturating), multiply exactly and sum in fp32, then scale and round to bf16; only the
// summation order differs.
//
//   QuantizationBitExact  one-hot weights: every output is one product, so every x element's
//                         quantization (ties, subnormals, saturation, zero rows) is compared
//                         bit for bit
//   MatchesCpu            the model's shapes and odd ones, M = 1..64 (every n8-tile count),
//                         zero rows, outliers
//   OutputModes           GemvOut parts (up to 4), fp32 logits, silu_pair vs linear_multi +
//                         silu_mul on the CPU, M up to 64
//   RowInvariance         every row of M = 2..64 bit-identical to the row alone (plain, fp32,
//                         parts, silu_pair)
//   Speed                 us and GB/s of weight bytes at M = 1, 8, 16, 32, 40, 64 (prints only)
// Without a GPU every test GTEST_SKIPs (cuda_test_util.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_skinny_sm90.h"
#include "core/fp8.h"
#include "cuda_fp8_fused_util.h"  // CUDA_OK
#include "cuda_test_util.h"

namespace sala::test {
namespace {

using cuda::GemvOut;

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

uint16_t to_bf16(float f) {  // nearest-even (the values used here are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t xorshift(uint32_t& s) {
  s ^= s << 13;
  s ^= s >> 17;
  s ^= s << 5;
  return s;
}

// e4m3 codes w[N, K] and per-channel scales: codes of N(0, 100²) values (saturated at ±448
// beyond 4.5σ, as quantized checkpoints), drawn from a table of 4096 for speed; scales ~1e-4
// (weights ~0.01).
struct Fp8W {
  int64_t N, K;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
Fp8W random_weight(int64_t N, int64_t K, uint32_t seed) {
  const HostMat t = randn(1, 4096, seed, 100.f);
  std::vector<uint8_t> table(4096);
  for (size_t i = 0; i < table.size(); ++i) table[i] = f32_to_fp8_e4m3(from_bf16(t.bits[i]));
  Fp8W w{N, K, std::vector<uint8_t>(size_t(N * K)), std::vector<float>(size_t(N))};
  uint32_t s = seed * 2654435761u + 1;
  for (auto& c : w.codes) c = table[xorshift(s) & 4095];
  for (auto& v : w.scales) v = 1e-4f * (1.f + float(xorshift(s) % 1000) / 1000.f);
  return w;
}

// x [64, K] bf16 (kRows): N(0, 1) rows; in every 16 rows b (b = 0, 16, 32, 48), row b + 3
// zero, b + 5 with outliers (×3000 every 97th element: the others quantize to few bits,
// subnormals and zeros), b + 10 of e4m3 ties at sx = 1 (amax 448: x / sx = x exactly), b + 14
// tiny (×1e-6), b + 15 large (×300): every n8 tile of a wide M meets them.
constexpr int kRows = cuda::kGemvMaxRows;
HostMat activations(int64_t K, uint32_t seed) {
  HostMat x = randn(kRows, K, seed, 1.f);
  auto set = [&](int64_t r, int64_t k, float v) { x.bits[size_t(r * K + k)] = to_bf16(v); };
  auto get = [&](int64_t r, int64_t k) { return from_bf16(x.bits[size_t(r * K + k)]); };
  for (int64_t b = 0; b < kRows; b += 16) {
    for (int64_t k = 0; k < K; ++k) {
      set(b + 3, k, 0.f);
      if (k % 97 == 5) set(b + 5, k, get(b + 5, k) * 3000.f);
      // Midpoints between neighbouring e4m3 values: normal (1 + (2i+1)/16)·2^e for e = -6..7,
      // subnormal (2i+1)·2^-10; both signs; exact in bf16.
      const int i = int(k % 8), e = int(k / 8 % 14) - 6;
      const float tie = (k / 8 / 14) % 2 ? std::ldexp(float(2 * i + 1), -10)
                                         : std::ldexp(1.f + float(2 * i + 1) / 16.f, e);
      set(b + 10, k, k % 3 == 1 ? -tie : tie);
      set(b + 14, k, get(b + 14, k) * 1e-6f);
      set(b + 15, k, get(b + 15, k) * 300.f);
    }
    set(b + 10, K / 2, K > 16 ? -448.f : 448.f);
  }
  return x;
}

// The CPU oracle: y [M, N] (fp32 holding bf16 values) of x's first M rows.
struct Oracle {
  std::unique_ptr<Backend> cpu = make_cpu_backend({NumericMode::BF16, 0});
  Weight w;
  Oracle(const Fp8W& fw) {
    TensorView v;
    v.name = "fp8 weight";
    v.dtype = DType::F8_E4M3;
    v.shape = {fw.N, fw.K};
    v.data = fw.codes.data();
    v.nbytes = fw.codes.size();
    w = cpu->upload_fp8(v, fw.scales);
  }
  Tensor x(const HostMat& hx, int64_t M) {
    return upload_checkpoint(*cpu, DType::BF16, M, hx.cols, hx.bits.data());
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<float> r(size_t(t.numel()));
    cpu->download_f32(t, r.data());
    return r;
  }
  std::vector<float> linear(const HostMat& hx, int64_t M) {
    Tensor y = cpu->alloc(M, w.rows, DType::F32);
    cpu->linear(x(hx, M), w, y);
    return get(y);
  }
};

// The same weight and x on the GPU; run() launches, waits, and returns y as fp32.
struct Gpu {
  const Fp8W& fw;
  DevBuf x, w, s;
  Gpu(const Fp8W& f, const HostMat& hx)
      : fw(f), x(hx.bits.size() * 2), w(f.codes.size()), s(f.scales.size() * 4) {
    CUDA_OK(cudaMemcpy(x.p, hx.bits.data(), hx.bits.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(w.p, f.codes.data(), f.codes.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(s.p, f.scales.data(), f.scales.size() * 4, cudaMemcpyHostToDevice));
  }
  // Outputs: parts of `cols` columns (bf16, or fp32 when f32), x rows [r0, r0 + M); the
  // parts' columns side by side in the result [M, Σ cols].
  std::vector<float> run(int M, const std::vector<int64_t>& cols, bool f32, bool silu = false,
                         int r0 = 0) {
    const cuda::bf16* xp = x.as<const cuda::bf16>() + int64_t(r0) * fw.K;
    EXPECT_TRUE(cuda::gemv_fp8_supported(w.p, fw.K, M));
    GemvOut o{};
    std::vector<std::unique_ptr<DevBuf>> ys;
    int64_t end = 0, total = 0;
    const size_t es = f32 ? 4 : 2;
    for (size_t p = 0; p < cols.size(); ++p) {
      ys.push_back(std::make_unique<DevBuf>(size_t(M * cols[p]) * es));
      CUDA_OK(cudaMemset(ys.back()->p, 0xff, size_t(M * cols[p]) * es));  // NaN: unwritten
      end += cols[p];
      o.y[p] = ys.back()->p, o.end[p] = silu ? fw.N : end, o.cols[p] = cols[p];
      total += cols[p];
    }
    o.nparts = int(cols.size());
    o.f32 = f32;
    o.silu_pair = silu;
    DevBuf xq(size_t(M * fw.K)), sx(size_t(M) * 4);
    cuda::launch_quantize_rows_fp8(xp, M, fw.K, fw.K, xq.as<uint8_t>(), sx.as<float>(), 0);
    cuda::launch_gemv_fp8(xq.as<uint8_t>(), fw.K, sx.as<float>(), w.as<uint8_t>(), s.as<float>(),
                          fw.N, int(fw.K), M, o, 0);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> r(size_t(M * total));
    int64_t c0 = 0;
    for (size_t p = 0; p < cols.size(); ++p) {
      const int64_t n = M * cols[p];
      std::vector<uint8_t> h(size_t(n) * es);
      CUDA_OK(cudaMemcpy(h.data(), ys[p]->p, h.size(), cudaMemcpyDeviceToHost));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t c = 0; c < cols[p]; ++c) {
          const size_t i = size_t(m * cols[p] + c);
          float v;
          if (f32) {
            std::memcpy(&v, h.data() + i * 4, 4);
          } else {
            uint16_t b;
            std::memcpy(&b, h.data() + i * 2, 2);
            v = from_bf16(b);
          }
          r[size_t(m * total + c0 + c)] = v;
        }
      c0 += cols[p];
    }
    return r;
  }
};

// GPU e against CPU r, both [M, N] of bf16 values. Both sum the same exact products in fp32,
// in different orders (the CPU's sgemm; the GPU's 8 K slices of m16n8k16 MMAs): the fp32
// sums differ by ~1e-6 of the row's magnitude, so after rounding to bf16 an element is equal,
// or `ulps` bf16 ulp apart where the two sums straddle a rounding boundary (silu_pair: 2, the
// ulp of g and of u both reach the product); near-zero outputs (cancellation) may differ by
// more ulps of their own, so an absolute 1e-4 of the row's largest output is allowed too.
// At most 2 % of the elements may differ at all, and nothing may be NaN (an unwritten
// output is NaN).
void expect_fp8_close(const std::string& name, const std::vector<float>& e,
                      const std::vector<float>& r, int64_t M, int64_t N, double ulps) {
  ASSERT_EQ(e.size(), r.size()) << name;
  const Stat st = compare(name, e, r);
  int64_t bad = 0, diff = 0, worst = -1;
  double worst_excess = 0;
  for (int64_t m = 0; m < M; ++m) {
    double rowmax = 0;
    for (int64_t n = 0; n < N; ++n)
      rowmax = std::max(rowmax, std::fabs(double(r[size_t(m * N + n)])));
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = size_t(m * N + n);
      const double d = std::fabs(double(e[i]) - double(r[i]));
      if (!(d == 0)) ++diff;
      const double bound = std::max(ulps * bf16_ulp(std::fabs(double(r[i]))), 1e-4 * rowmax);
      if (!(d <= bound)) {  // NaN counts
        ++bad;
        const double ex = std::isnan(d) ? 1e30 : d / bound;
        if (ex > worst_excess || worst < 0) worst_excess = ex, worst = int64_t(i);
      }
    }
  }
  EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << M * N
                    << " outside the bound; worst at m=" << (worst < 0 ? -1 : worst / N)
                    << " n=" << (worst < 0 ? -1 : worst % N)
                    << " gpu=" << (worst < 0 ? 0.f : e[size_t(worst)])
                    << " cpu=" << (worst < 0 ? 0.f : r[size_t(worst)]) << " (max abs err "
                    << st.max_abs << ", max ulp " << st.max_ulp << ")";
  EXPECT_LE(double(diff), 0.02 * double(M * N))
      << name << ": " << diff << " of " << M * N << " elements differ (max ulp " << st.max_ulp
      << ", rel L2 " << st.rel_l2 << ")";
}

std::string fp8_name(const char* op, int64_t N, int64_t K, int64_t M) {
  return shape(op, {N, K, M});
}

// One-hot weights w[n, k] = (k == n) (code 0x38 = 1.0, scale 1): y[m, n] = bf16(e4m3(x[m, n]
// / sx[m]) · sx[m]), one product, no rounding in any sum: GPU and CPU must agree exactly
// (values; ±0 compare equal), which they do only if sx, the IEEE division and the e4m3
// rounding (ties to even, subnormals, saturation) are the CPU's.
TEST(CudaFp8Gemv, QuantizationBitExact) {
  REQUIRE_GPU();
  for (int64_t K : {int64_t(16), int64_t(512), int64_t(4096)}) {
    Fp8W fw{K, K, std::vector<uint8_t>(size_t(K * K), 0), std::vector<float>(size_t(K), 1.f)};
    for (int64_t n = 0; n < K; ++n) fw.codes[size_t(n * K + n)] = 0x38;
    const HostMat hx = activations(K, 31 + uint32_t(K));
    Oracle cpu(fw);
    Gpu gpu(fw, hx);
    for (int M : {1, 8, 11, 16, 24, 40, 64})
      for (bool f32 : {false, true}) {
        const std::vector<float> r = cpu.linear(hx, M), e = gpu.run(M, {K}, f32);
        const std::string name = fp8_name(f32 ? "fp8 one-hot f32" : "fp8 one-hot", K, K, M);
        compare(name, e, r);
        int64_t bad = 0, first = -1;
        for (size_t i = 0; i < r.size(); ++i)
          if (!(e[i] == r[i])) bad++, first = first < 0 ? int64_t(i) : first;
        EXPECT_EQ(bad, 0) << name << ": " << bad << " outputs differ; first m=" << first / K
                          << " k=" << first % K
                          << " x=" << (first < 0 ? 0.f : from_bf16(hx.bits[size_t(first)]))
                          << " gpu=" << (first < 0 ? 0.f : e[size_t(first)])
                          << " cpu=" << (first < 0 ? 0.f : r[size_t(first)]);
      }
  }
}

TEST(CudaFp8Gemv, MatchesCpu) {
  REQUIRE_GPU();
  struct S {
    int64_t N, K;
    bool all_m;  // M = 1..17 and 24, 31, 32, 33, 40, 47, 48, 57, 63, 64; else 1, 2, 9, 16,
                 // 17, 33, 40, 64
  };
  uint32_t seed = 700;
  for (S s : {S{77, 1024, true}, S{1000, 2048, true}, S{33, 16, true}, S{130, 48, true},
              S{100, 4112, true}, S{4096, 4096, true}, S{16384, 4096, false}, S{4096, 16384, false},
              S{4099, 12304, false}}) {
    const Fp8W fw = random_weight(s.N, s.K, seed++);
    const HostMat hx = activations(s.K, seed++);
    Oracle cpu(fw);
    Gpu gpu(fw, hx);
    std::vector<int> ms;
    if (s.all_m) {
      for (int m = 1; m <= 17; ++m) ms.push_back(m);
      for (int m : {24, 31, 32, 33, 40, 47, 48, 57, 63, 64}) ms.push_back(m);
    } else {
      ms = {1, 2, 9, 16, 17, 33, 40, 64};
    }
    for (int M : ms)
      expect_fp8_close(fp8_name("fp8 gemv", s.N, s.K, M), gpu.run(M, {s.N}, false),
                       cpu.linear(hx, M), M, s.N, 1);
  }
}

TEST(CudaFp8Gemv, OutputModes) {
  REQUIRE_GPU();
  uint32_t seed = 800;
  // Parts of uneven widths (boundaries inside the kernel's 32-row tiles), and fp32 logits.
  {
    const int64_t K = 2048;
    const std::vector<int64_t> cols = {1000, 77, 531, 440};
    const Fp8W fw = random_weight(2048, K, seed++);
    const HostMat hx = activations(K, seed++);
    Oracle cpu(fw);
    Gpu gpu(fw, hx);
    for (int M : {1, 5, 8, 12, 16, 24, 40, 64}) {
      std::vector<Tensor> ys;
      for (int64_t c : cols) ys.push_back(cpu.cpu->alloc(M, c, DType::F32));
      std::vector<Tensor*> yp;
      for (Tensor& t : ys) yp.push_back(&t);
      cpu.cpu->linear_multi(cpu.x(hx, M), cpu.w, yp);
      std::vector<float> r(size_t(M * 2048));
      int64_t c0 = 0;
      for (size_t p = 0; p < cols.size(); ++p) {
        const std::vector<float> h = cpu.get(ys[p]);
        for (int64_t m = 0; m < M; ++m)
          std::copy_n(h.begin() + m * cols[p], cols[p], r.begin() + m * 2048 + c0);
        c0 += cols[p];
      }
      for (size_t np : {size_t(1), size_t(2), size_t(4)}) {
        std::vector<int64_t> pc(cols.begin(), cols.begin() + np);
        for (size_t p = np; p < cols.size(); ++p) pc.back() += cols[p];  // last part takes the rest
        expect_fp8_close(fp8_name(("fp8 gemv parts=" + std::to_string(np)).c_str(), 2048, K, M),
                         gpu.run(M, pc, false), r, M, 2048, 1);
      }
      expect_fp8_close(fp8_name("fp8 gemv f32", 2048, K, M), gpu.run(M, {2048}, true),
                       cpu.linear(hx, M), M, 2048, 1);
    }
  }
  // silu_pair: [gate; up] stacked, y = bf16(bf16(silu(g)) · u) against linear_multi + silu_mul.
  for (int64_t I : {int64_t(1024), int64_t(16384)}) {
    const int64_t K = 4096, N = 2 * I;
    if (!cuda::gemv_fp8_silu_pair_supported(N)) {
      std::printf("*** fp8 silu_pair not run: no ring kernel on this GPU (N = %lld) ***\n",
                  static_cast<long long>(N));
      continue;
    }
    const Fp8W fw = random_weight(N, K, seed++);
    const HostMat hx = activations(K, seed++);
    Oracle cpu(fw);
    Gpu gpu(fw, hx);
    for (int M : {1, 7, 16, 33, 64}) {
      if (I > 1024 && (M == 7 || M == 33)) continue;
      Tensor g = cpu.cpu->alloc(M, I, DType::F32), u = cpu.cpu->alloc(M, I, DType::F32);
      cpu.cpu->linear_multi(cpu.x(hx, M), cpu.w, {&g, &u});
      cpu.cpu->silu_mul(g, u, g);
      expect_fp8_close(fp8_name("fp8 gemv silu_pair", N, K, M), gpu.run(M, {I}, false, true),
                       cpu.get(g), M, I, 2);
    }
  }
}

// Row m of x alone (M = 1, x offset by m rows) and as row m of M = 2..64 (every n8-tile
// count) give the same bits: plain bf16 outputs, fp32 logits, parts split inside the 32-row
// tiles, and silu_pair.
TEST(CudaFp8Gemv, RowInvariance) {
  REQUIRE_GPU();
  uint32_t seed = 900;
  struct Mode {
    const char* name;
    bool f32, silu, parts;
  };
  for (auto [N, K] : {std::pair<int64_t, int64_t>{1024, 4096}, {512, 16384}, {77, 1024}}) {
    const Fp8W fw = random_weight(N, K, seed++);
    const HostMat hx = activations(K, seed++);
    Gpu gpu(fw, hx);
    for (const Mode md :
         {Mode{"bf16", false, false, false}, Mode{"f32", true, false, false},
          Mode{"parts", false, false, true}, Mode{"silu_pair", false, true, false}}) {
      if (md.silu && !cuda::gemv_fp8_silu_pair_supported(N)) continue;  // N % 64, ring kernel
      std::vector<int64_t> cols = {N};
      if (md.parts) cols = {N / 2 - 13, 26, N - N / 2 - 13};
      if (md.silu) cols = {N / 2};
      int64_t width = 0;
      for (int64_t c : cols) width += c;
      std::vector<std::vector<float>> alone(kRows);
      for (int r = 0; r < kRows; ++r) alone[size_t(r)] = gpu.run(1, cols, md.f32, md.silu, r);
      for (int M : {2, 3, 5, 8, 9, 11, 16, 17, 24, 31, 32, 33, 40, 57, 64}) {
        const std::vector<float> got = gpu.run(M, cols, md.f32, md.silu);
        int bad = 0;
        for (int r = 0; r < M; ++r) {
          const float* e = got.data() + int64_t(r) * width;
          const float* a = alone[size_t(r)].data();
          if (std::memcmp(a, e, size_t(width) * 4) == 0) continue;
          int64_t c = 0;
          while (c < width && std::memcmp(a + c, e + c, 4) == 0) ++c;
          if (bad++ < 4)
            ADD_FAILURE() << "fp8 gemv " << md.name << ": row " << r << " differs at M=" << M
                          << " K=" << K << " N=" << N << ", first at column " << c << " ("
                          << e[c] << " vs " << a[c] << " alone)";
        }
        EXPECT_EQ(bad, 0) << "fp8 gemv " << md.name << " M=" << M << " K=" << K << " N=" << N;
      }
    }
  }
}

// Bandwidth on the model's shapes (weights rotated over more than the L2; bf16 output).
// Prints only; compare with CudaOps.GemvSpeed's bf16 lines (the same shapes, twice the bytes).
TEST(CudaFp8Gemv, Speed) {
  REQUIRE_GPU();
  std::printf("\n[ gemv fp8 ] %-22s %4s %10s %10s\n", "shape N x K", "M", "us", "GB/s");
  if (cuda::skinny_sm90_available()) cuda::skinny_sm90_init();
  // µs per call of launch(i) (i picks the weight copy), after 3 warm-up calls.
  auto per_call_us = [](const auto& launch) {
    for (int i = 0; i < 3; ++i) launch(i);
    CUDA_OK(cudaDeviceSynchronize());
    const int iters = 60;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) launch(i);
    CUDA_OK(cudaDeviceSynchronize());
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
               .count() / iters;
  };
  const HostMat hx = randn(kRows, 16384, 899, 1.f);
  DevBuf x(hx.bits.size() * 2);
  CUDA_OK(cudaMemcpy(x.p, hx.bits.data(), hx.bits.size() * 2, cudaMemcpyHostToDevice));
  for (auto [N, K] : {std::pair<int64_t, int64_t>{4096, 4096},
                      {12288, 4096},
                      {16384, 4096},
                      {32768, 4096},
                      {4096, 16384},
                      {73448, 4096}}) {
    const int64_t bytes = N * K;
    const int copies = int(std::max<int64_t>(2, (400ll << 20) / bytes + 1));
    DevBuf w(size_t(bytes) * size_t(copies)), s(size_t(N) * 4), y(size_t(kRows * N) * 2);
    CUDA_OK(cudaMemset(w.p, 0x34, size_t(bytes) * size_t(copies)));  // 0.75
    std::vector<float> ones(size_t(N), 1e-3f);
    CUDA_OK(cudaMemcpy(s.p, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    GemvOut o{};
    o.y[0] = y.p, o.end[0] = N, o.cols[0] = N, o.nparts = 1;
    for (int M : {1, 8, 16, 32, 40, 64}) {
      // The quantize kernel + the GEMV (what GemmDispatch runs), and the GEMV alone.
      DevBuf xq(size_t(kRows * K)), sx(kRows * 4);
      for (bool with_quantize : {true, false}) {
        auto launch = [&](int i) {
          if (with_quantize)
            cuda::launch_quantize_rows_fp8(x.as<const cuda::bf16>(), M, K, K, xq.as<uint8_t>(),
                                           sx.as<float>(), 0);
          cuda::launch_gemv_fp8(xq.as<uint8_t>(), K, sx.as<float>(),
                                w.as<uint8_t>() + (i % copies) * bytes, s.as<float>(), N, int(K),
                                M, o, 0);
        };
        cuda::launch_quantize_rows_fp8(x.as<const cuda::bf16>(), M, K, K, xq.as<uint8_t>(),
                                       sx.as<float>(), 0);
        const double us = per_call_us(launch);
        std::printf("[ gemv fp8 %s ] %8lld x %-12lld %4d %10.2f %10.0f\n",
                    with_quantize ? "quantize+gemv" : "gemv alone   ", (long long)N,
                    (long long)K, M, us, double(bytes) / us / 1e3);
      }
      // The Hopper wgmma skinny GEMM on the same codes (speculative steps of 17..64 rows).
      if (!cuda::skinny_fp8_sm90_supported(xq.p, K, w.p, K, M)) continue;
      DevBuf ws(cuda::skinny_sm90_workspace_bytes());
      CUDA_OK(cudaMemset(ws.p, 0, cuda::skinny_sm90_workspace_bytes()));
      auto skinny = [&](int i) {
        cuda::launch_skinny_fp8_sm90(xq.as<uint8_t>(), K, sx.as<float>(),
                                     w.as<uint8_t>() + (i % copies) * bytes, s.as<float>(), N,
                                     int(K), M, o, ws.p, 0);
      };
      const double us = per_call_us(skinny);
      std::printf("[ gemv fp8 skinny wgmma  ] %8lld x %-12lld %4d %10.2f %10.0f\n",
                  (long long)N, (long long)K, M, us, double(bytes) / us / 1e3);
    }
  }
}

}  // namespace
}  // namespace sala::test
