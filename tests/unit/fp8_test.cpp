// core/fp8.h against the formats' definitions (OCP OFP8 rev. 1.0; torch.float8_e4m3fn and
// torch.float8_e5m2), computed here independently of the header: every code decoded, every code
// round-tripped, every rounding boundary between adjacent codes, overflow, NaN, and a sweep of
// fp32 values against a brute-force nearest-value search.
#include "core/fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace sala {
namespace {

struct Format {
  const char* name;
  int exp_bits, man_bits, bias;
  bool has_inf;           // e5m2: S.11111.00 is inf; e4m3fn has none
  uint8_t max_code;       // largest finite magnitude code
  uint8_t overflow_code;  // what a finite overflow gives: 0x7e (saturate) or 0x7c (inf)
  float max;
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
};

const Format kE4m3{"e4m3fn",       4, 3, 7, false, 0x7e, 0x7e, kFp8E4m3Max, fp8_e4m3_to_f32,
                   f32_to_fp8_e4m3};
const Format kE5m2{"e5m2",         5, 2, 15, true, 0x7b, 0x7c, kFp8E5m2Max, fp8_e5m2_to_f32,
                   f32_to_fp8_e5m2};
const Format* const kFormats[] = {&kE4m3, &kE5m2};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

enum class Kind { Finite, Inf, NaN };

// The value of code c by the format's definition: (-1)^S * 2^(E - bias) * (1 + M / 2^man_bits),
// subnormals (E = 0) 2^(1 - bias) * (M / 2^man_bits); e4m3fn's S.1111.111 is NaN, e5m2's
// all-ones exponent is inf (M = 0) or NaN.
Kind reference(const Format& f, uint8_t c, double* value) {
  const int s = c >> 7;
  const int e = (c >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int m = c & ((1 << f.man_bits) - 1);
  const int emax_field = (1 << f.exp_bits) - 1;
  const double frac = double(m) / double(1 << f.man_bits);
  *value = 0;
  if (f.has_inf && e == emax_field) {
    *value = s ? -INFINITY : INFINITY;
    return m == 0 ? Kind::Inf : Kind::NaN;
  }
  if (!f.has_inf && e == emax_field && m == (1 << f.man_bits) - 1) return Kind::NaN;
  const double mag = e == 0 ? std::ldexp(frac, 1 - f.bias) : std::ldexp(1 + frac, e - f.bias);
  *value = s ? -mag : mag;
  return Kind::Finite;
}

// Rounding with an unbounded exponent, by search: the nearest of the finite positive values
// (codes 0..max_code) and the would-be next step above the largest (2^(emax+1), code max_code+1),
// ties to the even code; then the format's overflow rule. |x| only; the sign is added after.
uint8_t nearest_by_search(const Format& f, double x) {
  std::vector<double> vals;
  for (int c = 0; c <= f.max_code; ++c) {
    double v;
    reference(f, uint8_t(c), &v);
    vals.push_back(v);
  }
  // The phantom step: max + its ulp, 480 (e4m3fn: where S.1111.111 would be) / 65536 (e5m2).
  vals.push_back(double(f.max) + std::ldexp(1.0, std::ilogb(f.max) - f.man_bits));
  const auto it = std::lower_bound(vals.begin(), vals.end(), x);
  int c;
  if (it == vals.end()) {
    c = int(vals.size()) - 1;
  } else if (it == vals.begin() || *it == x) {
    c = int(it - vals.begin());
  } else {
    const int hi = int(it - vals.begin()), lo = hi - 1;
    const double dlo = x - vals[lo], dhi = vals[hi] - x;
    c = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  }
  return c > f.max_code ? f.overflow_code : uint8_t(c);
}

// A spread of positive fp32 values from the smallest subnormal to +inf: every 4093rd bit pattern
// (a prime stride, so the low mantissa bits vary), plus every value exactly representable in
// either format and their neighbours.
std::vector<float> sweep() {
  std::vector<float> xs;
  for (uint32_t u = 1; u < 0x7f800000u; u += 4093) xs.push_back(from_bits(u));
  for (const Format* f : kFormats)
    for (int c = 0; c <= f->max_code; ++c) {
      const float v = f->decode(uint8_t(c));
      xs.push_back(v);
      xs.push_back(std::nextafter(v, 0.f));
      xs.push_back(std::nextafter(v, INFINITY));
    }
  xs.push_back(std::numeric_limits<float>::max());
  xs.push_back(INFINITY);
  return xs;
}

TEST(Fp8, DecodeEveryCodeMatchesTheDefinition) {
  for (const Format* f : kFormats) {
    int nans = 0, infs = 0;
    for (int c = 0; c < 256; ++c) {
      SCOPED_TRACE(testing::Message() << f->name << " code 0x" << std::hex << c);
      double want;
      const Kind k = reference(*f, uint8_t(c), &want);
      const float got = f->decode(uint8_t(c));
      EXPECT_EQ(std::signbit(got), c >= 0x80);  // also for zeros and NaNs
      if (k == Kind::NaN) {
        ++nans;
        EXPECT_TRUE(std::isnan(got));
      } else {
        infs += k == Kind::Inf;
        EXPECT_EQ(double(got), want);  // exact: every code is an fp32 value
      }
    }
    // e4m3fn: 0x7f, 0xff; e5m2: S.11111.{01,10,11}.
    EXPECT_EQ(nans, f->has_inf ? 6 : 2) << f->name;
    EXPECT_EQ(infs, f->has_inf ? 2 : 0) << f->name;
    EXPECT_EQ(f->decode(f->max_code), f->max) << f->name;
    EXPECT_EQ(f->decode(0x01), std::ldexp(1.f, 1 - f->bias - f->man_bits)) << f->name;
  }
  EXPECT_EQ(kFp8E4m3Max, 448.f);
  EXPECT_EQ(kFp8E5m2Max, 57344.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.f, -9));
  EXPECT_EQ(fp8_e5m2_to_f32(0x01), std::ldexp(1.f, -16));
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x3c), 1.f);
}

