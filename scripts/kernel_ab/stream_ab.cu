// scripts/kernel_ab/stream_ab.cu (GPU machine, CUDA toolkit only): how fast the skinny GEMVs'
// weight ring can stream from DRAM, by layout, with no arithmetic: is the row-run layout of
// the production rings (cuda_gemv_ring.cuh: a warp's stage is 32 weight rows x 256 contiguous
// bytes, rows K bytes apart) what keeps the FP8 and int4 GEMVs at ~75-80 % of the HBM rate
// (docs/PERF_LOG.md, session 36's probes: the FP8 GEMV "is the copies'")?
//
// Every variant is the production ring's shape: one CTA of 8 warps per SM, each warp its own
// 3-slot ring of 8 KB stages in shared memory filled by cp.async.bulk (evict-first in L2) on a
// per-slot mbarrier, the next-but-one stage issued right after a stage lands, each lane then
// reading 256 B of the landed stage (XOR-folded so nothing is dead). The weight [N, Kb bytes]
// is walked as the GEMVs walk it: tiles of 32 rows dealt round robin to the CTAs, warp w
// streaming the w-th eighth of every row of its CTA's tiles. Variants:
//   runR    the stage is 8192 / R rows x R contiguous bytes (R = 256: production); R > 256
//           needs Kb / 8 >= R (a warp's slice of a row holds a whole run)
//   tiled   the same bytes stored stage-contiguous (every warp's stage one 8 KB run: a
//           load-time relayout), copied by 32 bulk copies of 256 B
//   tiled1  the same, one 8 KB bulk copy by lane 0
//   ldg     plain coalesced 16-byte loads over the buffer (the read rate without a ring)
// Each launch reads one of several copies of the weight (>= 256 MB in all, so every byte
// comes from DRAM); µs per launch (median, 30 x launches back to back) and GB/s.
// Usage: stream_ab [--check] [N,Kb ...]   (default shapes: the 9B's FP8 GEMVs and int4 ones;
// --check: the walks on the host only). Build (GPU machine, from the repository's root):
//   nvcc -O2 -std=c++20 -gencode arch=compute_90a,code=sm_90a -I src -o /tmp/stream_ab \
//     scripts/kernel_ab/stream_ab.cu
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ab_util.h"
#include "backend/cuda/cuda_gemv_ring.cuh"

