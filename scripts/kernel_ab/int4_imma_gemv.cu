// The W4A16 GEMV of runs of <= kInt4ImmaMaxRows (8) rows on the int8 tensor cores (issue 22;
// an experiment beside the product, int4_imma.h says why). The ring GEMV
// (cuda_gemv_int4.cu) issues 11 of its ~20 SASS instructions per 256 weights to turn codes into
// bf16 (3 SHF + 4 LOP3 + 4 HFMA2 per word of 8 codes); here the codes stay integers. Static
// stage loop 864 / 895 / 1,142 instructions at M <= 2 / 4 / 8 against the ring GEMV's 1,267,
// yet slower on the H200 (session 35: 9B GEMVs of a decode step at M = 1, 2.575 vs 2.265 ms).
//
// Numerics. Per x row m and group of 128 k (the weight group: group 128 only), x enters as
// exact fixed point x_int = rint(x · 2^E), E the largest power keeping |x_int| < 2^30 (a bf16 x
// within 2^-22 of the group's largest |x| is exact; smaller ones are rounded to 2^-E), split
// into 4 balanced base-256 digits d_l (int8): x_int = Σ_l d_l 256^l. A repacked word's low and
// high nibbles (w & 0x0f0f0f0f, (w >> 4) & 0x0f0f0f0f: the stored codes c = q + 8 as bytes) are
// the u8 A operand of mma.m16n8k32.u8.s8, the digits the s8 B columns (digit_col). The int32
// sums a_l = Σ c d_l are exact, and so are p = a_{2j+1} 256 + a_{2j} − 8 (Σ d_{2j+1} 256 +
// Σ d_{2j}) (the bias of c = q + 8; |p| < 2^26). The group's Σ_k q_k x_int,k = p_0 + 65536 p_1
// is formed in fp32 (float(p_0), float(p_1) round once |p| > 2^24, then one fma: ~2^-23 of the
// group's term) and added as out = fma(·, s · 2^−E, out) (s · 2^−E exact unless subnormal).
// So y = Σ_g s_g 2^−E_g Σ q x_int in fp32, then the 8 warps' partials in warp order and one
// bf16 rounding: the ring GEMV's class (at most 2 bf16 ulps from the exact product on a
// cancelling output; scripts/int4_bias_sim.py "limbs4"; a literal emulation of this file,
// session 35: ≤ 0.5 ulp on its shapes), but not its bits. A group holding inf / NaN makes the
// row's outputs NaN; a group whose largest |x| is below 2^-97 keeps fewer digits (E is capped
// at 126 so that 2^-E stays normal), and s · 2^-E turns subnormal for groups below about
// 2^-97 s: outputs near 1e-38 lose bits, as the ring GEMV's do near fp32's subnormals.
//
// Row invariance: a row's digits, its B columns, its lanes' sums and the epilogue's warp order
// depend only on that row and K, so a row's result is bit-identical for any M in 1..8 (not to
// the ring GEMV's).
//
// Launch: a digit kernel (one warp per group and x row) writes x's digits into the scratch in
// B-fragment order, then the GEMV runs on the ring GEMV's machinery (persistent CTAs, 8 K
// slices, the 3-stage cp.async weight ring with its scale ring, the tile walk with silu_pair,
// finish_pass's epilogue through GemvOut). Both under PDL: the digit kernel waits for x's
// producer, the GEMV streams its first stages while the digit kernel runs and waits for it
// before reading the digits. A GEMV after this one waits for its completion before its digit
// kernel overwrites the scratch.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_int4.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_smem_optin.h"
#include "int4_imma.h"