TEST(Fp8, EncodeOfDecodeIsTheIdentityOnEveryNonNanCode) {
  for (const Format* f : kFormats)
    for (int c = 0; c < 256; ++c) {
      const float v = f->decode(uint8_t(c));
      if (std::isnan(v)) continue;
      EXPECT_EQ(f->encode(v), c) << f->name << " code 0x" << std::hex << c << " value " << v;
    }
  // The sign of zero is kept, also for negatives too small to round away from zero.
  EXPECT_EQ(f32_to_fp8_e4m3(-0.f), 0x80);
  EXPECT_EQ(f32_to_fp8_e5m2(-0.f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(-1e-30f), 0x80);
  EXPECT_EQ(f32_to_fp8_e5m2(-1e-30f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(from_bits(0x80000001u)), 0x80);  // fp32 subnormals
  EXPECT_EQ(f32_to_fp8_e5m2(from_bits(0x00000001u)), 0x00);
}

// Between every two adjacent finite codes (both signs; zero and the smallest subnormal included):
// just below the midpoint rounds to the lower magnitude, just above to the upper, the midpoint
// itself to the code with the even mantissa (bit 0 of the code).
TEST(Fp8, RoundsToNearestWithTiesToEvenBetweenEveryAdjacentPair) {
  for (const Format* f : kFormats)
    for (int c = 0; c < f->max_code; ++c) {
      SCOPED_TRACE(testing::Message()
                   << f->name << " codes 0x" << std::hex << c << ", 0x" << c + 1);
      const float lo = f->decode(uint8_t(c)), hi = f->decode(uint8_t(c + 1));
      ASSERT_LT(lo, hi);
      const float mid = (lo + hi) / 2;
      ASSERT_EQ(double(mid), (double(lo) + double(hi)) / 2);  // the midpoint is an fp32 value
      const uint8_t even = (c % 2 == 0) ? uint8_t(c) : uint8_t(c + 1);
      for (const float s : {1.f, -1.f}) {
        const uint8_t sb = s < 0 ? 0x80 : 0;
        EXPECT_EQ(f->encode(s * std::nextafter(mid, lo)), c | sb) << "just below, sign " << s;
        EXPECT_EQ(f->encode(s * std::nextafter(mid, hi)), (c + 1) | sb) << "just above, sign " << s;
        EXPECT_EQ(f->encode(s * mid), even | sb) << "midpoint, sign " << s;
        EXPECT_EQ(f->encode(s * std::nextafter(lo, hi)), c | sb);
        EXPECT_EQ(f->encode(s * std::nextafter(hi, lo)), (c + 1) | sb);
      }
    }
}

// e4m3fn saturates at ±448 (compressed-tensors / vLLM clamp to finfo.max before the cast);
// e5m2 overflows to ±inf as IEEE 754 does. 480 / 65536 are the would-be next steps.
TEST(Fp8, E4m3SaturatesBeyondTheLargestFiniteValue) {
  const float above[] = {448.f,   std::nextafter(448.f, 1e9f),
                         449.f,   std::nextafter(464.f, 0.f),
                         464.f,   std::nextafter(464.f, 1e9f),
                         479.f,   480.f,
                         481.f,   512.f,
                         1e6f,    std::numeric_limits<float>::max(),
                         INFINITY};
  for (const float x : above) {
    EXPECT_EQ(f32_to_fp8_e4m3(x), 0x7e) << x;
    EXPECT_EQ(f32_to_fp8_e4m3(-x), 0xfe) << -x;
    EXPECT_EQ(round_fp8_e4m3(x), 448.f) << x;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(432.f, 0.f)), 0x7d);  // 416 | 448 midpoint: 432
  EXPECT_EQ(f32_to_fp8_e4m3(432.f), 0x7e);                       // tie to even 0x7e
}

TEST(Fp8, E5m2OverflowsToInfinityAsIeee) {
  const float finite[] = {57344.f, std::nextafter(57344.f, 1e9f), 60000.f,
                          std::nextafter(61440.f, 0.f)};
  for (const float x : finite) {
    EXPECT_EQ(f32_to_fp8_e5m2(x), 0x7b) << x;
    EXPECT_EQ(f32_to_fp8_e5m2(-x), 0xfb) << -x;
  }
  // From the midpoint 61440 (ties to the even code 0x7c, which is inf) upwards.
  const float overflow[] = {61440.f, std::nextafter(61440.f, 1e9f),     65535.f, 65536.f,
                            1e6f,    std::numeric_limits<float>::max(), INFINITY};
  for (const float x : overflow) {
    EXPECT_EQ(f32_to_fp8_e5m2(x), 0x7c) << x;
    EXPECT_EQ(f32_to_fp8_e5m2(-x), 0xfc) << -x;
    EXPECT_EQ(round_fp8_e5m2(x), INFINITY) << x;
    EXPECT_EQ(round_fp8_e5m2(-x), -INFINITY) << -x;
  }
}

TEST(Fp8, NanGivesTheAllOnesNanCodeWithItsSign) {
  const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fffffffu, 0x7fc12345u};
  for (const uint32_t n : nans) {
    for (const uint32_t sign : {0u, 0x80000000u}) {
      const float x = from_bits(n | sign);
      ASSERT_TRUE(std::isnan(x));
      const uint8_t sb = sign ? 0x80 : 0;
      EXPECT_EQ(f32_to_fp8_e4m3(x), 0x7f | sb) << std::hex << (n | sign);
      EXPECT_EQ(f32_to_fp8_e5m2(x), 0x7f | sb) << std::hex << (n | sign);
      EXPECT_TRUE(std::isnan(round_fp8_e4m3(x)));
      EXPECT_TRUE(std::isnan(round_fp8_e5m2(x)));
      EXPECT_EQ(std::signbit(round_fp8_e4m3(x)), sign != 0);
      EXPECT_EQ(std::signbit(round_fp8_e5m2(x)), sign != 0);
    }
  }
}

