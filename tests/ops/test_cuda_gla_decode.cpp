// The lightning decode form (GlaArgs::one_token: gla_one_token_kernel, cuda_lightning.cu)
// against the recurrent kernel it stands in for (the CPU comparisons of both are the lightning
// and CudaFused.LightningQkAttention* tests): the same inputs on two copies, then o, every
// state slot and, through launch_gla_norm_rope, q and k (normalised and rotated in place)
// compared bit for bit.
//
//   BitExact   bf16 and fp32; d = 16 / 32 / 64 / 128 (one block per head and sequence for
//              d <= 32, 2 / 4 with the q/k write-back ticket above); nh 3; 1 / 3 / 16 calls
//              listed in another order than their rows; zero (past_len 0) and carried states;
//              in place and to another slot (speculative verify's dst); with and without the
//              q/k norm + RoPE; two calls back to back (the tickets are zero again after each)
// Without a GPU every test GTEST_SKIPs (cuda_test_util.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "cuda_fp8_fused_util.h"  // Dev, first_diff, CUDA_OK
#include "cuda_test_util.h"

namespace sala::test {
namespace {

// n calls of one token each; call i is row i, listed in reverse order. Slot layout: slots
// [0, n) hold the calls' states (call i: slot i; odd calls past_len 0, so their slot's values
// are ignored), slots [n, 2n) are destinations (calls with i % 3 == 1 write slot n + i).
template <typename T>
void run_case(int d, int n, bool norm_rope, uint32_t seed) {
  constexpr bool kF32 = std::is_same_v<T, float>;
  const int nh = 3, L = 2, li = 1;
  const int64_t C = int64_t(nh) * d, slots = 2 * n;
  const int64_t slot_floats = int64_t(L) * nh * d * d, esz = kF32 ? 4 : 2;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto act = [&](int64_t count, float sc, float mean) {  // T values as bytes
    std::vector<uint8_t> b(size_t(count * esz));
    for (int64_t i = 0; i < count; ++i) {
      const float f = mean + sc * nd(rng);
      if constexpr (kF32)
        std::memcpy(b.data() + i * 4, &f, 4);
      else {
        const uint16_t h = f32_to_bf16(f);
        std::memcpy(b.data() + i * 2, &h, 2);
      }
    }
    return b;
  };
  const auto hq = act(n * C, 2.f, 0.f), hk = act(n * C, 1.f, 0.f), hv = act(n * C, 1.f, 0.f);
  const auto hqn = act(d, 0.2f, 1.f), hkn = act(d, 0.2f, 1.f);
  std::vector<float> hs(size_t(slots * slot_floats));
  for (float& x : hs) x = 0.3f * nd(rng);
  std::vector<float> decay(size_t(nh) * cuda::kGlaDecayStride, 0.f);
  for (int h = 0; h < nh; ++h) decay[size_t(h) * cuda::kGlaDecayStride + 1] = 0.9f + 0.03f * h;
  std::vector<float> inv_freq(static_cast<size_t>(d / 2));
  for (int i = 0; i < d / 2; ++i) inv_freq[size_t(i)] = float(std::pow(10000.0, -2.0 * i / d));
  std::vector<int32_t> pos(static_cast<size_t>(n)), list(static_cast<size_t>(n));
  std::vector<cuda::DevSeq> seqs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    pos[size_t(i)] = 1000 + 37 * i + (i % 2 ? 130000 : 0);
    list[size_t(i)] = n - 1 - i;
    cuda::DevSeq& s = seqs[size_t(i)];
    s = cuda::DevSeq{};
    s.token_begin = i;
    s.num_tokens = 1;
    s.state_slot = i;
    s.state_dst_slot = i % 3 == 1 ? n + i : i;
    s.split_row = -1;
    s.past_len = i % 2 ? 0 : 100 + i;
  }
  const Dev dseqs(seqs.size() * sizeof(cuda::DevSeq), seqs.data()),
      dlist(list.size() * 4, list.data()), dpos(pos.size() * 4, pos.data()),
      ddecay(decay.size() * 4, decay.data()), dinv(inv_freq.size() * 4, inv_freq.data()),
      dqn(hqn.size(), hqn.data()), dkn(hkn.size(), hkn.data()),
      tickets(size_t(16 * nh) * 4);
  CUDA_OK(cudaMemset(tickets.p, 0, tickets.n));
  struct Run {
    Dev q, k, v, o, s;
  };
  auto make = [&] {
    return Run{Dev(hq.size(), hq.data()), Dev(hk.size(), hk.data()), Dev(hv.size(), hv.data()),
               Dev(size_t(n * C * esz)), Dev(hs.size() * 4, hs.data())};
  };
  Run ref = make(), dec = make();
  for (Run* r : {&ref, &dec}) CUDA_OK(cudaMemset(r->o.p, 0, r->o.n));
  auto launch = [&](Run& r, bool one_token) {
    cuda::GlaArgs<T> a;
    a.q = r.q.template as<T>();
    a.k = r.k.template as<T>();
    a.v = r.v.template as<T>();
    a.stride = C;
    a.seqs = dseqs.template as<cuda::DevSeq>();
    a.states = r.s.template as<float>();
    a.slot_stride = slot_floats;
    a.layer_off = int64_t(li) * nh * d * d;
    a.decay = ddecay.template as<float>();
    a.scale = 0.125f;
    a.out = r.o.template as<T>();
    a.ostride = C;
    a.nh = nh;
    a.one_token = one_token;
    if (norm_rope) {
      const cuda::GlaNormRope<T> nr{dqn.template as<T>(), dkn.template as<T>(), 1e-6f,
                                    dpos.template as<int32_t>(), dinv.template as<float>(),
                                    tickets.template as<unsigned>()};
      ASSERT_TRUE(cuda::launch_gla_norm_rope<T>(d, a, nr, dlist.template as<int32_t>(), n, 0));
    } else {
      ASSERT_TRUE(cuda::launch_gla<T>(d, a, dlist.template as<int32_t>(), n, nullptr, 0, 0));
    }
  };
  const std::string name = std::string(kF32 ? "fp32" : "bf16") + " d" + std::to_string(d) +
                           " n" + std::to_string(n) + (norm_rope ? " norm+rope" : "");
  for (int call = 0; call < 2; ++call) {  // the second call: on the first one's outputs
    launch(ref, false);
    launch(dec, true);
    CUDA_OK(cudaDeviceSynchronize());
    const std::string c = name + " call " + std::to_string(call);
    EXPECT_EQ(first_diff(ref.o.get(ref.o.n), dec.o.get(dec.o.n)), -1) << c << ": o differs";
    EXPECT_EQ(first_diff(ref.s.get(ref.s.n), dec.s.get(dec.s.n)), -1) << c << ": states differ";
    EXPECT_EQ(first_diff(ref.q.get(ref.q.n), dec.q.get(dec.q.n)), -1) << c << ": q differs";
    EXPECT_EQ(first_diff(ref.k.get(ref.k.n), dec.k.get(dec.k.n)), -1) << c << ": k differs";
    EXPECT_EQ(tickets.get(tickets.n), std::vector<uint8_t>(tickets.n, 0)) << c << ": tickets";
  }
}

TEST(CudaGlaDecode, BitExact) {
  REQUIRE_GPU();
  uint32_t seed = 4500;
  for (int d : {16, 32, 64, 128})
    for (int n : {1, 3, 16})
      for (bool norm_rope : {false, true}) {
        run_case<cuda::bf16>(d, n, norm_rope, seed++);
        run_case<float>(d, n, norm_rope, seed++);
      }
}

}  // namespace
}  // namespace sala::test