namespace sala::cuda {
namespace {
using namespace gemv;

constexpr int kRowsPerTile = 2;                               // x rows per n8 tile
constexpr int kMaxTiles = kInt4ImmaMaxRows / kRowsPerTile;    // 4
static_assert(kRowsPerTile * kMaxTiles <= kPass, "finish_pass: one pass of kPass columns");

// n8 tiles for M rows: 1, 2 or 4.
constexpr int tiles_for(int M) { return M <= 2 ? 1 : M <= 4 ? 2 : 4; }

// x's digits for one GEMV, in the scratch (sized for kMaxTiles tiles and K <= max_k).
// frag [K / 32][8 nt][4 words] of uint2 {b0, b1}: the B registers of the IMMA of word i for a
// lane (g, t) whose chunk is c (k 32 c ..), n-tile nt, column 8 nt + g (digit_col). corr
// [K / 128][2 nt][8]: x row m's bias of c = q + 8 as the IMMA accumulators' start values, −8 ×
// {S0, S1, S0, S1, S2, S3, S2, S3} of S_l = Σ of the group's digits l of the row (quad h: the
// C fragment of the tile holding its digits 2h, 2h + 1 in columns 2t, 2t + 1, rows g and
// g + 8). xs [K / 128][2 nt]: 2^−E of x row m in the group (NaN when it holds inf / NaN).
struct XDigits {
  uint2* frag;
  int* corr;
  float* xs;
  int nt;
};

// B column of digit l of x row m, for nt n8 tiles. An IMMA lane (g, t) gets columns 2t, 2t + 1
// of each tile's accumulator. nt = 1 (M <= 2): column 4 m + l, so lanes 2m' and 2m' + 1 hold
// the digit pairs 0, 1 and 2, 3 of x row m' and join them by a shuffle (both then hold the
// row's value). nt >= 2: digits 2h, 2h + 1 of x row m in tile 2 (m / 4) + h, columns
// 2 (m % 4) + 0 / 1: lane t holds all four digits of rows t, t + 4 (nt = 4) in tiles (0, 1)
// and (2, 3), no shuffle, no work done twice. Digits 2h and 2h + 1 are adjacent columns in
// both layouts. A row's numbers are the same in both (exact int32 sums, the same fp32 ops).
__host__ __device__ constexpr int digit_col(int m, int l, int nt) {
  return nt == 1 ? 4 * m + l : 8 * (2 * (m / 4) + l / 2) + 2 * (m % 4) + l % 2;
}

size_t frag_bytes(int64_t K) { return size_t(K / kChunkK) * 8 * kMaxTiles * 4 * sizeof(uint2); }
size_t corr_bytes(int64_t K) { return size_t(K / kGroupK) * 16 * kMaxTiles * sizeof(int); }
size_t xs_bytes(int64_t K) { return size_t(K / kGroupK) * 2 * kMaxTiles * sizeof(float); }

XDigits digits_in(void* scratch, int64_t K, int nt) {
  auto* b = static_cast<unsigned char*>(scratch);
  return {reinterpret_cast<uint2*>(b), reinterpret_cast<int*>(b + frag_bytes(K)),
          reinterpret_cast<float*>(b + frag_bytes(K) + corr_bytes(K)), nt};
}

// Byte of uint2 {b0, b1} that holds the digit of word-local k (0..7). A repacked word's low
// nibbles (the bytes of w & 0x0f0f0f0f) are k 0, 4, 1, 5 (nibble j: k 2j, nibble j + 4:
// k 2j + 1), its high nibbles k 2, 6, 3, 7: the A registers a0 / a2 of the IMMA, which b0 / b1
// must match byte for byte.
__device__ __forceinline__ int digit_byte(int k8) {
  return ((k8 & 2) ? 4 : 0) + (((k8 & 1) << 1) | ((k8 >> 2) & 1));
}

// One warp per (group of 128 k, x row m < 2 nt): lane l takes k 4l .. 4l + 3 of the group,
// half of word l / 2; lanes 2w and 2w + 1 fill word w's bytes together (a shuffle), and each
// stores two of its four digit columns (digit pair `half`) as 8-byte words. Rows M .. 2 nt − 1
// get zero digits.
// x has no __restrict__: under PDL its producer may still be running until pdl_wait.
__global__ void int4_digits_kernel(const bf16* x, int64_t ldx, int M, XDigits xd) {
  pdl_begin();
  const int grp = blockIdx.x, m = blockIdx.y, lane = threadIdx.x, cols = 8 * xd.nt;
  const int k0 = grp * kGroupK + lane * 4;
  uint2 raw = make_uint2(0, 0);
  if (m < M) raw = *reinterpret_cast<const uint2*>(x + m * ldx + k0);
  const bf16* h = reinterpret_cast<const bf16*>(&raw);
  float v[4], amax = 0.f;
  bool finite = true;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = __bfloat162float(h[i]);
    amax = fmaxf(amax, fabsf(v[i]));
    finite = finite && isfinite(v[i]);
  }
  finite = __all_sync(~0u, finite);
#pragma unroll
  for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, o));
  const int E = finite && amax > 0.f ? min(29 - ilogbf(amax), 126) : 0;  // |x_int| < 2^30
  int sum[4] = {0, 0, 0, 0};
  uint64_t col[4] = {0, 0, 0, 0};  // this lane's bytes of the word's uint2, per digit
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int r = finite ? __float2int_rn(ldexpf(v[i], E)) : 0;
    const int byte = digit_byte((k0 + i) & 7);
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int dl = ((r + 128) & 255) - 128;  // balanced digit: r = dl + 256 r'
      r = (r - dl) >> 8;
      sum[l] += dl;
      col[l] |= uint64_t(uint8_t(dl)) << (8 * byte);
    }
  }