// Half a million fp32 values of every magnitude, both signs, against the brute-force search.
TEST(Fp8, EncodeMatchesNearestValueSearchOverAnFp32Sweep) {
  const std::vector<float> xs = sweep();
  for (const Format* f : kFormats) {
    int failures = 0;
    for (const float x : xs) {
      const uint8_t want = nearest_by_search(*f, double(x));
      const uint8_t got = f->encode(x), got_neg = f->encode(-x);
      if ((got != want || got_neg != (want | 0x80)) && ++failures <= 10)
        ADD_FAILURE() << f->name << " x=" << x << " (bits 0x" << std::hex << bits(x) << "): got 0x"
                      << int(got) << " / -x 0x" << int(got_neg) << ", want 0x" << int(want);
    }
    EXPECT_EQ(failures, 0) << f->name << " of " << xs.size();
  }
}

}  // namespace
}  // namespace sala

namespace sala {
namespace {

// A matrix large enough for fp8_quantize_rows to split its rows over threads gives, row by
// row, what the one-row recipe (fp8_row_scale, then f32_to_fp8_e4m3 of v / scale) gives.
TEST(Fp8, QuantizeRowsOverThreadsEqualsTheRowRecipe) {
  const int64_t rows = 1031, cols = 4096;  // 4.2 M values: several threads where cores allow
  std::vector<float> v(size_t(rows * cols));
  uint32_t state = 12345;
  for (float& x : v) {
    state = state * 1664525u + 1013904223u;
    x = (float(state >> 8) / float(1 << 24) - 0.5f) * std::ldexp(1.f, int(state % 13) - 6);
  }
  std::fill(v.begin() + 7 * cols, v.begin() + 8 * cols, 0.f);  // a zero row: scale 1
  std::vector<uint8_t> codes(v.size());
  std::vector<float> scales(static_cast<size_t>(rows));
  fp8_quantize_rows(v.data(), rows, cols, codes.data(), scales.data());
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float s = fp8_row_scale(v.data() + r * cols, cols);
    bad += s != scales[size_t(r)];
    for (int64_t c = 0; c < cols; ++c)
      bad += f32_to_fp8_e4m3(v[size_t(r * cols + c)] / s) != codes[size_t(r * cols + c)];
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(scales[7], 1.f);
}

}  // namespace
}  // namespace sala
