// core/fp8_quotient.h: the division-free quotient of the GPU's FP8 code kernels gives the codes
// of the IEEE division x / s (core/fp8.h's recipe) for the rows it is claimed for. The claim was
// checked over all ~1.07e9 (amax, x) pairs of bf16 values once (PERF_LOG, session 55: 0 codes
// differ for amax >= 2^-104, 987,280 below); here every amax against a stride of x values, so
// that the test stays fast under the sanitizers.
#include "core/fp8_quotient.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/fp8.h"

namespace sala {
namespace {

float bf16_value(uint32_t bits) { return std::bit_cast<float>(bits << 16); }

struct RowScale {
  float s, r;
};
RowScale row_scale(float amax) {
  const float s = amax > 0.f ? amax / kFp8E4m3Max : 1.f;
  return {s, 1.f / s};
}

// Codes of x / s and of fp8_quotient for the bf16 x with |x| <= amax at bit patterns
// 0, stride, 2 stride, ... (both signs); returns how many differ.
int64_t differing_codes(float amax, uint32_t stride, int64_t* checked) {
  const RowScale rs = row_scale(amax);
  int64_t bad = 0;
  for (uint32_t b = 0; b <= 0x7f80u; b += stride) {
    const float m = bf16_value(b);
    if (m > amax) break;
    for (const float x : {m, -m}) {
      bad += f32_to_fp8_e4m3(fp8_quotient(x, rs.s, rs.r)) != f32_to_fp8_e4m3(x / rs.s);
      ++*checked;
    }
  }
  return bad;
}

TEST(Fp8Quotient, CodesEqualTheDivisionForEveryClaimedRowScale) {
  int64_t bad = 0, checked = 0, rows = 0;
  for (uint32_t a = 1; a < 0x7f80u; ++a) {  // every positive finite bf16 amax
    const float amax = bf16_value(a);
    if (!fp8_quotient_exact_for(amax)) continue;
    ++rows;
    bad += differing_codes(amax, 29, &checked);
    // The row's own largest values too (x = amax gives the code 448 exactly).
    const RowScale rs = row_scale(amax);
    for (uint32_t b = a > 8 ? a - 8 : 0; b <= a; ++b)
      for (const float x : {bf16_value(b), -bf16_value(b)}) {
        bad += f32_to_fp8_e4m3(fp8_quotient(x, rs.s, rs.r)) != f32_to_fp8_e4m3(x / rs.s);
        ++checked;
      }
  }
  EXPECT_EQ(bad, 0) << "of " << checked << " pairs";
  EXPECT_EQ(rows, 0x7f80 - 0x0b80);  // bf16 patterns 2^-104 (0x0b80) .. the largest finite
  EXPECT_GT(checked, 30'000'000);
}

// The bound is needed: below 2^-104 the quotient does give other codes (the largest such
// amax is 0x1.54p-105), and those rows are not claimed.
TEST(Fp8Quotient, RowsBelowTheBoundAreNotClaimedAndDoDiffer) {
  EXPECT_FALSE(fp8_quotient_exact_for(0x1.54p-105f));
  EXPECT_TRUE(fp8_quotient_exact_for(0x1p-104f));
  EXPECT_TRUE(fp8_quotient_exact_for(0.f));  // s = 1: x / 1 = x
  EXPECT_FALSE(fp8_quotient_exact_for(INFINITY));
  EXPECT_FALSE(fp8_quotient_exact_for(NAN));
  int64_t checked = 0;
  EXPECT_GT(differing_codes(0x1.54p-105f, 1, &checked), 0);
}

TEST(Fp8Quotient, KeepsTheSignOfZeroAndPassesNan) {
  const RowScale rs = row_scale(3.f);
  EXPECT_TRUE(std::signbit(fp8_quotient(-0.f, rs.s, rs.r)));
  EXPECT_FALSE(std::signbit(fp8_quotient(0.f, rs.s, rs.r)));
  EXPECT_TRUE(std::isnan(fp8_quotient(NAN, rs.s, rs.r)));
  EXPECT_EQ(fp8_quotient(1.f, 1.f, 1.f), 1.f);
}

}  // namespace
}  // namespace sala