#pragma unroll
  for (int l = 0; l < 4; ++l) col[l] |= __shfl_xor_sync(~0u, col[l], 1);  // the pair's bytes
  const int c = k0 / kChunkK, word = (k0 % kChunkK) / 8, half = lane & 1;
  auto* f = reinterpret_cast<uint64_t*>(xd.frag);
  const int64_t at = (int64_t(c) * cols + digit_col(m, 2 * half, xd.nt)) * 4 + word;
  f[at] = half ? col[2] : col[0];      // even lane: digits 0, 1; odd lane: 2, 3 (selects,
  f[at + 4] = half ? col[3] : col[1];  // not a runtime index into registers)
#pragma unroll
  for (int l = 0; l < 4; ++l)
#pragma unroll
    for (int o = 16; o; o >>= 1) sum[l] += __shfl_xor_sync(~0u, sum[l], o);
  // Lane i < 8 stores entry i of the row's 8: −8 S_l, l = 2 (i / 4) + i % 2 (selects).
  const int sl = (lane & 4) ? ((lane & 1) ? sum[3] : sum[2]) : ((lane & 1) ? sum[1] : sum[0]);
  if (lane < 8) xd.corr[(grp * 2 * xd.nt + m) * 8 + lane] = -8 * sl;
  if (lane == 0)
    xd.xs[grp * 2 * xd.nt + m] = finite ? ldexpf(1.f, -E) : __int_as_float(0x7fc00000);
}

// d = a · b + c (int32, exact).
__device__ __forceinline__ void imma(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                     uint32_t a3, uint32_t b0, uint32_t b1, const int4& c) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c.x), "r"(c.y), "r"(c.z),
        "r"(c.w));
}

// One chunk group's digits for lane (g, t): the B registers of its 4 words per n-tile, the
// bias quads of its tiles (the first IMMA's C) and, per x row of the lane (RL of them: nt = 1:
// row t / 2; else rows t + 4 j), its 2^-E. The digit kernel wrote all 2 nt rows (zeros past M,
// whose columns are never stored); a group past the warp's slice (ok false) is not read, its
// registers are left undefined and never used. From L1 / L2: every CTA reads them.
template <int NT>
struct Digits {
  static constexpr int RL = NT == 1 ? 1 : NT / 2;
  uint32_t b[NT][4][2];
  int4 cr[NT];
  float xs[RL];
  __device__ __forceinline__ void load(const XDigits& xd, int c, int cg, int g, int t, bool ok) {
    const auto* frag = reinterpret_cast<const uint4*>(xd.frag);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint4* fc = frag + (int64_t(c) * 8 * NT + 8 * nt + g) * 2;
      const uint4 b01 = ldg_if(fc, ok), b23 = ldg_if(fc + 1, ok);  // words 0 1 | 2 3
      b[nt][0][0] = b01.x, b[nt][0][1] = b01.y, b[nt][1][0] = b01.z, b[nt][1][1] = b01.w;
      b[nt][2][0] = b23.x, b[nt][2][1] = b23.y, b[nt][3][0] = b23.z, b[nt][3][1] = b23.w;
    }
    const auto* corr = reinterpret_cast<const uint4*>(xd.corr) + cg * 4 * NT;  // [2 NT][2]
    const float* xsg = xd.xs + cg * 2 * NT;
    auto quad = [](uint4 v) { return make_int4(int(v.x), int(v.y), int(v.z), int(v.w)); };
    if constexpr (NT == 1) {
      cr[0] = quad(ldg_if(corr + t, ok));  // row t / 2, digit pair t % 2
      xs[0] = ok ? __ldg(xsg + t / 2) : 0.f;
    } else {
#pragma unroll
      for (int j = 0; j < RL; ++j) {
        const int m = t + 4 * j;
        cr[2 * j] = quad(ldg_if(corr + 2 * m, ok));          // digits 0, 1: tile 2j
        cr[2 * j + 1] = quad(ldg_if(corr + 2 * m + 1, ok));  // 2, 3: tile 2j + 1
        xs[j] = ok ? __ldg(xsg + m) : 0.f;
      }
    }
  }
};

