// `sala bench serve`'s roofline (cli/serve_roofline.cpp): the prefill part reproduces `bench
// offline`'s long-prefill floor, decode steps follow the concurrency, FP8 lowers both parts.
#include <gtest/gtest.h>

#include "cli/bench_floors.h"
#include "cli/serve_roofline.h"
#include "core/error.h"

namespace sala::cli {
namespace {

RooflineModel nine_b(const std::string& q = "") {
  RooflineModel m;
  m.cfg = load_model_config(SALA_9B_CONFIG);
  m.quantization = q;
  return m;
}

TEST(ServeRoofline, PrefillIsTheLongPrefillFloor) {
  // Issue 18 quotes the bf16 floor of a 131,072-token prefill in 8,192-token chunks: 3.14 s.
  const ServeRoofline r = serve_roofline(nine_b(), {131072}, {1}, 1);
  EXPECT_NEAR(r.prefill_s, 3.14, 0.01);
  EXPECT_EQ(r.decode_s, 0.0);  // the only token comes from the prefill
}

TEST(ServeRoofline, DecodeStepsFollowTheConcurrency) {
  const RooflineModel m = nine_b();
  const std::vector<int64_t> in(8, 4096), out = {101, 101, 101, 101, 101, 101, 101, 501};
  const ServeRoofline s1 = serve_roofline(m, in, out, 1), s8 = serve_roofline(m, in, out, 8),
                      inf = serve_roofline(m, in, out, 0), s2 = serve_roofline(m, in, out, 2);
  EXPECT_EQ(s1.prefill_s, inf.prefill_s);
  // c = 1: every answer's steps (7 x 100 + 500); c = 8 and unbounded: the longest answer's
  // 500; c = 2: 1,200 / 2. The sequences' own reads are the same in every tier.
  const double step = (s1.decode_s - inf.decode_s) / (1200 - 500);
  EXPECT_GT(step, 0.004);  // ~18 GB of bf16 weights at 4.3 TB/s
  EXPECT_LT(step, 0.0045);
  EXPECT_NEAR(s8.decode_s, inf.decode_s, 1e-12);
  EXPECT_NEAR(s2.decode_s - inf.decode_s, step * (600 - 500), 1e-9);
}

TEST(ServeRoofline, Fp8LowersBothParts) {
  const std::vector<int64_t> in = {32768, 65536}, out = {64, 64};
  const ServeRoofline b = serve_roofline(nine_b(), in, out, 1);
  const ServeRoofline f = serve_roofline(nine_b("fp8"), in, out, 1);
  EXPECT_LT(f.prefill_s, 0.8 * b.prefill_s);
  EXPECT_LT(f.decode_s, 0.6 * b.decode_s);
  EXPECT_THROW(serve_roofline(nine_b("int3"), in, out, 1), sala::Error);
}

}  // namespace
}  // namespace sala::cli
