// FP8 KV cache on the CPU (BackendOptions::kv_cache_dtype, backend/kv_cache_dtype.h): the
// element recipe (saturating, scaled), sparse attention with FP8 K/V == attention over K/V
// pre-rounded through the same encode/decode (bit for bit, dense and all-blocks-selected
// sparse rows), the stored compressed-key codes == encode(mean of the dequantized keys), the
// pool's element size, the k_scale / v_scale tensors of a checkpoint, and the flag's errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cache_layout.h"
#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/safetensors.h"
#include "test_util.h"

namespace sala::test {
namespace {
namespace fs = std::filesystem;

TEST(KvFp8, ElementRecipe) {
  using enum KvCacheDtype;
  // Scaled: code = fp8(x / scale), value = decode(code) * scale.
  EXPECT_EQ(kv_fp8_encode(3.f, FP8_E4M3, 0.5f), f32_to_fp8_e4m3(6.f));
  EXPECT_EQ(kv_fp8_round(0.3f, FP8_E4M3, 0.25f), round_fp8_e4m3(0.3f / 0.25f) * 0.25f);
  EXPECT_EQ(kv_fp8_round(0.3f, FP8_E5M2, 0.25f), round_fp8_e5m2(0.3f / 0.25f) * 0.25f);
  // Both formats saturate (e5m2 is clamped before its cast, which would give inf).
  EXPECT_EQ(kv_fp8_encode(1e9f, FP8_E4M3, 1.f), 0x7e);
  EXPECT_EQ(kv_fp8_encode(-1e9f, FP8_E4M3, 1.f), 0xfe);
  EXPECT_EQ(kv_fp8_encode(1e9f, FP8_E5M2, 1.f), 0x7b);
  EXPECT_EQ(kv_fp8_decode(kv_fp8_encode(-1e9f, FP8_E5M2, 2.f), FP8_E5M2, 2.f), -2.f * kFp8E5m2Max);
}

TEST(KvFp8, DtypeNamesAndErrors) {
  EXPECT_EQ(parse_kv_cache_dtype("auto"), KvCacheDtype::Auto);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), KvCacheDtype::FP8_E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), KvCacheDtype::FP8_E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e5m2"), KvCacheDtype::FP8_E5M2);
  for (auto t : {KvCacheDtype::Auto, KvCacheDtype::FP8_E4M3, KvCacheDtype::FP8_E5M2})
    EXPECT_EQ(parse_kv_cache_dtype(kv_cache_dtype_name(t)), t);
  const std::string e = error_of([] { parse_kv_cache_dtype("int8"); });
  EXPECT_NE(e.find("--kv-cache-dtype 'int8' is not supported (auto, fp8_e4m3, fp8_e5m2"),
            std::string::npos) << e;
}

// One sparse layer of a small config (kvh 2 x d 16, 4 query heads; blocks of 16, top-k 8 + a
// 64-token window: 12 blocks selected), run on two CPU backends over the same step.
struct Pair {
  ModelConfig cfg;
  CacheShape shape{8, 64, 1};  // 512 tokens, identity page list
  std::vector<int32_t> pages{0, 1, 2, 3, 4, 5, 6, 7};
  std::unique_ptr<Backend> fp8, ref;

  Pair(KvCacheDtype t, NumericMode mode, KvScales sc) {
    cfg.num_hidden_layers = 1;
    cfg.mixer_types = {MixerType::Sparse};
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.head_dim = 16;
    cfg.sparse.block_size = 16;
    cfg.sparse.kernel_size = 8;
    cfg.sparse.kernel_stride = 4;
    cfg.sparse.window_size = 64;
    cfg.sparse.init_blocks = 1;
    cfg.sparse.topk = 8;
    cfg.sparse.dense_len = 256;
    BackendOptions bo{mode, 0};
    bo.kv_cache_dtype = t;
    fp8 = make_cpu_backend(bo);
    fp8->set_kv_scales({sc});
    fp8->init_caches(cfg, shape);
    bo.kv_cache_dtype = KvCacheDtype::Auto;
    ref = make_cpu_backend(bo);
    ref->init_caches(cfg, shape);
  }
  // Appends T tokens at `past` on both backends (k, v as given to fp8; kr, vr to ref) and
  // returns both outputs [T, nh*d].
  std::pair<std::vector<float>, std::vector<float>> step(int T, int64_t past, bool das,
                                                         std::vector<float>& q,
                                                         std::vector<float>& k,
                                                         std::vector<float>& v,
                                                         std::vector<float>& kr,
                                                         std::vector<float>& vr) {
    StepMeta m;
    m.dense_as_sparse = das;
    std::vector<int32_t> ids(size_t(T), 5);
    m.add_seq(ids.data(), T, past, 0, pages, false, false);
    const int64_t qd = 4 * 16, kd = 2 * 16;
    std::vector<float> o1(size_t(T * qd)), o2(o1.size());
    auto run = [&](Backend& be, std::vector<float>& kk, std::vector<float>& vv,
                   std::vector<float>& o) {
      Tensor tq{q.data(), DType::F32, T, qd}, tk{kk.data(), DType::F32, T, kd},
          tv{vv.data(), DType::F32, T, kd}, to{o.data(), DType::F32, T, qd};
      be.begin_step(m);
      be.sparse_attention(0, tq, tk, tv, to);
    };
    run(*fp8, k, v, o1);
    run(*ref, kr, vr, o2);
    return {o1, o2};
  }
};

