// FP8 KV cache on the GPU (issue 17): the device conversions of cuda_kv_fp8.cuh against the
// CPU oracle's (backend/kv_cache_dtype.h, core/fp8.h) bit for bit, the one-byte elements the
// pool is sized with, and the refusal in fp32 mode. The sparse-layer cases over FP8 caches
// are CudaKvFp8.* in test_cuda_sparse.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/kv_cache_dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "engine/engine.h"

namespace sala::test {
namespace {

// Inputs for the conversion check: the formats' edges (subnormals, the halfway points of
// rounding, the saturation thresholds of e4m3 448 / 464 and e5m2 57344 / 61440, infinities,
// NaNs of both signs, fp32 subnormals) at several scales, and random values over the whole
// exponent range.
std::vector<float> conversion_inputs() {
  std::vector<float> x = {0.f, -0.f, 1.f, -1.f, 448.f, -448.f, 464.f, 463.99f, 464.01f, 480.f,
                          1e6f, -1e6f, 57344.f, 61439.f, 61440.f, 65536.f, -61440.f,
                          std::ldexp(1.f, -9), std::ldexp(1.f, -10), std::ldexp(1.5f, -10),
                          std::ldexp(1.f, -16), std::ldexp(1.f, -17), std::ldexp(3.f, -18),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(), 1e-40f, -1e-39f};
  for (int e = -24; e <= 17; ++e)  // every code's neighbourhood: m/8 steps and their midpoints
    for (int m = 0; m < 32; ++m) {
      const float v = std::ldexp(1.f + float(m) / 32.f, e);
      x.push_back(v);
      x.push_back(-v);
    }
  std::mt19937 rng(17);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = bits(rng);
    // exponents 2^-30 .. 2^20 mostly (random bit patterns are mostly huge or tiny)
    const uint32_t e = 97 + (u >> 23) % 51;
    x.push_back(std::bit_cast<float>((u & 0x807fffffu) | (e << 23)));
  }
  std::normal_distribution<float> nd;
  for (int i = 0; i < 50000; ++i) x.push_back(nd(rng) * 3.f);
  return x;
}

TEST(CudaKvFp8, ConversionsBitExactWithCpu) {
  REQUIRE_GPU();
  const std::vector<float> x = conversion_inputs();
  const int64_t n = int64_t(x.size());
  float *dx = nullptr, *dback = nullptr;
  uint8_t* dcodes = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, size_t(n) * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dback, size_t(n) * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dcodes, size_t(n)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), size_t(n) * 4, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  std::vector<float> back(static_cast<size_t>(n));
  for (KvCacheDtype t : {KvCacheDtype::FP8_E4M3, KvCacheDtype::FP8_E5M2})
    for (float scale : {1.f, 0.037f, 0.005f, 3.5f, 1e-3f}) {
      const int kf = t == KvCacheDtype::FP8_E4M3 ? cuda::kKvE4m3 : cuda::kKvE5m2;
      cuda::launch_kv_fp8_roundtrip(kf, dx, n, scale, dcodes, dback, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(codes.data(), dcodes, size_t(n), cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(back.data(), dback, size_t(n) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      int64_t bad_code = 0, bad_value = 0, saturated = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t want = kv_fp8_encode(x[size_t(i)], t, scale);
        const float want_v = kv_fp8_decode(want, t, scale);
        saturated += (want & 0x7f) == (t == KvCacheDtype::FP8_E4M3 ? 0x7e : 0x7b);
        if (codes[size_t(i)] != want) {
          if (bad_code++ < 5)
            ADD_FAILURE() << kv_cache_dtype_name(t) << " scale " << scale << ": x = " << x[size_t(i)]
                          << " gives code " << int(codes[size_t(i)]) << ", the CPU " << int(want);
        }
        const bool same = std::isnan(want_v) ? std::isnan(back[size_t(i)])
                                             : std::bit_cast<uint32_t>(want_v) ==
                                                   std::bit_cast<uint32_t>(back[size_t(i)]);
        bad_value += !same;
      }
      EXPECT_EQ(bad_code, 0) << kv_cache_dtype_name(t) << " scale " << scale << " of " << n;
      EXPECT_EQ(bad_value, 0) << kv_cache_dtype_name(t) << " scale " << scale << " of " << n;
      EXPECT_GT(saturated, 0) << "the inputs must reach the saturation threshold";
    }
  cudaFree(dx);
  cudaFree(dback);
  cudaFree(dcodes);
}

// kv_codes8_bf16, which stage 2's FP8 producers and the FP8 attention loaders feed to the
// tensor cores: every code at each of the 8 positions of a group, beside other codes (NaN
// among them, so groups take both e4m3 paths: the bit-level one and the exact per-code one
// that keeps NaN), and random groups; each bf16 must be the CPU's code value (scale 1), which
// bf16 holds exactly.
TEST(CudaKvFp8, CodeGroupsToBf16Exact) {
  REQUIRE_GPU();
  std::vector<uint8_t> codes;
  const uint8_t others[] = {0x00, 0x80, 0x01, 0x81, 0x08, 0x7e, 0xfe, 0x7f, 0x38, 0xc4, 0x07};
  for (int pos = 0; pos < 8; ++pos)
    for (int c = 0; c < 256; ++c)
      for (uint8_t other : others)
        for (int i = 0; i < 8; ++i) codes.push_back(i == pos ? uint8_t(c) : other);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 8 * 100000; ++i) codes.push_back(uint8_t(byte(rng)));
  const int64_t n = int64_t(codes.size()), n8 = n / 8;
  uint8_t* dcodes = nullptr;
  uint16_t* dout = nullptr;
  ASSERT_EQ(cudaMalloc(&dcodes, size_t(n)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, size_t(n) * 2), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dcodes, codes.data(), size_t(n), cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  for (KvCacheDtype t : {KvCacheDtype::FP8_E4M3, KvCacheDtype::FP8_E5M2}) {
    const int kf = t == KvCacheDtype::FP8_E4M3 ? cuda::kKvE4m3 : cuda::kKvE5m2;
    cuda::launch_kv_codes8_bf16(kf, dcodes, n8, dout, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(out.data(), dout, size_t(n) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t bad = 0, nans = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float want = kv_fp8_decode(codes[size_t(i)], t, 1.f);
      const uint16_t got = out[size_t(i)];
      bool ok = false;
      if (std::isnan(want)) {
        ok = (got & 0x7f80u) == 0x7f80u && (got & 0x7fu) != 0u;
        ++nans;
      } else {
        const uint32_t w = std::bit_cast<uint32_t>(want);
        ASSERT_EQ(w & 0xffffu, 0u) << "code " << int(codes[size_t(i)]) << " is not exact in bf16";
        ok = got == uint16_t(w >> 16);
      }
      if (!ok && bad++ < 5)
        ADD_FAILURE() << kv_cache_dtype_name(t) << ": code " << int(codes[size_t(i)])
                      << " at position " << i % 8 << " gives bf16 bits " << got << ", want "
                      << want;
    }
    EXPECT_EQ(bad, 0) << kv_cache_dtype_name(t) << " of " << n;
    EXPECT_GT(nans, 0) << "the inputs must hold NaN codes";
  }
  cudaFree(dcodes);
  cudaFree(dout);
}

// The FP8 KV shadow's conversion (launch_kv_pages_bf16): a sequence's pages, taken through
// its slice of a step's page table (shuffled physical pages), become shadow pages base ..
// base + n of bf16 code values (the CPU's values, NaN kept as NaN), its slice of the shadow's
// page table says base + i, and nothing else of either is written.
TEST(CudaKvFp8, PagesToBf16Exact) {
  REQUIRE_GPU();
  const int page_size = 64, kvh = 2, d = 128, pool_pages = 40, shadow_pages = 24;
  const int64_t page_bytes = int64_t(page_size) * kvh * d;
  const cuda::CacheGeom g{page_size, kvh, d, 16, 64, 32, 128, 64, int64_t(kvh) * d};
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> k(size_t(pool_pages * page_bytes)), v(k.size());
  for (auto& c : k) c = uint8_t(byte(rng));
  for (auto& c : v) c = uint8_t(byte(rng));
  // A step's page table: 5 entries of another sequence, then this one's 17 pages, then 3 more.
  std::vector<int32_t> pool(pool_pages);
  for (int i = 0; i < pool_pages; ++i) pool[size_t(i)] = i;
  std::shuffle(pool.begin(), pool.end(), rng);
  const int page_begin = 5, n = 17, base = 6, table = 25;
  const std::vector<int32_t> pt(pool.begin(), pool.begin() + table);
  uint8_t *dk = nullptr, *dv = nullptr;
  uint16_t *sk = nullptr, *sv = nullptr;
  int32_t *dpt = nullptr, *spt = nullptr;
  const size_t shadow_bytes = size_t(shadow_pages * page_bytes) * 2;
  ASSERT_EQ(cudaMalloc(&dk, k.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dv, v.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&sk, shadow_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&sv, shadow_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dpt, size_t(table) * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&spt, size_t(table) * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dk, k.data(), k.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dv, v.data(), v.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dpt, pt.data(), size_t(table) * 4, cudaMemcpyHostToDevice), cudaSuccess);
  constexpr uint16_t kSentinel = 0x1234;
  std::vector<uint16_t> fill(shadow_bytes / 2, kSentinel), ok_k(fill.size()), ok_v(fill.size());
  const std::vector<int32_t> pt_fill(size_t(table), -7);
  std::vector<int32_t> spt_out(static_cast<size_t>(table));
  for (KvCacheDtype t : {KvCacheDtype::FP8_E4M3, KvCacheDtype::FP8_E5M2}) {
    const int kf = t == KvCacheDtype::FP8_E4M3 ? cuda::kKvE4m3 : cuda::kKvE5m2;
    ASSERT_EQ(cudaMemcpy(sk, fill.data(), shadow_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(sv, fill.data(), shadow_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(spt, pt_fill.data(), size_t(table) * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
    cuda::launch_kv_pages_bf16(kf, dpt, page_begin, n, base, g, dk, dv,
                               reinterpret_cast<cuda::bf16*>(sk),
                               reinterpret_cast<cuda::bf16*>(sv), spt,
                               nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(ok_k.data(), sk, shadow_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(ok_v.data(), sv, shadow_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(spt_out.data(), spt, size_t(table) * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int i = 0; i < table; ++i) {
      const bool mine = i >= page_begin && i < page_begin + n;
      EXPECT_EQ(spt_out[size_t(i)], mine ? base + i - page_begin : -7)
          << "shadow table entry " << i;
    }
    int64_t bad = 0;
    for (int sp = 0; sp < shadow_pages; ++sp) {
      const bool mine = sp >= base && sp < base + n;
      const int64_t src = mine ? int64_t(pt[size_t(page_begin + sp - base)]) * page_bytes : 0;
      for (int64_t e = 0; e < page_bytes; ++e) {
        const size_t at = size_t(sp * page_bytes + e);
        for (int kvi = 0; kvi < 2; ++kvi) {
          const uint16_t got = (kvi == 0 ? ok_k : ok_v)[at];
          bool ok = got == kSentinel;
          if (mine) {
            const float want = kv_fp8_decode((kvi == 0 ? k : v)[size_t(src + e)], t, 1.f);
            ok = std::isnan(want) ? (got & 0x7f80u) == 0x7f80u && (got & 0x7fu) != 0u
                                  : got == uint16_t(std::bit_cast<uint32_t>(want) >> 16);
          }
          if (!ok && bad++ < 5)
            ADD_FAILURE() << kv_cache_dtype_name(t) << (kvi == 0 ? " K" : " V")
                          << ": shadow page " << sp << " element " << e << " holds " << got;
        }
      }
    }
    EXPECT_EQ(bad, 0) << kv_cache_dtype_name(t);
  }
  for (void* p : {static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(sk),
                  static_cast<void*>(sv), static_cast<void*>(dpt), static_cast<void*>(spt)})
    cudaFree(p);
}

// One byte per element on the GPU, so plan_limits fits twice the bf16 pages in a budget.
TEST(CudaKvFp8, PoolCountsOneBytePerElement) {
  REQUIRE_GPU();
  for (KvCacheDtype t : {KvCacheDtype::Auto, KvCacheDtype::FP8_E4M3, KvCacheDtype::FP8_E5M2}) {
    BackendOptions o;
    o.mode = NumericMode::BF16;
    o.kv_cache_dtype = t;
    auto be = make_cuda_backend(o);
    EXPECT_EQ(be->kv_element_bytes(), kv_is_fp8(t) ? 1u : 2u) << kv_cache_dtype_name(t);
  }
  const ModelConfig c = layer_config(32, 2, 128, 4, 16, SparseConfig{});
  EngineOptions eo;
  eo.max_context_len = 4096;
  const size_t budget = size_t(256) << 20;
  const int64_t bf16_pages = plan_limits(c, eo, budget, 0, 2).caches.num_pages;
  const int64_t fp8_pages = plan_limits(c, eo, budget, 0, 1).caches.num_pages;
  EXPECT_GE(fp8_pages, 2 * bf16_pages) << bf16_pages << " bf16 pages";
}

// fp32 mode keeps fp32 caches: an FP8 KV cache there is refused with a message, not run.
TEST(CudaKvFp8, RefusedInFp32Mode) {
  BackendOptions o;
  o.mode = NumericMode::F32;
  o.kv_cache_dtype = KvCacheDtype::FP8_E4M3;
  EXPECT_THROW(make_cuda_backend(o), Error);
}

}  // namespace
}  // namespace sala::test