namespace {

// The production ring's CTA shape and copy primitives (cuda_gemv_ring.cuh; the primitives
// exist in its sm_90 device pass only, SALA_GEMV_BULK: the kernels' bodies below are empty in
// the host pass).
namespace ring = sala::cuda::gemv;
constexpr int kWarps = ring::kWarps, kThreads = ring::kThreads;
constexpr int kTileRows = 32, kStageBytes = 8192, kSlots = 3;
constexpr int kSmem = kWarps * kSlots * kStageBytes;  // 196,608 B

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

enum Layout { kRowRuns = 0, kTiled = 1, kTiledOne = 2 };

// A warp's unit u (its u-th stage): tile ti of the CTA's, row group rg (kTileRows / rows per
// stage of them), k stage ks of the warp's slice. row_off: the weight's byte offset of row r's
// run in the stage (row-run layouts); tiled_off: of the whole stage (tiled layouts). (b, G:
// the CTA and the grid, explicit so that main's --check walks it on the host.)
struct Walk {
  int64_t N, Kb;
  int run, rows, groups, kst, per_tile, tiles;  // rows per stage, row groups, k stages
  __host__ __device__ int units(int b, int G) const {
    return (tiles - b + G - 1) / G * per_tile;
  }
  __host__ __device__ int64_t row_off(int b, int G, int u, int warp, int r) const {
    const int64_t t = b + int64_t(u / per_tile) * G;
    const int rem = u % per_tile, rg = rem / kst, ks = rem % kst;
    const int64_t row = t * kTileRows + rg * rows + r;
    return row * Kb + warp * (Kb / kWarps) + int64_t(ks) * run;
  }
  __host__ __device__ int64_t tiled_off(int b, int G, int u, int warp) const {
    const int64_t t = b + int64_t(u / per_tile) * G;
    return ((t * kWarps + warp) * per_tile + u % per_tile) * int64_t(kStageBytes);
  }
};

#ifdef SALA_GEMV_BULK
template <int L>
__device__ __forceinline__ void issue(const Walk& wk, const uint8_t* w, int u, int warp, int lane,
                                      uint32_t slot, uint32_t bar) {
  if (lane == 0) ring::bar_expect(bar, kStageBytes);
  __syncwarp();
  const int b = blockIdx.x, G = gridDim.x;
  if constexpr (L == kRowRuns) {  // 8192 / run rows of `run` bytes, lane r copying row r
    for (int r = lane; r < wk.rows; r += 32)
      ring::bulk_copy(slot + r * wk.run, w + wk.row_off(b, G, u, warp, r), uint32_t(wk.run), bar);
  } else if constexpr (L == kTiled) {
    ring::bulk_copy(slot + lane * 256, w + wk.tiled_off(b, G, u, warp) + lane * 256, 256, bar);
  } else {
    if (lane == 0) ring::bulk_copy(slot, w + wk.tiled_off(b, G, u, warp), kStageBytes, bar);
  }
}

#endif

template <int L>
__global__ void __launch_bounds__(kThreads, 1) ring_kernel(const uint8_t* w, Walk wk, uint4* out) {
#ifdef SALA_GEMV_BULK
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[kWarps][kSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t slots = smem_addr(smem) + warp * kSlots * kStageBytes;  // this warp's ring
  if (lane == 0) {
    for (int i = 0; i < kSlots; ++i) ring::bar_init(smem_addr(&bars[warp][i]));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  const int U = wk.units(blockIdx.x, gridDim.x);
  for (int u = 0; u < kSlots - 1 && u < U; ++u)
    issue<L>(wk, w, u, warp, lane, slots + u * kStageBytes, smem_addr(&bars[warp][u]));
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int u = 0; u < U; ++u) {
    const int slot = u % kSlots;
    ring::bar_wait(smem_addr(&bars[warp][slot]), uint32_t(u / kSlots) & 1);
    if (u + kSlots - 1 < U) {  // into the slot read in iteration u - 1
      const int s2 = (u + kSlots - 1) % kSlots;
      issue<L>(wk, w, u + kSlots - 1, warp, lane, slots + s2 * kStageBytes,
               smem_addr(&bars[warp][s2]));
    }
    const uint32_t base = slots + slot * kStageBytes + lane * 16;
#pragma unroll
    for (int i = 0; i < kStageBytes / 512; ++i) {  // 16 reads of 16 B per lane: the whole stage
      const uint4 v = ring::lds(base + i * 512);
      acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
    }
    __syncwarp();  // every lane's reads of this slot done before it is refilled
  }
  out[blockIdx.x * kThreads + threadIdx.x] = acc;
#endif
}

__global__ void ldg_kernel(const uint4* __restrict__ w, int64_t n16, uint4* out) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {  // 4 loads in flight per thread
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __ldcs(w + i + j * stride);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc.x ^= v[j].x, acc.y ^= v[j].y, acc.z ^= v[j].z, acc.w ^= v[j].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = __ldcs(w + i);
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  out[blockIdx.x * int64_t(blockDim.x) + threadIdx.x] = acc;
}

struct Shape {
  int64_t N, Kb;
  const char* what;
};

struct Variant {
  std::string name;
  int layout;
  Walk wk;
};

// The variants that fit a shape: row runs of 256..2048 bytes (a warp's slice of a row must hold
// a run, and a stage at most a tile's 32 rows), and the tiled layouts of the same stages.
std::vector<Variant> variants(const Shape& s) {
  std::vector<Variant> v;
  const int tiles = int(s.N / kTileRows), slice = int(s.Kb / kWarps);
  for (int run : {256, 512, 1024, 2048}) {
    const int rows = kStageBytes / run;
    if (slice % run || rows > kTileRows) continue;
    Walk wk{s.N, s.Kb, run, rows, kTileRows / rows, slice / run, 0, tiles};
    wk.per_tile = wk.groups * wk.kst;
    v.push_back({"run" + std::to_string(run), kRowRuns, wk});
  }
  if (slice * kTileRows % kStageBytes == 0) {
    Walk wt{s.N, s.Kb, 256, kTileRows, 1, slice / 256, slice * kTileRows / kStageBytes, tiles};
    v.push_back({"tiled", kTiled, wt});
    v.push_back({"tiled1", kTiledOne, wt});
  }
  return v;
}

// Host check of the walks: every 256-byte granule of the weight is copied exactly once, for
// grids of G CTAs. Returns the number of bad granules.
int64_t check_walk(const Variant& v, int G) {
  const Walk& wk = v.wk;
  std::vector<uint8_t> seen(size_t(wk.N * wk.Kb / 256), 0);
  auto mark = [&](int64_t off, int64_t bytes) {
    for (int64_t o = off; o < off + bytes; o += 256) ++seen[size_t(o / 256)];
  };
  for (int b = 0; b < G; ++b)
    for (int warp = 0; warp < kWarps; ++warp)
      for (int u = 0; u < wk.units(b, G); ++u) {
        if (v.layout == kRowRuns)
          for (int r = 0; r < wk.rows; ++r) mark(wk.row_off(b, G, u, warp, r), wk.run);
        else
          mark(wk.tiled_off(b, G, u, warp), kStageBytes);
      }
  int64_t bad = 0;
  for (uint8_t c : seen) bad += c != 1;
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kernel_ab;
  std::vector<Shape> shapes;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    long long n = 0, kb = 0;
    if (std::string(argv[i]) == "--check") {
      check = true;
      continue;
    }
    if (std::sscanf(argv[i], "%lld,%lld", &n, &kb) != 2 || n % kTileRows || kb % (kWarps * 256)) {
      std::fprintf(stderr, "shape '%s': N,Kb with N %% 32 == 0 and Kb %% 2048 == 0\n", argv[i]);
      return 2;
    }
    shapes.push_back({n, kb, "given"});
  }
  if (shapes.empty())
    shapes = {{32768, 4096, "FP8 gate_up 32768x4096"},
              {12288, 4096, "FP8 qkvz 12288x4096"},
              {4096, 16384, "FP8 down 4096x16384"},
              {32768, 2048, "int4 gate_up 32768x4096"},
              {4096, 8192, "int4 down 4096x16384"}};
  if (check) {  // no GPU needed
    int64_t bad = 0;
    for (const Shape& s : shapes)
      for (const Variant& v : variants(s))
        for (int G : {132, 114, 7}) {
          const int64_t b = check_walk(v, std::min<int>(G, int(s.N / kTileRows)));
          if (b) std::printf("%s %s G=%d: %lld granules not copied once\n", s.what,
                             v.name.c_str(), G, static_cast<long long>(b));
          bad += b;
        }
    std::printf("walk check: %s\n", bad ? "FAILED" : "every granule copied once");
    return bad ? 1 : 0;
  }
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s, %d SMs; µs per launch (median) and GB/s of the weight bytes\n", prop.name, sms);
  for (auto* k : {ring_kernel<kRowRuns>, ring_kernel<kTiled>, ring_kernel<kTiledOne>})
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  uint4* out = nullptr;
  CK(cudaMalloc(&out, size_t(sms) * 4 * 512 * sizeof(uint4)));  // ldg's grid is the largest
  std::printf("%-26s %-8s %10s %8s\n", "shape", "variant", "us", "GB/s");
  for (const Shape& s : shapes) {
    const size_t bytes = size_t(s.N * s.Kb);
    const int copies = int(std::max<size_t>(2, (size_t(256) << 20) / bytes + 1));
    std::vector<uint8_t*> w(size_t(copies), nullptr);
    for (auto& p : w) {
      CK(cudaMalloc(&p, bytes));
      CK(cudaMemset(p, 0x5a, bytes));
    }
    const int grid = std::min(int(s.N / kTileRows), sms);
    auto row = [&](const std::string& name, float us) {
      std::printf("%-26s %-8s %10.2f %8.0f\n", s.what, name.c_str(), us,
                  double(bytes) / us * 1e-3);
    };
    int next = 0;
    for (int rep = 0; rep < 2; ++rep) {  // every variant twice, in turn
      for (const Variant& v : variants(s)) {
        const float us = median_us(
            [&] {
              const uint8_t* p = w[size_t(next++ % copies)];
              if (v.layout == kRowRuns)
                ring_kernel<kRowRuns><<<grid, kThreads, kSmem, st>>>(p, v.wk, out);
              else if (v.layout == kTiled)
                ring_kernel<kTiled><<<grid, kThreads, kSmem, st>>>(p, v.wk, out);
              else
                ring_kernel<kTiledOne><<<grid, kThreads, kSmem, st>>>(p, v.wk, out);
            },
            st, copies);
        CK(cudaGetLastError());
        row(v.name, us);
      }
      const float c = median_us(
          [&] {
            const auto* p = reinterpret_cast<const uint4*>(w[size_t(next++ % copies)]);
            ldg_kernel<<<sms * 4, 512, 0, st>>>(p, int64_t(bytes / 16), out);
          },
          st, copies);
      CK(cudaGetLastError());
      row("ldg", c);
    }
    CK(cudaStreamSynchronize(st));
    for (auto* p : w) CK(cudaFree(p));
  }
  return 0;
}