std::vector<float> randn(size_t n, float sigma, uint32_t seed, bool bf16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16 ? round_bf16(nd(rng)) : nd(rng);
  return v;
}

// Rows [r0, r1) of two [*, cols] outputs are equal bit for bit.
void expect_rows_identical(const std::vector<float>& a, const std::vector<float>& b, int64_t r0,
                           int64_t r1, int64_t cols, const std::string& what) {
  for (int64_t r = r0; r < r1; ++r)
    ASSERT_EQ(std::memcmp(&a[size_t(r * cols)], &b[size_t(r * cols)], size_t(cols) * 4), 0)
        << what << " row " << r;
}

TEST(KvFp8, AttentionEqualsPreRoundedKv) {
  for (auto t : {KvCacheDtype::FP8_E4M3, KvCacheDtype::FP8_E5M2})
    for (auto mode : {NumericMode::F32, NumericMode::BF16})
      for (bool das : {false, true}) {
        const bool bf16 = mode == NumericMode::BF16;
        // Scales small enough that the largest keys saturate e4m3 (|k| / 0.01 > 448).
        const KvScales sc{0.01f, 0.02f};
        Pair p(t, mode, sc);
        const std::string what = std::string(kv_cache_dtype_name(t)) + (bf16 ? " bf16" : " fp32") +
                                 (das ? " dense-as-sparse" : " dense");
        // Two calls (a prefill, then a chunk), so later rows read codes stored by earlier calls.
        int64_t past = 0;
        for (int T : {150, 50}) {
          auto q = randn(size_t(T) * 64, 1.f, uint32_t(past + 1), bf16);
          auto k = randn(size_t(T) * 32, 1.5f, uint32_t(past + 2), bf16);
          auto v = randn(size_t(T) * 32, 1.f, uint32_t(past + 3), bf16);
          auto kr = k, vr = v;
          for (auto& x : kr) x = kv_fp8_round(x, t, sc.k);
          for (auto& x : vr) x = kv_fp8_round(x, t, sc.v);
          auto [o8, oref] = p.step(T, past, das, q, k, v, kr, vr);
          // Dense rows, and sparse rows that select every past block (t < 12 blocks * 16),
          // read only K and V: the same bits. Later sparse rows rank blocks by the compressed
          // keys, which the FP8 cache rounds once more.
          const int64_t exact_rows = das ? std::clamp<int64_t>(192 - past, 0, T) : T;
          expect_rows_identical(o8, oref, 0, exact_rows, 64, what);
          if (exact_rows < T)
            EXPECT_LT(max_rel_diff(o8, oref), 0.25) << what;
          past += T;
        }
        // The stored compressed keys: encode(bf16-or-fp32 mean of the dequantized keys).
        const auto& c = dynamic_cast<CpuBackend&>(*p.fp8).sparse_cache(0);
        for (auto [w, s, arr] : {std::tuple{8, 4, &c.c1}, std::tuple{32, 16, &c.c2}}) {
          for (int64_t j = 0; j < cache_layout::num_entries(past, w, s); ++j)
            for (int64_t e = 0; e < 32; ++e) {
              float acc = 0;
              for (int64_t x = j * s; x < j * s + w; ++x)
                acc += kv_fp8_decode(c.k.codes()[size_t(cache_layout::token_offset(
                                         p.pages.data(), x, 64, 32) + e)],
                                     t, sc.k);
              const float mean = bf16 ? round_bf16(acc / float(w)) : acc / float(w);
              const size_t off = size_t(cache_layout::entry_offset(p.pages.data(), j, s, 64, 32) + e);
              ASSERT_EQ(arr->codes()[off], kv_fp8_encode(mean, t, sc.k))
                  << what << " level window " << w << " entry " << j << " elem " << e;
            }
        }
        EXPECT_EQ(p.fp8->kv_element_bytes(), 1u);
        EXPECT_EQ(p.ref->kv_element_bytes(), 4u);
      }
}