// y[m, n] = Σ_g s[n, g] 2^-E Σ_{k in g} q[n, k] x_int[m, k] for m < M <= 2 NT, group 128,
// through GemvOut. Lane (g, t) holds the sums of weight rows g, g + 8 of each 16-row half of
// the tile for its x rows (Digits::RL of them; nt = 1: lanes 2m' and 2m' + 1 the same values).
template <int NT>
__global__ void __launch_bounds__(kThreads, 1)
    gemv4_imma_kernel(XDigits xd, const uint32_t* __restrict__ w, const float* __restrict__ ws,
                      int64_t N, int K, int M, GemvOut o, int ntiles) {
  extern __shared__ __align__(128) unsigned char smem[];
  pdl_trigger();  // a kernel after this one may start its prologue
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  Int4Ring<bulk_rows(NT)> r(smem, w, ws, N, K, kGroupK, o.silu_pair, ntiles);  // first stages
  const Slice& s = r.s;
  const Walk& wk = r.wk;
  pdl_wait();  // the digits (and y's readers) only after the digit kernel completed
  const uint32_t lo = lane_off(g, t);
  const bool odd = t & 1;
  Digits<NT> dc, dn;  // this chunk group's digits, the next one's
  int u = 0;
  for (int ti = 0; ti < wk.ntc; ++ti) {
    constexpr int RL = Digits<NT>::RL;
    float out[2][RL][2] = {};
    for (int st = 0; st < wk.nst; ++st, ++u) {
      const int c0 = s.cb + st * kCps;
      dc.load(xd, c0 + t, c0 / 4, g, t, true);  // group 0, in flight while waiting
      r.wait<kStages - 2>(u);  // stage u landed; slot (u - 1) % S read
      r.issue();  // stage u + 2
      const uint32_t base = r.base(u), sbase = r.sbase(u);
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        if (c0 + 4 * v >= s.ce) break;  // uniform: the slice ends at a whole group
        if (v < 3)  // the next group's digits while this one computes
          dn.load(xd, c0 + 4 * (v + 1) + t, c0 / 4 + v + 1, g, t, c0 + 4 * (v + 1) < s.ce);
#pragma unroll
        for (int rt = 0; rt < 2; ++rt) {
          const uint4 Wg = lds(base + lo + row_off(rt * 16) + v * 64);
          const uint4 W8 = lds(base + lo + row_off(rt * 16 + 8) + v * 64);
          const float sg = lds_f32(sbase + (rt * 16 + g) * 16 + v * 4);
          const float s8 = lds_f32(sbase + (rt * 16 + g + 8) * 16 + v * 4);
          const uint32_t wg[4] = {Wg.x, Wg.y, Wg.z, Wg.w}, w8[4] = {W8.x, W8.y, W8.z, W8.w};
          int acc[NT][4];  // from the bias: p = a_hi 256 + a_lo is then the pair's value
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t a0 = wg[i] & 0x0f0f0f0fu, a1 = w8[i] & 0x0f0f0f0fu;
            const uint32_t a2 = (wg[i] >> 4) & 0x0f0f0f0fu, a3 = (w8[i] >> 4) & 0x0f0f0f0fu;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
              imma(acc[nt], a0, a1, a2, a3, dc.b[nt][i][0], dc.b[nt][i][1],
                   i == 0 ? dc.cr[nt] : make_int4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]));
          }
          if constexpr (NT == 1) {
            // Columns 2t, 2t + 1: digits 2 (t % 2), + 1 of x row t / 2. The pair's
            // p_0 + 65536 p_1 in fp32, the same on both lanes of the pair.
            const float pg = float(acc[0][1] * 256 + acc[0][0]);
            const float p8 = float(acc[0][3] * 256 + acc[0][2]);
            const float qg = __shfl_xor_sync(~0u, pg, 1), q8 = __shfl_xor_sync(~0u, p8, 1);
            const float tg = odd ? fmaf(pg, 65536.f, qg) : fmaf(qg, 65536.f, pg);
            const float t8 = odd ? fmaf(p8, 65536.f, q8) : fmaf(q8, 65536.f, p8);
            out[rt][0][0] = fmaf(tg, sg * dc.xs[0], out[rt][0][0]);
            out[rt][0][1] = fmaf(t8, s8 * dc.xs[0], out[rt][0][1]);
          } else {
#pragma unroll
            for (int j = 0; j < RL; ++j) {  // x row t + 4j: digits 0, 1 in tile 2j, 2, 3 in 2j + 1
              const int(&d01)[4] = acc[2 * j], (&d23)[4] = acc[2 * j + 1];
              const float tg = fmaf(float(d23[1] * 256 + d23[0]), 65536.f,
                                    float(d01[1] * 256 + d01[0]));
              const float t8 = fmaf(float(d23[3] * 256 + d23[2]), 65536.f,
                                    float(d01[3] * 256 + d01[2]));
              out[rt][j][0] = fmaf(tg, sg * dc.xs[j], out[rt][j][0]);
              out[rt][j][1] = fmaf(t8, s8 * dc.xs[j], out[rt][j][1]);
            }
          }
        }
        if (v < 3) dc = dn;
      }
    }
    // This lane's x rows of weight rows rt 16 + g (+ 8) into the pass buffer (nt = 1: one
    // lane of each pair).
    if (NT > 1 || !odd)
