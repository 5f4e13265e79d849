// GemmDispatch's W4A16 path: INT4_GROUPED weights (compressed-tensors pack-quantized int4, one
// fp32 scale per `group` input columns; device layout in cuda_kernels.h), the numbers of the CPU
// oracle (backend/cpu/cpu_int4.cpp: W = q · s exactly in fp32, then an fp32 GEMM) up to the fp32
// summation order:
//  - runs of <= kGemvMaxRows rows (bf16 mode; decode steps up to 64 rows, verify steps, short
//    prefill runs): the int4 GEMV (cuda_gemv_int4.cu), one pass over the packed weights for
//    all rows, every part in one launch, row-invariant; except decode-only runs of 17..64 rows
//    on Hopper, which take the W4A16 skinny GEMM (cuda_skinny_int4_sm90.cu: each weight
//    dequantized once for all the rows; int4_skinny_ok). Decode-only steps of up to
//    kInt4DecodeGemvRows rows run in runs of 64;
//  - longer runs (prefill) on Hopper in bf16 mode: CUTLASS's mixed-input GEMM over the
//    weight's second copy in CUTLASS's shuffled order (int4_sm90_gemm, cuda_gemm_int4_sm90.cu;
//    weights and parts of whole 16-row blocks), which
//    converts each weight to the dequantizer's bf16(q · s) in registers: no bf16 copy per
//    forward. BackendOptions::int4_prefill_gemm = false makes no copy;
//  - the other longer runs, shapes the GEMV does not take (K or group not multiples of 128, a
//    GPU without its shared memory) and fp32 mode: each output part of the weight is dequantized
//    once per call into a scratch matrix (launch_int4_dequantize: bf16(q · s) in bf16 mode, the
//    compressed-tensors dequantizer's values; q · s exactly in fp32 mode, the CPU's), and every
//    such run goes through the dense path (linear_rows: cuBLASLt, or the bf16 GEMV for <= 64
//    rows, itself row-invariant). The dequantization writes 2 bytes per weight (4 in fp32 mode)
//    and reads half a byte: its cost per prefill forward is printed by CudaInt4Gemv.DequantSpeed.
// The scratch holds the largest int4 weight (all its parts), allocated at load
// (note_int4_weight): nothing grows in the step loop.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_gemm_int4_sm90.h"
#include "backend/cuda/cuda_host_util.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_skinny_sm90.h"
#include "core/check.h"

