// Shared harness of the CUDA op tests (see cuda_test_util.h). Compiled into each test
// binary, so each prints its own table of measured errors.
#include "cuda_test_util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>

#include "core/dtype.h"
#include "core/int4.h"

namespace sala::test {

bool gpu_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<Stat>& stats() {
  static std::vector<Stat> s;
  return s;
}

double bf16_ulp(double r) {
  r = std::abs(r);
  if (r < 1e-30) return 1e-30;
  return std::ldexp(1.0, int(std::floor(std::log2(r))) - 7);
}

Stat compare(const std::string& name, const std::vector<float>& e, const std::vector<float>& r) {
  Stat s;
  s.name = name;
  s.n = int64_t(r.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double d = std::abs(double(e[i]) - double(r[i]));
    if (!std::isfinite(e[i]) || !(d == d)) {
      s.max_abs = INFINITY;
      s.max_ulp = INFINITY;
      ++s.ndiff;
      continue;
    }
    s.max_abs = std::max(s.max_abs, d);
    s.max_ref = std::max(s.max_ref, std::abs(double(r[i])));
    if (d > 0) {
      ++s.ndiff;
      s.max_ulp = std::max(s.max_ulp, d / bf16_ulp(std::max(std::abs(double(r[i])), 1e-3)));
    }
    num += d * d;
    den += double(r[i]) * r[i];
  }
  s.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  stats().push_back(s);
  return s;
}

Tensor upload_checkpoint(Backend& be, DType dt, int64_t rows, int64_t cols, const void* data) {
  TensorView v;
  v.name = "test";
  v.dtype = dt;
  v.shape = {rows, cols};
  v.data = static_cast<const uint8_t*>(data);
  v.nbytes = size_t(rows * cols) * dtype_size(dt);
  return be.upload_weight(v);
}

Int4Host int4_rtn(const HostMat& h, int32_t group) {
  Int4Host q{h.rows, h.cols, group, std::vector<uint32_t>(size_t(h.rows * h.cols / kInt4PerWord)),
             std::vector<float>(size_t(h.rows * (h.cols / group)))};
  const std::vector<float> f = h.f32();
  int4_quantize_rtn(f.data(), h.rows, h.cols, group, q.words.data(), q.scales.data());
  return q;
}

Weight upload_int4_host(Backend& be, const Int4Host& q) {
  TensorView v;
  v.name = "int4 test weight";
  v.dtype = DType::I32;
  v.shape = {q.rows, q.cols / kInt4PerWord};
  v.data = reinterpret_cast<const uint8_t*>(q.words.data());
  v.nbytes = q.words.size() * 4;
  return be.upload_int4(v, q.scales, q.group);
}

void expect_same_bits(Backend& ba, const Tensor& a, Backend& bb, const Tensor& b,
                      const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  std::vector<float> x(size_t(a.numel())), y(size_t(b.numel()));
  ba.download_f32(a, x.data());
  bb.download_f32(b, y.data());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * 4)) << what << ": bits differ";
}

void expect_ulp(const Stat& s, double ulps, double frac) {
  EXPECT_LE(s.max_ulp, ulps) << s.name;
  EXPECT_LE(double(s.ndiff), frac * double(s.n) + 0.5)
      << s.name << ": " << s.ndiff << " of " << s.n;
}

void expect_close(const Stat& s, double rel_l2, double rel_max) {
  EXPECT_LE(s.rel_l2, rel_l2) << s.name;
  EXPECT_LE(s.max_abs, rel_max * s.max_ref)
      << s.name << " max_abs " << s.max_abs << " max_ref " << s.max_ref;
}

namespace {
class PrintTable : public ::testing::Environment {
 public:
  void TearDown() override {
    if (stats().empty()) return;
    std::printf("\n%-52s %9s %9s %10s %10s %9s %8s\n", "op (shape)", "elements", "differ",
                "max_abs", "rel_max", "rel_l2", "max_ulp");
    for (const Stat& s : stats())
      std::printf("%-52s %9lld %9lld %10.3g %10.3g %9.2g %8.2g\n", s.name.c_str(), (long long)s.n,
                  (long long)s.ndiff, s.max_abs, s.max_abs / std::max(s.max_ref, 1e-30), s.rel_l2,
                  s.max_ulp);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new PrintTable);
}  // namespace

std::vector<float> HostMat::f32() const {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = bf16_to_f32(bits[i]);
  return f;
}

HostMat randn(int64_t rows, int64_t cols, uint32_t seed, float scale, float mean) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(mean, scale);
  HostMat m{rows, cols, std::vector<uint16_t>(size_t(rows * cols))};
  for (auto& b : m.bits) b = f32_to_bf16(nd(g));
  return m;
}

HostMatF32 randn_f32(int64_t rows, int64_t cols, uint32_t seed, float scale, float mean) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(mean, scale);
  HostMatF32 m{rows, cols, std::vector<float>(size_t(rows * cols))};
  for (auto& x : m.v) x = nd(g);
  return m;
}

std::string shape(const char* op, std::initializer_list<int64_t> dims) {
  std::string s = std::string(op) + " [";
  for (auto it = dims.begin(); it != dims.end(); ++it) {
    if (it != dims.begin()) s += ',';
    s += std::to_string(*it);
  }
  return s + "]";
}