// A copy of the tiny-sparse golden model with extra tensors written into its checkpoint.
struct ScaledCopy {
  fs::path dir;
  explicit ScaledCopy(const std::string& name) {
    dir = fs::temp_directory_path() / ("sala_kvfp8_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy_file(fixtures_dir() + "/golden/tiny-sparse/config.json", dir / "config.json");
  }
  ~ScaledCopy() { fs::remove_all(dir); }
  void write(const std::vector<TensorToWrite>& extra) {
    Checkpoint src(fixtures_dir() + "/golden/tiny-sparse");
    std::vector<TensorToWrite> all = extra;
    for (auto& [name, t] : src.all())
      all.push_back({name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)});
    write_safetensors((dir / "model.safetensors").string(), all);
  }
};

TensorToWrite scalar(const std::string& name, float v, std::vector<int64_t> shape = {}) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return {name, DType::F32, shape, b};
}

TEST(KvFp8, ScalesFromTheCheckpoint) {
  // tiny-sparse: layers 0 and 3 are sparse. Layer 0 has both scales (a scalar and a [1]
  // tensor), layer 3 only the older v_proj.output_scale name.
  ScaledCopy m("ok");
  m.write({scalar("model.layers.0.self_attn.k_scale", 0.5f),
           scalar("model.layers.0.self_attn.v_scale", 0.25f, {1}),
           scalar("model.layers.3.self_attn.v_proj.output_scale", 2.f)});
  const ModelConfig cfg = load_model_config(m.dir.string());
  const auto sc = load_kv_scales(cfg, Checkpoint(m.dir.string()));
  ASSERT_EQ(sc.size(), 2u);
  EXPECT_EQ(sc[0].k, 0.5f);
  EXPECT_EQ(sc[0].v, 0.25f);
  EXPECT_EQ(sc[1].k, kDefaultKvScale);
  EXPECT_EQ(sc[1].v, 2.f);

  // The model hands them to the backend, whose caches use them; none is reported unused.
  Checkpoint ck(m.dir.string());
  ModelLimits lim;
  lim.max_step_tokens = lim.max_logit_rows = 64;
  lim.caches = {4, cfg.sparse.block_size, 1};
  BackendOptions bo;
  bo.kv_cache_dtype = KvCacheDtype::FP8_E5M2;
  Model model(cfg, make_cpu_backend(bo), ck, lim);
  EXPECT_TRUE(model.unused_tensors().empty());
  const auto& be = dynamic_cast<CpuBackend&>(model.backend());
  EXPECT_EQ(be.sparse_cache(0).k.scale(), 0.5f);
  EXPECT_EQ(be.sparse_cache(0).v.scale(), 0.25f);
  EXPECT_EQ(be.sparse_cache(0).c1.scale(), 0.5f);  // compressed keys: K's scale
  EXPECT_EQ(be.sparse_cache(1).v.scale(), 2.f);
  EXPECT_EQ(be.sparse_cache(1).k.dtype(), KvCacheDtype::FP8_E5M2);
}

TEST(KvFp8, MalformedScalesAreErrors) {
  auto error_with = [](const std::string& name, const std::vector<TensorToWrite>& extra) {
    ScaledCopy m(name);
    m.write(extra);
    return error_of([&] {
      load_kv_scales(load_model_config(m.dir.string()), Checkpoint(m.dir.string()));
    });
  };
  std::string e = error_with("shape", {scalar("model.layers.0.self_attn.k_scale", 1.f, {1, 1})});
  EXPECT_NE(e.find("expected a scalar or [1]"), std::string::npos) << e;
  e = error_with("neg", {scalar("model.layers.3.self_attn.v_scale", -1.f)});
  EXPECT_NE(e.find("must be finite and > 0"), std::string::npos) << e;
  e = error_with("both", {scalar("model.layers.0.self_attn.k_scale", 1.f),
                          scalar("model.layers.0.self_attn.k_proj.output_scale", 1.f)});
  EXPECT_NE(e.find("both"), std::string::npos) << e;
}

}  // namespace
}  // namespace sala::test
