// Measurement prototype (not product code): the Hopper skinny GEMM's structure
// (cuda_skinny_sm90.cu) for W8A8 FP8 weights, wgmma.m64n64k32 e4m3 x e4m3 read from shared
// memory, against the FP8 ring GEMV (launch_gemv_fp8), which runs mma.sync and on sm_90a
// unpacks every e4m3 pair to f16 first (docs/PERF.md: 19 % of its instructions). Unsplit
// (K split left out of the prototype), one stage = 128 k (a 128-byte swizzle row of codes),
// each stage's wgmma sums promoted into fp32 registers (FP8 wgmma accumulates with reduced
// precision), epilogue (sum · sx[m]) · sw[n] as the GEMV's. Prints µs per launch and the
// relative L2 distance to the GEMV; exit 1 on a distance > 1e-2.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ab_util.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_tma_sm90.cuh"

using namespace sala::cuda;
using kernel_ab::median_us;
using kernel_ab::rng;

namespace {

constexpr int kBM = 128, kBK = 128, kNX = 64, kStages = 6, kThreads = 384;
constexpr int kStageW = kBM * kBK, kStageX = kNX * kBK;  // 16 KB, 8 KB of codes
constexpr size_t kSmem = size_t(kStages) * (kStageW + kStageX) + 1024 + 256;

struct Args {
  __nv_bfloat16* y;
  const float *sx, *sw;
  int N, M, K, tiles;
  uint32_t x_bytes;
};

#ifdef SALA_SM90A_DEVICE
__device__ __forceinline__ void wgmma_fp8(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db));
}
#endif

__global__ void __launch_bounds__(kThreads, 1)
    proto_kernel(const __grid_constant__ CUtensorMap tm_w, const __grid_constant__ CUtensorMap tm_x,
                 const Args a) {
#ifdef SALA_SM90A_DEVICE
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~uintptr_t(1023));
  uint8_t* sw = smem;
  uint8_t* sx = smem + size_t(kStages) * kStageW;
  uint64_t* full = reinterpret_cast<uint64_t*>(sx + size_t(kStages) * kStageX);
  uint64_t* empty = full + kStages;
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int nk = a.K / kBK;
  if (wg == 0) {
    if (tid != 0) return;
    int stage = 0;
    uint32_t phase = 0;
    for (int t = blockIdx.x; t < a.tiles; t += gridDim.x)
      for (int kb = 0; kb < nk; ++kb) {
        mbar_wait(&empty[stage], phase ^ 1);
        mbar_expect_tx(&full[stage], kStageW + a.x_bytes);
        tma_load_2d(sw + size_t(stage) * kStageW, &tm_w, kb * kBK, t * kBM, &full[stage]);
        tma_load_2d(sx + size_t(stage) * kStageX, &tm_x, kb * kBK, 0, &full[stage]);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    return;
  }
  const int c = wg - 1, t = tid - 128 * wg, warp = t / 32, lane = t % 32;
  int stage = 0;
  uint32_t phase = 0;
  for (int tile = blockIdx.x; tile < a.tiles; tile += gridDim.x) {
    float d[32], total[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) total[i] = 0.f;
    for (int kb = 0; kb < nk; ++kb) {
#pragma unroll
      for (int i = 0; i < 32; ++i) d[i] = 0.f;
      mbar_wait(&full[stage], phase);
      const uint32_t aw = smem_addr(sw + size_t(stage) * kStageW + c * (kStageW / 2));
      const uint32_t ax = smem_addr(sx + size_t(stage) * kStageX);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < kBK / 32; ++kk) wgmma_fp8(d, smem_desc_sw128(aw + kk * 32), smem_desc_sw128(ax + kk * 32));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      if (lane == 0) mbar_arrive(&empty[stage]);
      if (++stage == kStages) stage = 0, phase ^= 1;
#pragma unroll
      for (int i = 0; i < 32; ++i) total[i] += d[i];
    }
    const int row0 = tile * kBM + c * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = 8 * j + 2 * (lane % 4) + e, n = row0 + 8 * h;
          if (m < a.M && n < a.N)
            a.y[int64_t(m) * a.N + n] = __float2bfloat16((total[4 * j + 2 * h + e] * a.sx[m]) * a.sw[n]);
        }
  }
#endif
}