namespace sala::cuda_host {
using namespace sala::cuda;

void GemmDispatch::note_int4_weight(const Weight& w, bool scales_bf16) {
  SALA_CHECK(!graphs_.capturing(), "an int4 weight uploaded inside a CUDA-graph recording");
  // CUTLASS's tiles take 64 k per stage (the group a multiple of it); the shuffled order's
  // atoms are 16 rows x 16 k.
  if (int4_sm90_ok_ && w.cols % 64 == 0 && w.group % 64 == 0 && w.rows % 16 == 0) {
    Int4Sm90Copy c{w.rows, w.cols, nullptr, nullptr, scales_bf16};
    c.codes = static_cast<uint32_t*>(arena_.device(size_t(w.rows * w.cols / 8) * 4));
    c.scales_t = arena_.device(size_t(w.rows * (w.cols / w.group)) * (scales_bf16 ? 2 : 4));
    launch_int4_shuffle_codes(static_cast<const uint32_t*>(w.data), w.rows, w.cols, c.codes,
                              stream_);
    launch_int4_scales_transposed(w.scales, w.rows, w.cols / w.group, c.scales_t, scales_bf16,
                                  w.rows, stream_);
    int4_sm90_[static_cast<const char*>(w.data)] = c;
  }
  const int64_t elems = w.rows * w.cols;
  if (elems <= int4_ws_elems_) return;
  graphs_.drop();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  arena_.release(int4_ws_);
  int4_ws_ = arena_.device(size_t(elems) * (bf16_ ? 2 : 4));
  int4_ws_elems_ = elems;
}

bool GemmDispatch::int4_sm90_gemm(const Tensor& x, const Weight& w, Tensor& y) {
  if (int4_sm90_.empty() || !is_bf16(x) || !is_bf16(y)) return false;
  const char* p = static_cast<const char*>(w.data);
  auto it = int4_sm90_.upper_bound(p);
  if (it == int4_sm90_.begin()) return false;
  --it;
  const Int4Sm90Copy& c = it->second;
  const int64_t row_bytes = c.cols / 2, off = p - it->first;
  if (!(c.cols == w.cols && off % row_bytes == 0 && off / row_bytes + w.rows <= c.rows))
    return false;
  const int64_t r0 = off / row_bytes;  // w = rows [r0, r0 + w.rows) of the copied weight
  if (r0 % 16 != 0 || w.rows % 16 != 0) return false;  // whole 16-row blocks of the copy
  const auto* codes = reinterpret_cast<const uint8_t*>(c.codes) + r0 * row_bytes;
  const void* scales = static_cast<const char*>(c.scales_t) + r0 * (c.scales_bf16 ? 2 : 4);
  const Int4Sm90Config cfg =
      c.scales_bf16 ? Int4Sm90Config::kBf16Scales : Int4Sm90Config::kF32Scales;
  if (!launch_int4_gemm_sm90_config(cfg, ptr<bf16>(x), codes, scales, c.rows, ptr<bf16>(y),
                                    x.rows, w.rows, w.cols, w.group, lt_workspace_,
                                    lt_workspace_size_, stream_))
    return false;
  timer_.tick("int4 gemm sm90");
  return true;
}

bool GemmDispatch::int4_gemv_ok(const Tensor& x, const Weight& w,
                                const std::vector<Tensor*>& ys) const {
  if (!(bf16_ && is_bf16(x) && x.cols == w.cols && x.rows <= kGemvMaxRows && x.cols % 8 == 0 &&
        ptr_alignment(x.data) >= 16 && ys.size() <= 4))
    return false;
  for (const Tensor* y : ys)  // (their rows: the caller's; x may be one run of them)
    if (!(is_bf16(*y) || (ys.size() == 1 && y->dtype == DType::F32))) return false;
  return gemv_int4_supported(w.data, w.cols, w.group, x.rows);
}

// Decode-only runs of kDecodeGemvRows + 1 .. kGemvMaxRows rows on Hopper: the W4A16 skinny
// GEMM (cuda_skinny_int4_sm90.cu) dequantizes each weight once for all the rows, where the
// GEMV's cost grows with them (a 9B decode step at 64 rows: 17.1 ms, H200, session 16). Its
// rows' bits do not depend on the step's other rows, but are not the GEMV's: as bf16 and FP8
// weights, a decode step of more than 16 rows gives a sequence other bits than a step of <= 16.
bool GemmDispatch::int4_skinny_ok(const Tensor& x, const Weight& w,
                                  const std::vector<Tensor*>& ys) const {
  if (!(skinny_ok_ && decode_only_step() && x.rows > kDecodeGemvRows && x.rows <= kGemvMaxRows &&
        is_bf16(x) && x.cols == w.cols && ys.size() <= 4 &&
        skinny_int4_sm90_supported(x.data, x.cols, w.data, w.cols, w.group, x.rows)))
    return false;
  for (const Tensor* y : ys)
    if (!(is_bf16(*y) || (ys.size() == 1 && y->dtype == DType::F32))) return false;
  return true;
}

Tensor GemmDispatch::dequantize_int4(const Weight& w) {
  SALA_CHECK(w.rows * w.cols <= int4_ws_elems_,
             "int4 weight [{}, {}] larger than the dequantization scratch ({} elements)", w.rows,
             w.cols, int4_ws_elems_);
  const auto* words = static_cast<const uint32_t*>(w.data);
  if (bf16_)
    launch_int4_dequantize(words, w.scales, w.rows, w.cols, w.group, static_cast<bf16*>(int4_ws_),
                           stream_);
  else
    launch_int4_dequantize(words, w.scales, w.rows, w.cols, w.group, static_cast<float*>(int4_ws_),
                           stream_);
  timer_.tick("int4 dequantize");
  return Tensor{int4_ws_, bf16_ ? DType::BF16 : DType::F32, w.rows, w.cols};
}

void GemmDispatch::linear_int4(const Tensor& x, const Weight& w, const std::vector<Tensor*>& ys) {
  SALA_CHECK(w.format == WeightFormat::INT4_GROUPED && w.scales && w.group > 0 &&
                 w.cols % w.group == 0,
             "int4 linear: a [{},{}] {} weight without group scales", w.rows, w.cols,
             weight_format_name(w.format));
  SALA_CHECK(is_act(x) && x.cols == w.cols, "int4 linear: x [{},{}] {} for a weight [{},{}]",
             x.rows, x.cols, dtype_name(x.dtype), w.rows, w.cols);
  int64_t n = 0;
  for (const Tensor* y : ys) {
    SALA_CHECK(y->rows == x.rows && (is_act(*y) || y->dtype == DType::F32),
               "int4 linear: output [{},{}] {} for x [{},{}]", y->rows, y->cols,
               dtype_name(y->dtype), x.rows, x.cols);
    n += y->cols;
  }
  SALA_CHECK(n == w.rows, "int4 linear: weight [{},{}] for {} output columns", w.rows, w.cols, n);
  if (x.rows == 0) return;
  std::vector<std::pair<int64_t, int64_t>> dense_runs;  // (first row, rows)
  // Decode-only steps of kGemvMaxRows + 1 .. kInt4DecodeGemvRows rows: runs of 64 rows. Bytes
  // per step: each run streams the packed weights (~0.28 B per weight with scales), while the
  // dense path writes and reads a bf16 copy (~4.5 B per weight) before its GEMM.
  const int64_t split = decode_only_step() && x.rows <= kInt4DecodeGemvRows ? kGemvMaxRows : 0;
  for_each_run(x.rows, [&](int64_t r0, int64_t T) {
    for (int64_t c = 0; c < T; c += split > 0 ? split : T) {
      const int64_t n = split > 0 ? std::min(split, T - c) : T;
      const Tensor xr = x.slice_rows(r0 + c, n);
      if (int4_skinny_ok(xr, w, ys)) {
        launch_skinny_int4_sm90(ptr<bf16>(xr), x.cols, static_cast<const uint32_t*>(w.data),
                                w.scales, w.rows, int(x.cols), w.group, int(n),
                                gemv_parts(ys, r0 + c), skinny_ws_, stream_);
        timer_.tick("skinny int4");
      } else if (int4_gemv_ok(xr, w, ys)) {
        const GemvOut o = gemv_parts(ys, r0 + c);
        launch_gemv_int4(ptr<bf16>(xr), x.cols, static_cast<const uint32_t*>(w.data), w.scales,
                         w.rows, int(x.cols), w.group, int(n), o, stream_);
        timer_.tick(o.f32 ? "gemv int4 lm_head" : "gemv int4");
      } else {
        dense_runs.emplace_back(r0 + c, n);
      }
    }
  });
  if (dense_runs.empty()) return;
  // Per part: the sm_90 GEMM, else one dequantization shared by all the call's dense runs.
  int64_t c0 = 0;
  for (Tensor* y : ys) {
    const Weight wp = w.slice_rows(c0, y->cols);
    Tensor wd{};
    for (auto [r0, T] : dense_runs) {
      Tensor yr = y->slice_rows(r0, T);
      if (int4_sm90_gemm(x.slice_rows(r0, T), wp, yr)) continue;
      if (!wd.data) wd = dequantize_int4(wp);
      linear_rows(x.slice_rows(r0, T), wd, yr);
    }
    c0 += y->cols;
  }
}

}  // namespace sala::cuda_host
