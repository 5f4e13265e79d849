// Launchers of the CUDA backend's kernels (host-callable, no fmt, no device code). Shapes
// are in the comments of each launcher; tensors are row-major, bf16 unless noted, and every
// launcher checks the launch (CUDA_CHECK_LAUNCH). Launchers templated on T exist for T = bf16
// (the bf16 contract) and T = float (fp32 mode: the same kernels with no rounding to bf16);
// "bf16(...)" below then means T(...). The fp32-mode kernels that replace tensor-core ones
// (InfLLM-v2 selection, sparse stage 2) are at the end.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"

namespace sala::cuda {

using bf16 = __nv_bfloat16;

// ---- element-wise, norms, RoPE (cuda_ops.cu; RMSNorm: cuda_norm.cu) ----
// out[rows, cols] = bf16(table[ids[t]] * scale)
template <typename T>
void launch_embedding(const T* table, const int32_t* ids, int64_t rows, int64_t cols, float scale,
                      T* out, cudaStream_t st);
// RMSNorm over `groups` groups of n contiguous values (two roundings, SPEC §4.2). With
// a != nullptr first h = bf16(h + bf16(a * alpha)), written back to x (fused residual).
template <typename T>
void launch_rmsnorm(T* x, const T* a, float alpha, const T* w, int n, int64_t groups, float eps,
                    T* out, cudaStream_t st);
// Per-token FP8 codes of an activation written by the kernel that makes it (issue 17, item 5):
// codes [rows, cols] (uint8 e4m3) and scales [rows] (fp32), launch_quantize_rows_fp8's numbers
// on the stored bf16 activation, bit for bit.
// skip_out: the producer may leave its bf16 output unstored (the caller's `next` is the only
// reader of it, and reads these codes): the row-in-registers kernels then store only the
// codes, scales (and h), ~30 % fewer bytes per norm or SiLU product; the others store it.
struct Fp8Act {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  bool skip_out = false;
};
// launch_rmsnorm (a != nullptr: the fused residual) or launch_rmsnorm_mul_sigmoid (gate !=
// nullptr; not both) over whole rows (groups = rows, n = cols), bf16, with the same kernel and
// the same bits in x and out, that also writes q: out's codes and scales (q.skip_out: out
// may be left unstored; h is always written).
void launch_rmsnorm_fp8(bf16* x, const bf16* a, float alpha, const bf16* w, const bf16* gate,
                        int n, int64_t rows, float eps, bf16* out, Fp8Act q, cudaStream_t st);
// Rows of n columns take the 16-byte-vector norm kernel (with 16-byte aligned pointers).
inline constexpr bool rmsnorm_vec8_fits(int64_t n) { return n > 512 && n % 256 == 0 && n <= 8192; }
// The fp32 sums of an FP8 GEMM whose scaling is left to the next kernel
// (GemmDispatch::linear_fp8_sums) and where that kernel stores the scaled output:
// y[t, c] = bf16(acc[t, c] · sx[t] · sw[c]), launch_fp8_apply_scales' numbers.
struct Fp8Sums {
  const float* acc = nullptr;  // [rows, n]
  const float* sx = nullptr;   // [rows] per-token scales (may share words with q.scales)
  const float* sw = nullptr;   // [n] per-channel scales
  bf16* y = nullptr;           // [rows, n]
};
// launch_fp8_apply_scales into s.y, then launch_rmsnorm_fp8 (q.codes) or launch_rmsnorm with
// a = s.y: the same bits in s.y, h, out and q, in one kernel (decode-only FP8 steps of 17..64
// rows, whose o_proj and down run cuBLASLt's unscaled GEMM). Needs rmsnorm_vec8_fits(n) and
// 16-byte aligned h, s.acc, s.sw, s.y, w and out (checked: abort).
void launch_add_rmsnorm_sums(bf16* h, Fp8Sums s, float alpha, const bf16* w, int n, int64_t rows,
                             float eps, bf16* out, Fp8Act q, cudaStream_t st);
// out = bf16(RMSNorm(x) · w) · bf16(sigmoid(gate)) (rmsnorm then mul_sigmoid in one pass, the
// same numbers): x, gate, out [groups · n]; out may be x, not gate.
template <typename T>
void launch_rmsnorm_mul_sigmoid(T* x, const T* w, const T* gate, int n, int64_t groups, float eps,
                                T* out, cudaStream_t st);
// Tensor parallelism's split o_norm: ss[rows] (fp32) = Σ x² of each row of x [rows, n];
// then out = launch_rmsnorm_mul_sigmoid's numbers for those columns with the whole row's
// Σ x² given (inv = 1 / sqrt(ss / n_total + eps)); out may be x.
template <typename T>
void launch_row_sum_squares(const T* x, int n, int64_t rows, float* ss, cudaStream_t st);
template <typename T>
void launch_rmsnorm_mul_sigmoid_ss(const T* x, const float* ss, int n, int64_t n_total,
                                   const T* w, const T* gate, int64_t rows, float eps, T* out,
                                   cudaStream_t st);
template <typename T>
void launch_silu_mul(const T* g, const T* u, T* out, int64_t n, cudaStream_t st);
// launch_silu_mul's out over rows of g, u, out [rows, cols] (out may be g), with the FP8 codes
// and scales of out in q (one block per row; q.skip_out: out may be left unstored).
void launch_silu_mul_fp8(const bf16* g, const bf16* u, bf16* out, int64_t rows, int64_t cols,
                         Fp8Act q, cudaStream_t st);
template <typename T>
void launch_mul_sigmoid(const T* a, const T* gate, T* out, int64_t n, cudaStream_t st);
template <typename T>
void launch_div_scalar(T* x, float d, int64_t n, cudaStream_t st);
// bf16 mode's fp32 logits: x / d rounded to a bf16 value; x = bf16(x) as fp32.
void launch_div_scalar_f32(float* x, float d, int64_t n, cudaStream_t st);
void launch_round_f32(float* x, int64_t n, cudaStream_t st);
// In-place rotate-half RoPE on x[rows, cols], heads of head_dim, positions pos[rows].
template <typename T>
void launch_rope(T* x, int64_t rows, int64_t cols, int head_dim, const int32_t* pos,
                 const float* inv_freq, cudaStream_t st);
// out[r] = x[rows[r]] for r < R; elem_size 2 or 4.
void launch_gather_rows(const void* x, int64_t cols, int elem_size, const int32_t* rows, int R,
                        void* out, cudaStream_t st);

// Lightning q/k: per-head RMSNorm (two roundings) then rotate-half RoPE, in place, on
// q[rows, cols] and k[rows, cols] (heads of head_dim, weights qn/kn[head_dim]).
template <typename T>
void launch_qk_norm_rope(T* q, T* k, const T* qn, const T* kn, int64_t rows, int64_t cols,
                         int head_dim, float eps, const int32_t* pos, const float* inv_freq,
                         cudaStream_t st);

// ---- skinny GEMM for decode and verify rows (cuda_gemv.cu) ----
// Rows one GEMV launch takes (one pass over the weights; n8 tiles NT = 1, 2, 4, 8).
inline constexpr int kGemvMaxRows = 64;
// Work a ring GEMV's last CTAs do on whole rows of its output y = o.y[0] ([M, n] bf16, one
// part) once every CTA has stored its tiles (cuda_gemv_row_tail.cuh), instead of a kernel of
// its own after the GEMV: the residual norm h[m] += y[m]·alpha, out[m] = RMSNorm(h[m])·w, and
// out's FP8 codes when q.codes: the bits of launch_rmsnorm(_fp8) with a = y
// (gemv_norm_tail_fits: n % 2048 == 0, n <= 8192; every pointer 16-byte aligned). sync: two
// words of device memory, zeroed once (an arrival count, zero again after every kernel, and a
// generation). h == nullptr: nothing.
struct GemvRowTail {
  bf16* h = nullptr;
  const bf16* w = nullptr;
  float alpha = 0.f, eps = 0.f;
  bf16* out = nullptr;
  Fp8Act q{};
  unsigned* sync = nullptr;
  int n = 0;
};
inline constexpr bool gemv_norm_tail_fits(int64_t n) {
  return n % 2048 == 0 && n >= 2048 && n <= 8192;
}
struct GemvOut {          // weight rows [end[p-1], end[p]) go to y[p] (row-major, cols[p])
  void* y[4];
  int64_t end[4];
  int64_t cols[4];
  int nparts;
  bool f32;               // fp32 outputs holding bf16-rounded values (logits)
  // Gate/up pair (nparts 1, cols[0] = N / 2): weight rows [0, N/2) are the gate, [N/2, N)
  // the up projection; y[0] = bf16(bf16(silu(g)) * u) of the bf16-rounded g, u (silu_mul).
  bool silu_pair;
  GemvRowTail tail;  // the ring GEMVs (bf16, FP8) at <= kGemvRowTailRows rows only
};
constexpr int kGemvRowTailRows = 16;
// Once, before any stream capture (the backend's constructor): picks the kernel for the
// current device and sets its shared-memory attribute (launch_gemv would do it on first use).
void gemv_init();
bool gemv_supported(const void* x, int64_t ldx, const void* w, int64_t K, int64_t M);
// Stacked GEMM outputs (bf16, row-major x[T, N]): columns [end[p-1], end[p]) of x → y[p]
// (bf16 parts of o; f32 and silu_pair unused); and out[T, I] = silu_mul(x[:, :I], x[:, I:])
// (SiluMul's roundings).
void launch_split_cols(const bf16* x, int64_t T, int64_t N, const GemvOut& o, cudaStream_t st);
void launch_silu_mul_halves(const bf16* x, int64_t T, int64_t I, bf16* out, cudaStream_t st);
// launch_silu_mul_halves with out's FP8 codes and scales in q, launch_silu_mul_fp8's kernels
// and bits (out [T, I] must not overlap x [T, 2 I]).
void launch_silu_mul_halves_fp8(const bf16* x, int64_t T, int64_t I, bf16* out, Fp8Act q,
                                cudaStream_t st);
// GemvOut::silu_pair runs on this GPU for N weight rows (the ring kernel, N / 2 a whole
// number of its 32-row tiles).
bool gemv_silu_pair_supported(int64_t N);
// GemvOut::tail runs on this GPU (the ring kernel; the caller checks gemv_norm_tail_fits).
bool gemv_row_tail_supported();
// y[m, n] = Σ_k x[m*ldx + k] w[n*K + k] for m < M <= kGemvMaxRows, n < N. Row invariant: row
// m's result is bit-identical for any M (and equals the row alone).
void launch_gemv(const bf16* x, int64_t ldx, const bf16* w, int64_t N, int K, int M,
                 const GemvOut& o, cudaStream_t st);

// ---- W8A8 FP8 skinny GEMM for decode / verify rows (cuda_gemv_fp8.cu), linear_fp8's twin ----
// y[m, n] = (Σ_k xq[m,k] · wq[n,k]) · sx[m] · w_scales[n] for m < M <= kGemvMaxRows, n < N,
// where wq = e4m3 codes w[N, K] (uint8, row-major) and xq [M, ldq] / sx [M] the activation
// codes and scales of launch_quantize_rows_fp8 or of the kernel that made x (Fp8Act: the same
// bits) (quantized once per row before the GEMV:
// quantizing inside it made it ALU-bound, issue 17). Output through GemvOut exactly as launch_gemv
// (nparts split, f32 logits holding bf16-rounded values, silu_pair). Batch invariant: row m's
// result is bit-identical for any M in 1..kGemvMaxRows. ldq % 16 == 0, xq 16-byte aligned.
void launch_gemv_fp8(const uint8_t* xq, int64_t ldq, const float* sx, const uint8_t* w,
                     const float* w_scales, int64_t N, int K, int M, const GemvOut& o,
                     cudaStream_t st);
bool gemv_fp8_row_tail_supported();  // as gemv_row_tail_supported
// M in 1..kGemvMaxRows, K % 16 == 0, w 16-byte aligned. The first call (outside any stream
// capture) picks the kernel for the current device and sets its shared memory; gemv_fp8_init
// makes that choice now (the backend's constructor, outside any capture).
bool gemv_fp8_supported(const void* w, int64_t K, int64_t M);
void gemv_fp8_init();
// GemvOut::silu_pair runs on this GPU for N weight rows (the ring kernel, N % 64 == 0).
bool gemv_fp8_silu_pair_supported(int64_t N);
// ---- W4A16 (cuda_gemv_int4.cu; GemmDispatch::linear_int4 in cuda_gemm_int4.cpp) ----
// Device layout of an INT4_GROUPED weight: the checkpoint's words [N, K / 8] with each word's
// nibbles permuted (nibble j: k 2j, nibble j + 4: k 2j + 1, each q + 8) by launch_int4_repack,
// in place, once at upload; scales fp32 [N, K / group]. Rows stay rows (slice_rows works).
void launch_int4_repack(uint32_t* w, int64_t words, cudaStream_t st);
// y[m, n] = Σ_g s[n, g] · Σ_{k in g} q[n, k] x[m, k] for m < M <= kGemvMaxRows, n < N (the CPU's
// Σ_k (q s) x in another fp32 order), output through GemvOut as launch_gemv (parts, f32,
// silu_pair). Row invariant: row m is bit-identical for any M. ldx % 8 == 0, x 16-byte aligned.
void launch_gemv_int4(const bf16* x, int64_t ldx, const uint32_t* w, const float* w_scales,
                      int64_t N, int K, int group, int M, const GemvOut& o, cudaStream_t st);
// M in 1..kGemvMaxRows, K and group multiples of 128 (group divides K), w 16-byte aligned, and a
// GPU with the ring's 229 KB of shared memory per block (sm_90). gemv_int4_init: the kernel
// attributes now (the backend's constructor, outside any capture).
bool gemv_int4_supported(const void* w, int64_t K, int64_t group, int64_t M);
bool gemv_int4_silu_pair_supported(int64_t N);
void gemv_int4_init();
// The sm_90 prefill GEMM's scales (cuda_gemm_int4_sm90.cu) of a weight's fp32 scales
// [N, groups]: transposed into scales_t [groups, ld] (ld >= N), bf16 when scales_bf16 (for
// scales that are all bf16 values), else fp32.
void launch_int4_scales_transposed(const float* w_scales, int64_t N, int64_t groups,
                                   void* scales_t, bool scales_bf16, int64_t ld,
                                   cudaStream_t st);
// out [rows, K] = q · s (fp32, exact), stored as T (bf16: nearest even); w in the device
// layout. K % 8 == 0, group divides K, out 16-byte aligned.
template <typename T>
void launch_int4_dequantize(const uint32_t* w, const float* w_scales, int64_t rows, int64_t K,
                            int group, T* out, cudaStream_t st);
// ---- W8A8 FP8 (cuda_fp8_quant.cu; the GEMMs: cuda_gemm_fp8.cpp, cuda_gemm_fp8_sm90.cu) ----
// Per-token activation quantization, core/fp8.h's fp8_quantize_rows bit for bit: for each row r
// of x [rows, ldx] (the first cols columns), scales[r] = amax|x[r, :]| / 448 (1 for a zero
// row) and codes[r * cols + c] = e4m3(x[r, c] / scales[r]) (IEEE division, nearest even,
// saturating). sm_89+: cvt.rn.satfinite; force_portable takes the integer path of the sm_80
// build on any GPU (tests).
void launch_quantize_rows_fp8(const bf16* x, int64_t rows, int64_t cols, int64_t ldx,
                              uint8_t* codes, float* scales, cudaStream_t st,
                              bool force_portable = false);
// The fallback epilogue where cuBLASLt has no per-row x per-channel scaling: y[t, n] =
// acc[t, n] * sx[t] * sw[n] (acc [T, N] fp32 from the unscaled FP8 GEMM), y bf16 or fp32 [T, N]
// (fp32 y may be acc).
void launch_fp8_apply_scales(const float* acc, int64_t T, int64_t N, const float* sx,
                             const float* sw, void* y, bool y_f32, cudaStream_t st);
// FP8 GEMMs into bf16 on Hopper (cuda_gemm_fp8_sm90.cu, CUTLASS): y [M, N] =
// bf16((Σ_k xq[m, k] · wq[n, k]) · sx[m] · sw[n]) with both scales in the GEMM's epilogue;
// xq [M, K] codes, wq [N, K] codes, K % 16 == 0, N % 8 == 0, 16-byte aligned pointers. Runs
// of M > 64 rows (prefill), and of 32..64 rows with N >= 2 K (stacked decode-step GEMMs).
// Returns false, launching nothing, where it does not run (not an sm_90 GPU, other shapes, a
// problem CUTLASS refuses, a workspace smaller than it needs): the caller then takes cuBLASLt.
bool launch_fp8_scaled_gemm_sm90(const uint8_t* xq, const float* sx, const uint8_t* wq,
                                 const float* sw, bf16* y, int64_t M, int64_t N, int64_t K,
                                 void* workspace, size_t workspace_bytes, cudaStream_t st);
// Tests: every fp32 bit pattern through the hardware e4m3 conversion and the portable one;
// out[0] = number of disagreements, out[1] = the smallest disagreeing bit pattern (~0 if none).
// On a GPU below sm_89 both are the portable path.
void launch_fp8_e4m3_selfcheck(unsigned long long* out, cudaStream_t st);

// ---- lightning (cuda_lightning.cu) ----
inline constexpr int kGlaDecayStride = 65;  // decay[h][n] = exp(n g_h), n = 0..64
template <typename T>  // bf16 or float (fp32 mode)
struct GlaArgs {
  T *q, *k;               // [T, nh*d]; written (in place) only by launch_gla_norm_rope
  const T* v;             // [T, nh*d]
  int64_t stride;
  const DevSeq* seqs;
  float* states;          // [slots, n_lightning, nh, d, d]
  int64_t slot_stride, layer_off;
  const float* decay;     // [nh][65]
  float scale;
  T* out;                 // [T, nh*d]
  int64_t ostride;
  int nh;
  // Chunk-parallel long calls in fp32 mode: fp32 workspace of ws_floats (>= nh*d*d) and the
  // most chunks of 64 of any long call of the step (host-side). Without a workspace the serial
  // chunked kernel runs. bf16 mode needs none.
  float* ws = nullptr;
  int64_t ws_floats = 0;
  int max_chunks = 0;
  // Every call of the step has exactly one token (a decode step; the host knows): the recurrent
  // calls take the decode form (cuda_lightning.cu), the same numbers.
  bool one_token = false;
};
// Recurrent kernel over the seqs in short_list (< 64 tokens), chunked over long_list.
// Returns false if head_dim d has no instantiation.
template <typename T>
bool launch_gla(int d, const GlaArgs<T>& a, const int32_t* short_list, int n_short,
                const int32_t* long_list, int n_long, cudaStream_t st);
// The q/k norm + RoPE of launch_gla_norm_rope: weights qn, kn [d], RoPE at pos [T] (the step's
// positions) with inverse frequencies inv_freq [d / 2].
template <typename T>
struct GlaNormRope {
  const T *qn = nullptr, *kn = nullptr;
  float eps = 0.f;
  const int32_t* pos = nullptr;
  const float* inv_freq = nullptr;
  // The decode form (GlaArgs::one_token) with d > 32: [n][nh] zeros (n: the call's sequences),
  // left zero. Its blocks split each head's value columns, so the last of them to have read q
  // and k writes them back normalised (an atomic ticket per head and sequence).
  unsigned* tickets = nullptr;
};
// lightning_qk_attention in one kernel, for steps whose calls all have < 64 tokens (list: all
// n of the step's seqs): per token, q and k [T, nh*d] are normalised per head and rotated in
// place (the numbers of launch_qk_norm_rope), then the recurrent step runs on them (those of
// launch_gla). Returns false if head_dim d has no instantiation.
template <typename T>
bool launch_gla_norm_rope(int d, const GlaArgs<T>& a, const GlaNormRope<T>& nr,
                          const int32_t* list, int n, cudaStream_t st);
// Calls of >= 64 tokens, fp32 mode: the chunk-parallel form (cuda_lightning_chunk3.cu); needs
// a.ws of >= nh·D² floats and 16-byte aligned q/k/v; launch_gla decides.
template <int D>
void launch_gla_chunk3(const GlaArgs<float>& a, const int32_t* long_list, int n_long, cudaStream_t st);
// Calls of >= 64 tokens, bf16 mode: one pass over each call's chunks per (sequence, head, 32
// value columns) with the state in registers, on the tensor cores (cuda_lightning_seq_tc.cu);
// no workspace; needs 16-byte aligned q/k/v/out rows; launch_gla decides.
template <int D>
void launch_gla_seq_tc(const GlaArgs<bf16>& a, const int32_t* list, int n, cudaStream_t st);

// ---- sparse layers (cuda_sparse.cu) ----
// Element format of the sparse layers' KV caches (K, V, both compressed-key levels;
// BackendOptions::kv_cache_dtype): the activation type, or FP8 codes (bf16 mode only) with one
// K and one V scale per layer (backend/kv_cache_dtype.h; device conversions cuda_kv_fp8.cuh).
inline constexpr int kKvAct = 0, kKvE4m3 = 1, kKvE5m2 = 2;
template <int KF, typename T = bf16>
using KvElem = std::conditional_t<KF == kKvAct, T, uint8_t>;
struct KvScale {
  float k = 1.f, v = 1.f;  // K (and compressed keys), V
};
struct CacheGeom {
  int page_size, kvh, d, s1, s2, k1, k2, bs;
  int64_t row;  // elements per token: kvh * d
};
// Parts of a decode row's keys in dense and sparse attention: fixed, so a recorded decode
// step launches the same grids at every context length (fewer only where the partials
// workspace is short); combine_kernel merges at most this many.
inline constexpr int kDecodeAttnSplits = 16;
// Calls of up to this many rows are split row by row (DevSeq::split_row): a verify call's rows
// (its last token and up to 15 drafts) then compute exactly what decode rows at their
// positions compute, and a short call no longer runs on a handful of blocks.
inline constexpr int kSplitCallRows = 16;
struct AttnParams {
  CacheGeom g;
  int G, nh;
  float tau;
  int flash_min;  // rows of dense calls of >= flash_min tokens are left to flash_prefill
  int total_topk; // row stride of sel (launch_attention_selected_f32)
  KvScale scale{};  // FP8 caches (launch_attention_fp8): the values are code · scale
};
struct StepRows {
  int T;
  const int32_t* row_seq;
  const DevSeq* seqs;
  const int32_t* page_table;
};
template <typename T>
void launch_append_kv(const T* k, const T* v, const StepRows& s, const CacheGeom& g, T* kc, T* vc,
                      cudaStream_t st);
template <typename T>
void launch_compress(const StepRows& s, const CacheGeom& g, const T* kc, T* c1, T* c2,
                     cudaStream_t st);
// FP8 caches (bf16 mode; kf kKvE4m3 / kKvE5m2), the CPU oracle's cpu_kv_store.h bit for bit:
// append writes codes kv_encode(k / sc.k), kv_encode(v / sc.v); compress sums the dequantized
// cached keys (code · sc.k) in token order in fp32, / w, rounds to bf16 and writes
// kv_encode(mean / sc.k).
void launch_append_kv_fp8(int kf, const bf16* k, const bf16* v, const StepRows& s,
                          const CacheGeom& g, KvScale sc, uint8_t* kc, uint8_t* vc,
                          cudaStream_t st);
void launch_compress_fp8(int kf, const StepRows& s, const CacheGeom& g, KvScale sc,
                         const uint8_t* kc, uint8_t* c1, uint8_t* c2, cudaStream_t st);
// Tests: x [n] -> codes [n] through kv_encode with `scale`, and back [n] = code value · scale
// (the device conversions of cuda_kv_fp8.cuh, against backend/kv_cache_dtype.h).
void launch_kv_fp8_roundtrip(int kf, const float* x, int64_t n, float scale, uint8_t* codes,
                             float* back, cudaStream_t st);
// Tests: codes [8 n8] (8-byte aligned) -> out [8 n8] bf16 bits through kv_codes8_bf16 (the
// code values the attention kernels feed to the tensor cores).
void launch_kv_codes8_bf16(int kf, const uint8_t* codes, int64_t n8, uint16_t* out,
                           cudaStream_t st);
// FP8 caches on Hopper's wgmma stage 2 (SparseRunner's bf16 shadow): pages page_table[
// page_begin .. + n_pages) of kc / vc as bf16 code values (kv_codes8_bf16: the values the
// FP8 stage-2 producers put in their ring, so stage 2 over the shadow computes the same
// bits) in shadow pages base .. base + n_pages of k_shadow / v_shadow ([pages, page_size,
// kvh, d] bf16), and shadow_pt[page_begin + i] = base + i: the sequence's page table into the
// shadow.
void launch_kv_pages_bf16(int kf, const int32_t* page_table, int page_begin, int n_pages,
                          int base, const CacheGeom& g, const uint8_t* kc, const uint8_t* vc,
                          bf16* k_shadow, bf16* v_shadow, int32_t* shadow_pt, cudaStream_t st);
size_t attention_smem_bytes(int G, int d);
// Dense rows (not sparse, fewer than flash_min tokens in their call): out[T, nh*d]. Rows of
// split calls (DevSeq::split_row: decode and verify rows) are split over `splits` parts of
// their keys, the partials part[R*nh*splits, d], ml[R*nh*splits, 2] (R: the step's split
// rows, by split_row) merged by launch_combine; other rows are never split, so a row's
// numbers do not depend on what else is in its step.
template <typename T>
void launch_attention(const T* q, const StepRows& s, const T* kc, const T* vc, const AttnParams& p,
                      int splits, T* out, float* part, float* ml, int max_smem, cudaStream_t st);
// launch_attention over FP8 caches (kf kKvE4m3 / kKvE5m2; values code · p.scale, exactly the
// CPU's).
void launch_attention_fp8(int kf, const bf16* q, const StepRows& s, const uint8_t* kc,
                          const uint8_t* vc, const AttnParams& p, int splits, bf16* out,
                          float* part, float* ml, int max_smem, cudaStream_t st);
// out[r, h] = merge of the splits' partials for every row r of a split call (after
// launch_attention and launch_sparse_attention wrote the partials of their rows); with a
// gate [T, nh*d]: times sigmoid(gate), as launch_mul_sigmoid would.
template <typename T>
void launch_combine(const DevSeq* seqs, int S, const float* part, const float* ml, int splits,
                    int nh, int d, const T* gate, T* out, cudaStream_t st);

// ---- InfLLM-v2 rows on the tensor cores (cuda_infllm_select.cu, cuda_infllm_attn.cu) ----
// Rows of sparse sequences are processed in tiles of up to kSparseTileRows consecutive
// rows of one sequence (tiles[i] = (first row, rows)); every sequence of a step is tiled, so
// a decode step of B rows has B tiles (the kernels skip tiles of dense sequences). Query
// heads per KV head must be 16 (SPEC §9.6), head_dim one of infllm_head_dim_supported.
inline constexpr int kSparseTileRows = 8;
inline constexpr int kEntryTile = 64;  // compressed entries per tile of the selection kernels
bool infllm_head_dim_supported(int d);
struct SelectParams {
  CacheGeom g;
  int nh;
  float tau;
  int init_blocks, local_blocks, total_topk;
  int nb_stride;                  // blocks per (row, kv head) in SelectWork::bscore
  int et_stride;                  // entry tiles per (row, kv head) in SelectWork::edge
  // grid.z of the two scoring kernels for rows of split calls (DevSeq::split_row; their
  // level-2 partials merge in a fixed order), so a row's numbers depend only on its own row.
  // Other rows' level-2 sums are never split; their level-1 entry tiles may be (the score
  // launcher's part count, which changes no number).
  int lse_splits, score_splits;
  // The rows of unsplit calls scored by launch_select_score_sm90 (the runner sets it where
  // select_score_sm90_supported; tests compare both kernels).
  bool sm90_scores = false;
};
struct SelectWork {  // rows = launched tiles * kSparseTileRows
  float2* ml;        // [rows, nh, lse_splits] level-2 (max, sum) of each part, log2 units
  bf16* bscore;      // [rows, kvh, nb_stride] pooled block scores
  float* edge;       // [rows, kvh, et_stride] score of each entry tile's last entry
};
size_t select_topk_smem_bytes(int nb_stride);
// Selection of the rows of tiles[tile_begin, tile_begin + n_tiles): sel[T, kvh, total_topk]
// (ascending block ids), sel_cnt[T, kvh]. c1, c2: bf16, or FP8 codes (kf kKvE4m3 / kKvE5m2)
// whose K scale the caller has multiplied into p.tau (the scores are tau · q · (code · scale)).
void launch_infllm_select(int d, const bf16* q, const StepRows& s, const int2* tiles,
                          int tile_begin, int n_tiles, const void* c1, const void* c2,
                          const SelectParams& p, const SelectWork& w, int32_t* sel,
                          int32_t* sel_cnt, cudaStream_t st, int kf = kKvAct);
// Hopper (sm_90) with d = 128: the level-1 scores of the rows of unsplit calls (prompt
// chunks) on wgmma (cuda_infllm_select_sm90.cu); launch_infllm_select_scores then leaves
// those rows to it.
bool select_score_sm90_supported(int d);
void launch_select_score_sm90(const bf16* q, const StepRows& s, const int2* tiles,
                              int tile_begin, int n_tiles, const void* c1, const SelectParams& p,
                              const SelectWork& w, int kf, cudaStream_t st);
// Its level-2 (SelectWork::ml) and level-1 (bscore, edge) kernels (cuda_infllm_select.cu);
// launch_infllm_select then runs the top-k kernel (cuda_infllm_topk.cu).
void launch_infllm_select_scores(int d, const bf16* q, const StepRows& s, const int2* tiles,
                                 int tile_begin, int n_tiles, const void* c1, const void* c2,
                                 const SelectParams& p, const SelectWork& w, cudaStream_t st,
                                 int kf);
struct SparseAttnParams {
  CacheGeom g;
  int nh;
  float tau;
  int total_topk;
  int nb_words;   // 32-bit words of a row's block bitmap (max blocks of a sequence)
  int nkt_words;  // words of the 64-key tile bitmap (max tiles of a sequence)
  int list_cap;   // max 64-key tiles in the union of a tile's selections
  // Dense rows of calls of fewer tokens than this (decode rows) are computed here too, as
  // rows that selected every block up to their own; 0: sparse rows only.
  int dense_below;
  // Decode rows: their tiles split into `splits` parts (the partials launch_combine merges;
  // 1: no split), spb (1..kSparseTileRows) parts per block: grid.z = ceil(splits / spb).
  // spb changes only which block computes a part, never a number.
  int splits = 1, spb = 1;
  // FP8 caches: kv_fmt kKvE4m3 / kKvE5m2 (tau then includes the K scale) and the V scale,
  // applied to the output (and to split partials).
  int kv_fmt = kKvAct;
  float v_scale = 1.f;
  // The sparse rows of unsplit calls (prompt chunks) are launch_sparse_attention_sm90's: the
  // mma.sync kernel skips them.
  bool sm90_prefill_rows = false;
};
size_t sparse_attn_smem_bytes(int d, const SparseAttnParams& p);
// Stage 2 of every sparse row of the step: out[T, nh*d] (p.splits == 1) or partials as
// launch_attention's.
void launch_sparse_attention(int d, const bf16* q, const StepRows& s, const int2* tiles,
                             int n_tiles, const void* kc, const void* vc, const int32_t* sel,
                             const int32_t* sel_cnt, const SparseAttnParams& p, bf16* out,
                             float* part, float* ml, cudaStream_t st);
// Hopper (cuda_infllm_attn_sm90.cu): stage 2 of the sparse rows of unsplit calls (prompt
// chunks) on wgmma, 4 rows x 16 query heads per warpgroup; the other tiles' blocks return at
// once. Needs an sm_90 device, head_dim 128, 16 query heads per KV head
// (sparse_attn_sm90_supported), and for an FP8 cache its TMA maps.
bool sparse_attn_sm90_supported(int d, int q_heads_per_kv_head);
size_t sparse_attn_sm90_smem_bytes(const SparseAttnParams& p);
// TMA descriptors (CUtensorMap, 128 bytes each) of one layer's K and V caches [tokens,
// kvh * 128], boxes of 64 tokens x 128 bytes (bf16: 64 columns; FP8 codes, kv_fmt kKvE4m3 /
// kKvE5m2: 128): the kernel's producers then load a tile by bulk copies instead of 128
// threads' cp.async. Made only for pages of a multiple of 64 tokens (a 64-key tile is one
// page's consecutive rows); make_sparse_attn_sm90_maps returns false where TMA or the layout
// is not available.
struct Sm90KvMaps {
  alignas(64) unsigned char k[128];
  alignas(64) unsigned char v[128];
};
bool make_sparse_attn_sm90_maps(const void* kc, const void* vc, int64_t tokens, int kvh,
                                int page_size, int kv_fmt, Sm90KvMaps* out);
// maps: the layer's (make_sparse_attn_sm90_maps), or null for cp.async producers (bf16
// caches only).
void launch_sparse_attention_sm90(const bf16* q, const StepRows& s, const int2* tiles,
                                  int n_tiles, const void* kc, const void* vc,
                                  const Sm90KvMaps* maps, const int32_t* sel,
                                  const int32_t* sel_cnt, const SparseAttnParams& p, bf16* out,
                                  cudaStream_t st);

// Dense causal attention of one long call (cuda_flash.cu, head_dim 128, tensor cores):
// rows token_begin .. token_begin + num_tokens of q/out, keys 0 .. past_len + row. kc, vc:
// bf16, or FP8 codes (kf kKvE4m3 / kKvE5m2) with the K scale multiplied into tau by the
// caller and the V scale applied to the output.
struct FlashSeq {
  int32_t token_begin, num_tokens, page_begin;
  long long past_len;
};
bool flash_prefill_supported(int d);
void launch_flash_prefill(const bf16* q, const FlashSeq& s, const int32_t* page_table,
                          const void* kc, const void* vc, const CacheGeom& g, int GH, int nh,
                          float tau, bf16* out, cudaStream_t st, int kf = kKvAct,
                          float v_scale = 1.f);

// ---- fp32 mode's InfLLM-v2 rows (cuda_f32_select.cu; stage 2 in cuda_sparse.cu) ----
// CUDA-core fp32 replacements of the tensor-core selection and stage-2 kernels, with the CPU
// backend's fp32 numbers: stage-1 scores Σ_h exp(s1_h − m_h) / l_h (exp and l in double, as
// CpuBackend), not rounded; pooling, forced blocks and top-k (ties to the lower block) of
// SPEC §9.5. One block per (sparse row, KV head) of the step: sel[T, kvh, total_topk]
// (ascending), sel_cnt[T, kvh]. Rows of dense sequences are skipped.
// Shared memory of launch_f32_select: G query heads per KV head, head_dim d, SelectParams::
// nb_stride blocks of block / stride1 = r level-1 entries.
size_t f32_select_smem_bytes(int G, int d, int nb_stride, int r);
void launch_f32_select(const float* q, const StepRows& s, const float* c1, const float* c2,
                       const SelectParams& p, int max_smem, int32_t* sel, int32_t* sel_cnt,
                       cudaStream_t st);
// Stage 2 of the sparse rows over their selected blocks (attention_kernel's rules; splits and
// partials as launch_attention's).
void launch_attention_selected_f32(const float* q, const StepRows& s, const float* kc,
                                   const float* vc, const AttnParams& p, const int32_t* sel,
                                   const int32_t* sel_cnt, int splits, float* out, float* part,
                                   float* ml, int max_smem, cudaStream_t st);

}  // namespace sala::cuda