CUtensorMap map_u8(const void* base, int64_t rows, int64_t K, int box_rows) {
  return make_tma_map_2d(base, CU_TENSOR_MAP_DATA_TYPE_UINT8, rows, K, K, kBK, box_rows);
}

}  // namespace

int main() {
  const int shapes[][2] = {{4096, 4096}, {16384, 4096}, {32768, 4096}, {4096, 16384}, {73448, 4096}};
  const int rows[] = {1, 8, 16, 40, 64};
  const int64_t kMaxW = int64_t(73448) * 4096, kMaxK = 16384;
  uint64_t s = 99;
  std::vector<uint8_t> hw(static_cast<size_t>(kMaxW)), hx(static_cast<size_t>(64 * kMaxK));
  // e4m3 codes of modest magnitude: sign, exponent 4..10, any mantissa (no NaN / Inf).
  auto code = [&] { return uint8_t((rng(s) & 0x80) | ((4 + rng(s) % 7) << 3) | (rng(s) & 7)); };
  for (auto& v : hw) v = code();
  for (auto& v : hx) v = code();
  std::vector<float> hsw(73448), hsx(64);
  for (auto& v : hsw) v = float(1 + rng(s) % 100) / 4000.f;
  for (auto& v : hsx) v = float(1 + rng(s) % 100) / 400.f;
  uint8_t *w, *x;
  float *sw, *sx;
  __nv_bfloat16 *y0, *y1;
  CK(cudaMalloc(&w, hw.size()));
  CK(cudaMalloc(&x, hx.size()));
  CK(cudaMalloc(&sw, hsw.size() * 4));
  CK(cudaMalloc(&sx, hsx.size() * 4));
  CK(cudaMalloc(&y0, size_t(64) * 73448 * 2));
  CK(cudaMalloc(&y1, size_t(64) * 73448 * 2));
  CK(cudaMemcpy(w, hw.data(), hw.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(x, hx.data(), hx.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sw, hsw.data(), hsw.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sx, hsx.data(), hsx.size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  gemv_fp8_init();
  CK(cudaFuncSetAttribute(proto_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int bad = 0;
  std::printf("FP8 W8A8, µs per launch (b2b: 20 back to back): ring GEMV vs wgmma prototype "
              "(unsplit)\n%-15s %2s %8s %8s %8s %8s %9s\n", "shape", "M", "gemv", "wgmma",
              "gemv_b2b", "wg_b2b", "rel_l2");
  for (const auto& sh : shapes) {
    const int N = sh[0], K = sh[1];
    if (int64_t(N) * K > kMaxW) continue;
    for (int M : rows) {
      GemvOut o{};
      o.y[0] = y0;
      o.end[0] = N;
      o.cols[0] = N;
      o.nparts = 1;
      auto gemv = [&] { launch_gemv_fp8(x, K, sx, w, sw, N, K, M, o, st); };
      const int box = std::min(kNX, (M + 7) / 8 * 8);
      const CUtensorMap tw = map_u8(w, N, K, kBM), tx = map_u8(x, M, K, box);
      Args a{y1, sx, sw, N, M, K, (N + kBM - 1) / kBM, uint32_t(box * kBK)};
      auto proto = [&] {
        proto_kernel<<<std::min(a.tiles, sms), kThreads, kSmem, st>>>(tw, tx, a);
      };
      const float tg = median_us(gemv, st, 1), tp = median_us(proto, st, 1);
      const float bg = median_us(gemv, st, 20), bp = median_us(proto, st, 20);
      CK(cudaStreamSynchronize(st));
      std::vector<__nv_bfloat16> ha(size_t(M) * N), hb(size_t(M) * N);
      CK(cudaMemcpy(ha.data(), y0, ha.size() * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hb.data(), y1, hb.size() * 2, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (size_t i = 0; i < ha.size(); ++i) {
        const double p = __bfloat162float(ha[i]), q = __bfloat162float(hb[i]);
        num += (p - q) * (p - q);
        den += p * p;
      }
      const double rel = std::sqrt(num / std::max(den, 1e-30));
      bad += !(rel <= 1e-2);
      std::printf("%6d x %6d %2d %8.2f %8.2f %8.2f %8.2f %9.2e\n", N, K, M, tg, tp, bg, bp, rel);
    }
  }
  std::printf("%s\n", bad ? "FAILED" : "all close");
  return bad ? 1 : 0;
}
