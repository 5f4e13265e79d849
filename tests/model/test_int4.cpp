// W4A16 (core/int4.h, backend/cpu/cpu_int4.cpp): the packing order of compressed-tensors'
// pack_to_int32, the RTN recipe, exact dequantization, linear() against the fp32 GEMM of the
// dequantized weight, and the bytes of a W4A16 weight.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "core/int4.h"
#include "core/safetensors.h"
#include "model/gptq.h"

namespace sala {
namespace {

TensorView view_of(const std::vector<float>& v, int64_t rows, int64_t cols) {
  TensorView t;
  t.name = "test";
  t.dtype = DType::F32;
  t.shape = {rows, cols};
  t.data = reinterpret_cast<const uint8_t*>(v.data());
  t.nbytes = v.size() * sizeof(float);
  return t;
}

// pack_to_int32(value, 4): value + 8 as a nibble, column k in bits 4·(k % 8) of word k / 8.
TEST(Int4Pack, CompressedTensorsOrder) {
  const std::vector<int8_t> q = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
  uint32_t words[2];
  int4_pack_row(q.data(), 16, words);
  EXPECT_EQ(words[0], 0x76543210u);
  EXPECT_EQ(words[1], 0xfedcba98u);
  for (int64_t k = 0; k < 16; ++k) EXPECT_EQ(int4_at(words, k), q[size_t(k)]) << k;
}

TEST(Int4Pack, RandomRoundTrip) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> d(kInt4Min, kInt4Max);
  std::vector<int8_t> q(4096);
  for (int8_t& v : q) v = int8_t(d(rng));
  std::vector<uint32_t> words(q.size() / 8);
  int4_pack_row(q.data(), int64_t(q.size()), words.data());
  for (size_t k = 0; k < q.size(); ++k) ASSERT_EQ(int4_at(words.data(), int64_t(k)), q[k]);
}

TEST(Int4Rtn, ScalesAndCodesFollowTheRecipe) {
  // One row, two groups of 8: amax 4.1 -> scale bf16(4.1 / 7.5); an all-zero group -> bf16 eps.
  std::vector<float> w = {3.75f, -3.75f, 1.25f, 0.75f, -0.25f, 0.26f, 2.9f, -4.1f,
                          0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t words[2];
  float scales[2];
  int4_quantize_rtn(w.data(), 1, 16, 8, words, scales);
  EXPECT_EQ(scales[0], round_bf16(4.1f / 7.5f));
  EXPECT_EQ(scales[1], 0.0078125f);
  for (int64_t k = 0; k < 8; ++k) {
    const float r = std::nearbyint(w[size_t(k)] / scales[0]);
    EXPECT_EQ(int4_at(words, k), int(std::fmin(std::fmax(r, -8.f), 7.f))) << k;
  }
  EXPECT_EQ(int4_quantize(2.5f, 1.f), 2);    // ties to even, as torch.round
  EXPECT_EQ(int4_quantize(-3.5f, 1.f), -4);
  EXPECT_EQ(int4_quantize(7.5f, 1.f), 7);    // clamped (8 is out of range)
  EXPECT_EQ(int4_quantize(-9.f, 1.f), -8);
  for (int64_t k = 8; k < 16; ++k) EXPECT_EQ(int4_at(words, k), 0);
}

TEST(Int4Dequantize, ExactProductsBothPaths) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> d(kInt4Min, kInt4Max);
  for (int32_t group : {4, 8, 32}) {  // 4: the per-value path; 8, 32: the per-word one
    const int64_t K = 64;
    std::vector<int8_t> q(static_cast<size_t>(K));
    for (int8_t& v : q) v = int8_t(d(rng));
    std::vector<uint32_t> words(size_t(K / 8));
    int4_pack_row(q.data(), K, words.data());
    std::vector<float> scales(size_t(K / group)), out(static_cast<size_t>(K));
    for (float& s : scales) s = round_bf16(std::ldexp(float(rng() % 1000 + 1), -12));
    int4_dequantize_row(words.data(), scales.data(), K, group, out.data());
    for (int64_t k = 0; k < K; ++k)
      EXPECT_EQ(out[size_t(k)], float(q[size_t(k)]) * scales[size_t(k / group)]) << group;
  }
}

// linear() = x · dequantized(W)ᵀ in fp32: against a double-precision sum of the same products.
TEST(Int4Linear, MatchesTheDequantizedGemm) {
  const int64_t T = 5, K = 256, N = 70;  // N > 64: two weight-row blocks
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(size_t(N * K)), x(size_t(T * K));
  for (float& v : w) v = nd(rng) * 0.05f;
  for (float& v : x) v = nd(rng);
  BackendOptions bo{NumericMode::F32, 1};
  bo.int4_group_size = 128;
  auto be = make_backend("cpu", bo);
  ASSERT_EQ(be->linear_format(), WeightFormat::INT4_GROUPED);
  const Weight wt = be->upload_linear(view_of(w, N, K), WeightFormat::INT4_GROUPED);
  ASSERT_EQ(wt.format, WeightFormat::INT4_GROUPED);
  EXPECT_EQ(wt.nbytes(), size_t(N * K / 2 + N * (K / 128) * 4));
  EXPECT_EQ(Weight::storage_bytes(WeightFormat::INT4_GROUPED, 4096, 16384, 128),
            size_t(4096) * 16384 / 2 + size_t(4096) * 128 * 4);
  const Int4Codes rtn = rtn_quantize(w.data(), N, K, 128);  // the same codes as at load
  ASSERT_EQ(0, std::memcmp(rtn.words.data(), wt.data, rtn.words.size() * 4));
  ASSERT_EQ(0, std::memcmp(rtn.scales.data(), wt.scales, rtn.scales.size() * 4));
  const std::vector<float> deq = int4_dequantize(rtn, N, K);
  Tensor xt = be->alloc(T, K, DType::F32), yt = be->alloc(T, N, DType::F32);
  std::memcpy(xt.data, x.data(), x.size() * 4);
  be->linear(xt, wt, yt);
  std::vector<float> y(size_t(T * N));
  be->download_f32(yt, y.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        ref += double(x[size_t(t * K + k)]) * deq[size_t(n * K + k)];
        mag += std::fabs(double(x[size_t(t * K + k)]) * deq[size_t(n * K + k)]);
      }
      EXPECT_NEAR(y[size_t(t * N + n)], ref, 1e-6 * mag + 1e-30) << t << "," << n;
    }
}

TEST(Int4Linear, RefusedWhereTheGroupDoesNotDivide) {
  BackendOptions bo{NumericMode::F32, 1};
  bo.int4_group_size = 128;
  auto be = make_backend("cpu", bo);
  std::vector<float> w(size_t(4 * 96), 0.5f);
  try {
    be->upload_linear(view_of(w, 4, 96), WeightFormat::INT4_GROUPED);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group size 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sala
