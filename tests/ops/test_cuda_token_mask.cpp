// Structured output's token mask on the device (CudaBackend::mask_logits, cuda_token_mask.cu)
// against its host twin (mask_logits_row, which the CPU backend runs): the same logits must
// come back bit for bit, for vocabularies that are and are not multiples of 32, masks with
// whole-word runs (allowed and refused) and single bits, a subset of the rows in any order,
// and the greedy pick after masking must be an allowed token. Part of test_cuda_ops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/token_mask.h"
#include "cuda_test_util.h"

namespace sala::test {
namespace {

TEST(CudaOps, MaskLogitsEqualsHostTwin) {
  REQUIRE_GPU();
  for (int64_t V : {int64_t(800), int64_t(801), int64_t(73448)}) {
    const int64_t R = 9;
    const int32_t words = int32_t((V + 31) / 32);
    Pair p(NumericMode::F32);
    const HostMatF32 x = randn_f32(R, V, uint32_t(V), 3.f);
    auto logits = p.up(x);
    // Rows 7, 0, 3 (out of order), each mask another pattern.
    const std::vector<int32_t> rows = {7, 0, 3};
    std::vector<uint32_t> masks(rows.size() * size_t(words));
    std::mt19937 rng{uint32_t(V)};
    for (int32_t w = 0; w < words; ++w) {
      masks[size_t(w)] = rng();                                  // random bits
      masks[size_t(words + w)] = (w % 3 == 0) ? ~0u : 0u;        // whole words on / off
      masks[size_t(2 * words + w)] = w == words / 2 ? 1u << 5 : 0u;  // exactly one token
    }
    p.cpu->mask_logits(logits.c, rows.data(), int64_t(rows.size()), masks.data(), words);
    p.gpu->mask_logits(logits.g, rows.data(), int64_t(rows.size()), masks.data(), words);
    auto [cpu, gpu] = p.download(logits);
    // The host twin applied to the input directly.
    std::vector<float> ref = x.v;
    for (size_t i = 0; i < rows.size(); ++i)
      mask_logits_row(ref.data() + rows[i] * V, V, masks.data() + i * size_t(words), words);
    int64_t neg_inf = 0;
    for (size_t j = 0; j < ref.size(); ++j) {
      ASSERT_EQ(std::memcmp(&gpu[j], &ref[j], 4), 0) << "V " << V << " at " << j;
      ASSERT_EQ(std::memcmp(&cpu[j], &ref[j], 4), 0) << "V " << V << " at " << j;
      neg_inf += std::isinf(ref[j]);
    }
    EXPECT_GT(neg_inf, V);  // the masks did mask
    std::vector<int32_t> picks(static_cast<size_t>(R));
    p.gpu->argmax_rows(logits.g, picks.data());
    EXPECT_EQ(picks[3], int32_t(words / 2) * 32 + 5) << "the one allowed token of row 3";
    for (size_t i = 0; i < rows.size(); ++i) {
      const int32_t t = picks[size_t(rows[i])];
      EXPECT_TRUE((masks[i * size_t(words) + size_t(t / 32)] >> (t % 32)) & 1u) << "row " << rows[i];
    }
  }
}

}  // namespace
}  // namespace sala::test