StepMeta rows_meta(int T, int64_t past) {
  StepMeta m;
  std::vector<int32_t> ids(size_t(T), 5);
  m.add_seq(ids.data(), T, past, 0, {}, false, false);
  return m;
}

ModelConfig layer_config(int nh, int kvh, int d, int lnh, int ld, const SparseConfig& sp) {
  ModelConfig c;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 4;
  c.vocab_size = 512;
  c.num_attention_heads = nh;
  c.num_key_value_heads = kvh;
  c.head_dim = d;
  c.lightning_nh = lnh;
  c.lightning_nkv = lnh;
  c.lightning_head_dim = ld;
  c.lightning_scale = 1.0 / std::sqrt(double(ld));
  c.sparse = sp;
  c.mixer_types = {MixerType::Sparse, MixerType::Lightning, MixerType::Lightning,
                   MixerType::Sparse};
  return c;
}

SparseConfig tiny_sparse() {
  SparseConfig sp;
  sp.block_size = 16;
  sp.kernel_size = 8;
  sp.kernel_stride = 4;
  sp.window_size = 64;
  sp.init_blocks = 1;
  sp.topk = 8;
  sp.dense_len = 256;
  return sp;
}

LayerHarness::LayerHarness(const ModelConfig& c, int page_size, int64_t max_len_, int nseq,
                           NumericMode mode, const BackendOptions& gpu_opts,
                           const std::vector<KvScales>& kv_scales)
    : p(mode, gpu_opts), cfg(c), max_len(max_len_) {
  const int pages_per_seq = int((max_len + page_size - 1) / page_size);
  shape.page_size = page_size;
  shape.num_pages = pages_per_seq * nseq;
  shape.num_slots = nseq;
  if (!kv_scales.empty()) {
    p.cpu->set_kv_scales(kv_scales);
    p.gpu->set_kv_scales(kv_scales);
  }
  p.cpu->init_caches(cfg, shape);
  p.gpu->init_caches(cfg, shape);
  std::vector<int32_t> all(size_t(shape.num_pages));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937(7));
  for (int i = 0; i < nseq; ++i)
    seqs.push_back({nseq - 1 - i, 0,  // slots in reverse order
                    std::vector<int32_t>(all.begin() + i * pages_per_seq,
                                         all.begin() + (i + 1) * pages_per_seq)});
}

StepMeta LayerHarness::step(const Calls& calls, bool dense_as_sparse) {
  StepMeta m;
  m.dense_as_sparse = dense_as_sparse;
  for (auto [si, n] : calls) {
    std::vector<int32_t> ids(size_t(n), 9);
    SeqState& s = seqs.at(size_t(si));
    // The backends abort on a position past the pages; fail the test with a reason instead.
    if (s.len + n > max_len)
      throw std::logic_error("LayerHarness: sequence " + std::to_string(si) + " grows to " +
                             std::to_string(s.len + n) + " tokens, max_len is " +
                             std::to_string(max_len));
    m.add_seq(ids.data(), n, s.len, s.slot, s.pages, false, false);
    s.len += n;
  }
  return m;
}

std::string calls_str(const Calls& calls, const std::vector<int64_t>& past) {
  std::string s;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(past[i]) + "+" + std::to_string(calls[i].second);
  }
  return s;
}

void run_lightning(int nh, int d, NumericMode mode) {
  const bool f32 = mode == NumericMode::F32;
  LayerHarness H(layer_config(16, 1, 16, nh, d, SparseConfig{}), 64, 512, 5, mode);
  const auto slopes = H.cfg.lightning_slopes();
  const float scale = float(H.cfg.lightning_scale);
  const std::vector<Calls> steps = {
      {{0, 1}, {1, 5}, {2, 63}, {3, 64}, {4, 130}},  // first calls: recurrent and chunked
      {{0, 1}, {1, 70}, {2, 1}, {3, 64}, {4, 10}},   // continuations with carried state
      {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}},      // decode
      {{4, 1}, {2, 100}, {0, 2}},                    // a subset, other order
  };
  for (const auto& calls : steps) {
    std::vector<int64_t> past;
    for (auto [si, n] : calls) past.push_back(H.seqs[size_t(si)].len);
    StepMeta m = H.step(calls);
    H.p.begin(m);
    const int64_t T = m.num_tokens(), C = int64_t(nh) * d;
    auto input = [&] {
      return f32 ? H.p.up(randn_f32(T, C, H.seed++)) : H.p.up(randn(T, C, H.seed++));
    };
    for (int li = 0; li < 2; ++li) {
      auto q = input(), k = input(), v = input();
      auto o = H.p.out(T, C);
      H.p.cpu->lightning_attention(li, q.c, k.c, v.c, slopes, scale, o.c);
      H.p.gpu->lightning_attention(li, q.g, k.g, v.g, slopes, scale, o.g);
      const Stat s =
          H.p.cmp(std::string(f32 ? "fp32 " : "") + "lightning nh" + std::to_string(nh) + " d" +
                      std::to_string(d) + " L" + std::to_string(li) + " " + calls_str(calls, past),
                  o);
      if (f32)
        expect_close(s, kF32RelL2, kF32RelMax);
      else
        expect_close(s, 4e-3, 1.6e-2);
    }
  }
}

}  // namespace sala::test