#pragma unroll
      for (int rt = 0; rt < 2; ++rt)
#pragma unroll
        for (int j = 0; j < RL; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            r.red[warp][rt * 16 + g + 8 * h][NT == 1 ? t / 2 : t + 4 * j] = out[rt][j][h];
    __syncthreads();
    finish_pass<kRows, Unscaled, kPass>(r.red, 0, int64_t(wk.tile(ti)) * kRows, N, M, o,
                                        wk.epi(ti), r.gate, Unscaled{});
    __syncthreads();  // red and gate's reads done before the next tile writes them
  }
  cp_wait<0>();  // only empty groups can remain
}

using Setup = RingDevice;

const Setup& setup() {
  static const Setup s = ring_device(kRingSmem);
  static OncePerDevice attributes;  // per device: a TP rank's backend may run on another GPU
  if (s.ring)
    attributes([] {
      for (auto* k : {gemv4_imma_kernel<1>, gemv4_imma_kernel<2>, gemv4_imma_kernel<4>})
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingSmem));
    });
  return s;
}

}  // namespace

void gemv_int4_imma_init() { setup(); }

size_t gemv_int4_imma_scratch_bytes(int64_t K) {
  return K > 0 && K % kGroupK == 0 ? frag_bytes(K) + corr_bytes(K) + xs_bytes(K) : 0;
}

bool gemv_int4_imma_supported(const void* w, int64_t K, int64_t group, int64_t M) {
  return setup().ring && M >= 1 && M <= kInt4ImmaMaxRows && K > 0 && K % kGroupK == 0 &&
         group == kGroupK && K <= (int64_t(1) << 30) && aligned16(w);
}

void launch_gemv_int4_imma(const bf16* x, int64_t ldx, const uint32_t* w, const float* w_scales,
                           int64_t N, int K, int M, const GemvOut& o, void* scratch,
                           int64_t scratch_k, cudaStream_t st) {
  if (!(gemv_int4_imma_supported(w, K, kGroupK, M) && ldx % 8 == 0 && aligned16(x) &&
        w_scales && N >= 1 && scratch && aligned16(scratch) && K <= scratch_k) ||
      (o.silu_pair && !gemv_int4_silu_pair_supported(N))) {
    std::fprintf(stderr,
                 "%s:%d: int8 int4 GEMV unsupported: M = %d, K = %d, N = %lld, ldx = %lld, "
                 "scratch for K <= %lld, silu_pair = %d\n",
                 __FILE__, __LINE__, M, K, static_cast<long long>(N),
                 static_cast<long long>(ldx), static_cast<long long>(scratch_k),
                 int(o.silu_pair));
    std::abort();
  }
  const Setup& s = setup();
  const int nt = tiles_for(M);
  const XDigits xd = digits_in(scratch, K, nt);
  launch_pdl(int4_digits_kernel, dim3(unsigned(K / kGroupK), unsigned(kRowsPerTile * nt)),
             dim3(32), 0, st, x, ldx, M, xd);
  const int ntiles = int((N + kRows - 1) / kRows);  // every CTA has >= 1 tile
  auto go = [&](auto kernel) {
    launch_pdl(kernel, dim3(unsigned(std::min(ntiles, s.sms))), dim3(kThreads),
               size_t(kRingSmem), st, xd, w, w_scales, N, K, M, o, ntiles);
  };
  if (nt == 1) go(gemv4_imma_kernel<1>);
  else if (nt == 2) go(gemv4_imma_kernel<2>);
  else go(gemv4_imma_kernel<4>);
}

}  // namespace sala::cuda
