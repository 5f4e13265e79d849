// Shared harness of the CUDA op tests (test_cuda_ops.cpp, test_cuda_sparse.cpp,
// test_cuda_f32.cpp): the CUDA backend against the CPU backend in bf16 emulation
// (NumericMode::BF16), or both in fp32 mode (NumericMode::F32), op by op, in the style of
// llama.cpp's test-backend-ops. Identical bf16 inputs go to both backends, both
// outputs come back as fp32 and are compared; every comparison is also recorded for the
// table of measured errors printed at the end of each binary (cuda_test_util.cpp).
//
// Without a GPU (CI) every test GTEST_SKIPs with a loud message; with SALA_REQUIRE_GPU=1 the
// missing GPU is a failure (scripts/gpu_check.sh sets it).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"
#include "core/safetensors.h"
#include "backend/step.h"

namespace sala::test {

bool gpu_present();

#define REQUIRE_GPU()                                                                      \
  do {                                                                                     \
    if (!::sala::test::gpu_present()) {                                                    \
      if (std::getenv("SALA_REQUIRE_GPU")) FAIL() << "SALA_REQUIRE_GPU is set but no GPU"; \
      GTEST_SKIP() << "*** NO CUDA DEVICE: the CUDA op tests were NOT RUN ***";            \
    }                                                                                      \
  } while (0)

// ---- error statistics -----------------------------------------------------------------

struct Stat {
  std::string name;
  int64_t n = 0, ndiff = 0;
  double max_abs = 0, max_ref = 0, rel_l2 = 0, max_ulp = 0;
};
// Every comparison of the binary, printed as a table at exit.
std::vector<Stat>& stats();

// ulp of a bf16 value of magnitude |r| (8 significant bits).
double bf16_ulp(double r);
// e (GPU) against r (CPU, the reference); recorded in stats().
Stat compare(const std::string& name, const std::vector<float>& e, const std::vector<float>& r);
// fp32 mode: relative L2 error and max error relative to the largest reference value at the
// fp32 level (different fp32 summation orders / exp implementations, no rounding to bf16).
inline constexpr double kF32RelL2 = 1e-5, kF32RelMax = 1e-4;
// Element-wise ops: at most `ulps` bf16 ulps anywhere, on at most `frac` of the elements.
void expect_ulp(const Stat& s, double ulps, double frac);
// Reductions: relative L2 error and max error relative to the largest reference value.
void expect_close(const Stat& s, double rel_l2, double rel_max);

// ---- inputs -----------------------------------------------------------------------------

struct HostMat {
  int64_t rows = 0, cols = 0;
  std::vector<uint16_t> bits;  // bf16, [rows, cols]
  std::vector<float> f32() const;
};

// [rows, cols] of N(mean, scale²) rounded to bf16, reproducible from `seed`.
HostMat randn(int64_t rows, int64_t cols, uint32_t seed, float scale = 1.f, float mean = 0.f);

// fp32 values that are not bf16 values (fp32-mode inputs: a kernel that rounds its loads
// or stores to bf16 is off by ~1e-3 relative).
struct HostMatF32 {
  int64_t rows = 0, cols = 0;
  std::vector<float> v;  // [rows, cols]
};
// [rows, cols] of N(mean, scale²) in fp32, reproducible from `seed`.
HostMatF32 randn_f32(int64_t rows, int64_t cols, uint32_t seed, float scale = 1.f,
                     float mean = 0.f);

// rows x cols values of dtype dt uploaded to `be` as a checkpoint tensor (upload_weight).
Tensor upload_checkpoint(Backend& be, DType dt, int64_t rows, int64_t cols, const void* data);

// a (on backend ba, e.g. a fused op's result) and b (on bb, e.g. the composed ops') hold the
// same bits.
void expect_same_bits(Backend& ba, const Tensor& a, Backend& bb, const Tensor& b,
                      const std::string& what);

// The same values in both backends, both in `mode` (bf16 emulation on the CPU by default);
// gpu_opts: the CUDA backend's other options (its mode is set to m).
struct Pair {
  // The CPU backend gets the GPU's KV cache dtype (FP8 KV: the oracle's codes).
  explicit Pair(NumericMode m = NumericMode::BF16, BackendOptions gpu_opts = {})
      : mode(m), cpu(make_cpu_backend(cpu_opts(gpu_opts, m))),
        gpu(make_cuda_backend(in_mode(gpu_opts, m))) {}
  static BackendOptions in_mode(BackendOptions o, NumericMode m) {
    o.mode = m;
    return o;
  }
  static BackendOptions cpu_opts(const BackendOptions& gpu_opts, NumericMode m) {
    BackendOptions o{m, 0};
    o.kv_cache_dtype = gpu_opts.kv_cache_dtype;
    return o;
  }
  NumericMode mode;
  std::unique_ptr<Backend> cpu, gpu;
  StepMeta meta;  // the current step's, see begin()
  struct T2 {
    Tensor c, g;
  };
  T2 up(const HostMat& m) { return up_checkpoint(DType::BF16, m.rows, m.cols, m.bits.data()); }
  // fp32 values as an F32 "checkpoint" tensor (exact in fp32 mode).
  T2 up(const HostMatF32& m) { return up_checkpoint(DType::F32, m.rows, m.cols, m.v.data()); }
  T2 up_checkpoint(DType dt, int64_t rows, int64_t cols, const void* data) {
    return {upload_checkpoint(*cpu, dt, rows, cols, data), upload_checkpoint(*gpu, dt, rows, cols, data)};
  }
  // GPU output in the backend's activation dtype (bf16, or fp32 in fp32 mode).
  T2 out(int64_t rows, int64_t cols) { return out(rows, cols, gpu->act_dtype()); }
  T2 out(int64_t rows, int64_t cols, DType gpu_dtype) {
    return {cpu->alloc(rows, cols, DType::F32), gpu->alloc(rows, cols, gpu_dtype)};
  }
  // The backends keep the StepMeta's address for the step: the Pair holds its own copy, so a
  // caller's local meta (begin_decode_step's) may die before the step's ops run.
  void begin(const StepMeta& m) {
    meta = m;
    cpu->begin_step(meta);
    gpu->begin_step(meta);
  }
  // A decode-only step: T sequences of one row each (no KV pages).
  void begin_decode_step(int64_t T) {
    StepMeta m;
    const int32_t id = 5;
    for (int64_t i = 0; i < T; ++i) m.add_seq(&id, 1, 0, int32_t(i), {}, false, true);
    begin(m);
  }
  // Both results as fp32: [0] CPU, [1] GPU.
  std::pair<std::vector<float>, std::vector<float>> download(const T2& t) {
    std::vector<float> a(size_t(t.c.numel())), b(size_t(t.g.numel()));
    cpu->download_f32(t.c, a.data());
    gpu->download_f32(t.g, b.data());
    return {std::move(a), std::move(b)};
  }
  Stat cmp(const std::string& name, const T2& t) {
    auto [a, b] = download(t);
    return compare(name, b, a);
  }
};

// W4A16 codes and scales of h's values (core/int4.h RTN with `group`), as a checkpoint gives
// them: packed words [rows, cols / 8] and fp32 scales [rows, cols / group].
struct Int4Host {
  int64_t rows = 0, cols = 0;
  int32_t group = 0;
  std::vector<uint32_t> words;
  std::vector<float> scales;
};
Int4Host int4_rtn(const HostMat& h, int32_t group);
// The same codes uploaded to a backend with upload_int4 (as load_weights does).
Weight upload_int4_host(Backend& be, const Int4Host& q);

// "op [d0,d1,...]": the name of a comparison.
std::string shape(const char* op, std::initializer_list<int64_t> dims);

// One sequence of T rows (id 5) after `past` tokens, state slot 0, no pages.
StepMeta rows_meta(int T, int64_t past = 0);

// ---- layers ---------------------------------------------------------------------------------

// A 4-layer config (sparse, lightning, lightning, sparse) with the given sparse-layer heads
// (nh query heads, kvh KV heads of head_dim d), lightning heads (lnh of head_dim ld) and
// sparse rules; hidden 256 (the layer ops never see the hidden size).
ModelConfig layer_config(int nh, int kvh, int d, int lnh, int ld, const SparseConfig& sp);

// The tiny-sparse golden config: block 16, kernel 8/4 (level 2: 32/16), window 64 (4 local
// blocks), init 1, topk 8, dense_len 256.
SparseConfig tiny_sparse();

// Sequences that live across steps, each with its own shuffled pages and state slot.
struct SeqState {
  int32_t slot;
  int64_t len = 0;
  std::vector<int32_t> pages;
};

// One (sequence index, new tokens) call of a step.
using Calls = std::vector<std::pair<int, int>>;

// Both backends' caches for `nseq` sequences of up to `max_len` tokens each: pages of
// `page_size` tokens, ceil(max_len / page_size) per sequence, drawn shuffled from one pool
// (the page table's indirection is exercised); state slots in reverse order.
struct LayerHarness {
  Pair p;
  ModelConfig cfg;
  CacheShape shape;
  std::vector<SeqState> seqs;
  int64_t max_len;
  uint32_t seed = 1000;
  // kv_scales: both backends' FP8 KV scales per sparse layer (set_kv_scales; empty: defaults).
  LayerHarness(const ModelConfig& c, int page_size, int64_t max_len, int nseq,
               NumericMode mode = NumericMode::BF16, const BackendOptions& gpu_opts = {},
               const std::vector<KvScales>& kv_scales = {});
  // One step: the calls in row order; advances the sequences' lengths.
  StepMeta step(const Calls& calls, bool dense_as_sparse = false);
};

// "past+n past+n ...": the calls of a step, for comparison names.
std::string calls_str(const Calls& calls, const std::vector<int64_t>& past);

// Two lightning layers of 5 sequences (each its state slot) over steps of first calls,
// continuations with carried state and decode rows: q/k/v [T, nh*d] -> o [T, nh*d], GPU vs
// CPU in `mode` (bf16: bf16 inputs, rel L2 4e-3; fp32: inputs that are not bf16 values,
// the fp32 bounds).
void run_lightning(int nh, int d, NumericMode mode);

}  // namespace sala::test
