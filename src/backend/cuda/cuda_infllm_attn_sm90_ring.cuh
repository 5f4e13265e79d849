// The K/V ring of the wgmma stage-2 kernel (cuda_infllm_attn_sm90.cu): its geometry (block
// shape, slots, the 128-byte-swizzled tile layout that wgmma and ldmatrix read) and the three
// producers that fill it (cp.async, TMA, TMA + FP8 conversion). Included by that file only.
#pragma once
#include "backend/cuda/cuda_infllm_attn.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"
#include "backend/cuda/cuda_tma_sm90.cuh"

namespace sala::cuda::stage2_sm90 {

using namespace stage2;

constexpr int kD = 128;                                 // head_dim
constexpr int kRows = kSparseTileRows;                  // rows per block
constexpr int kGroupRows = 4;                           // rows per consumer warpgroup (m64)
constexpr int kGroups = kRows / kGroupRows;             // consumer warpgroups
constexpr int kThreads = (kGroups + 1) * 128;           // + the producer warpgroup
// K/V ring slots: 5 with a bf16 cache (H200, 128K prefill, session 29: stage 2 868 -> 841 ms
// against 4 slots); an FP8 cache's staging buffers leave room for 4. The shared memory at 512K
// (bits and tile list of 8 rows) still fits: sparse_attn_sm90_smem_bytes, checked at start-up.
template <int KF>
constexpr int kSlotsOf = KF == kKvAct ? 5 : 4;
// Tiles a producer thread has in flight (cp.async groups): it hands tile i - 2 over once it
// has issued tile i (it must see its own copies land before the proxy fence that makes them
// visible to wgmma). A consumer waits for a tile only when it holds none, so any depth up to
// the ring's slot count is deadlock-free. Measured on the H200 (session 24): depth 2 with 5
// slots and the next tile's S issued ahead was 16 % slower.
constexpr int kInFlight = 3;
static_assert(kInFlight >= 1 && kInFlight <= kSlotsOf<kKvAct>);
constexpr int kHalfBytes = kKT * 64 * 2;                // 64 rows x 64 bf16 columns: 8 KB
constexpr int kTileBytes = 2 * kHalfBytes;              // K (or V) of a tile, d = 128
constexpr int kSlotBytes = 2 * kTileBytes;              // K, then V
constexpr int kQBytes = 64 * kD * 2;                    // one warpgroup's 64 query rows
// FP8 caches: TMA lands a tile's codes (64 rows x 128 bytes of K, then of V, 128-byte swizzle)
// in one of kStages staging buffers; the producer warpgroup converts them into a ring slot.
constexpr int kStages = 2;
constexpr int kCodeBytes = kKT * kD;                    // one tile's K (or V) codes: 8 KB
constexpr int kStageBytes = 2 * kCodeBytes;
constexpr size_t fixed_smem(bool fp8) {
  return size_t(fp8 ? kSlotsOf<kKvE4m3> : kSlotsOf<kKvAct>) * kSlotBytes +
         size_t(kGroups) * kQBytes + 1024;
}

// Byte offset of 16-byte chunk c (of 16) of row j (of 64) in a [2][64][64] bf16 tile: half
// c / 8, 128-byte rows, the chunk XOR-swizzled by j mod 8 (the 128-byte swizzle on a
// 1024-byte-aligned tile).
__device__ __forceinline__ int sw_off(int j, int c) {
  return (c >> 3) * kHalfBytes + j * 128 + (((c & 7) ^ (j & 7)) << 4);
}

#ifdef SALA_SM90A_DEVICE
__device__ __forceinline__ void produce(const int32_t* list, int n_list, unsigned char* ring,
                                        uint64_t* full, uint64_t* empty, const bf16* kc,
                                        const bf16* vc, const CacheGeom& G,
                                        const int32_t* pages, int g, long long L) {
  // Thread p copies chunk p mod 16 of rows p / 16 + 8i (i < 8) of K and of V. A slot is
  // refilled once every consumer warp has released it.
  const int tid = threadIdx.x, c = tid % 16, j0 = tid / 16;
  constexpr int kSlots = kSlotsOf<kKvAct>;
  const bool one_page = G.page_size % kKT == 0;  // a tile's keys: consecutive rows of one page
  const int64_t hoff = int64_t(g) * kD + c * 8;
  for (int i = 0; i < n_list; ++i) {
    const int slot = i % kSlots;
    if (i >= kSlots) mbar_wait(&empty[slot], uint32_t(i / kSlots - 1) & 1u);
    unsigned char* ks = ring + slot * kSlotBytes;
    unsigned char* vs = ks + kTileBytes;
    const long long p0 = 1LL * list[i] * kKT;  // < L
    const int64_t base = token_off(G, pages, p0);
#pragma unroll
    for (int k = 0; k < kKT / 8; ++k) {
      const int j = j0 + 8 * k;
      const bool ok = p0 + j < L;
      const int64_t off = !ok       ? 0
                          : one_page ? base + j * G.row + hoff
                                     : token_off(G, pages, p0 + j) + hoff;
      cp_async16(ks + sw_off(j, c), kc + off, ok ? 16 : 0);
      cp_async16(vs + sw_off(j, c), vc + off, ok ? 16 : 0);
    }
    cp_async_commit();
    if (i >= kInFlight - 1) {  // tile i - 2 landed: fence it for wgmma, then hand it over
      cp_async_wait<kInFlight - 1>();
      fence_proxy_async_smem();
      mbar_arrive(&full[(i - (kInFlight - 1)) % kSlots]);
    }
  }
  cp_async_wait<0>();  // the last tiles
  fence_proxy_async_smem();
  for (int i = max(0, n_list - (kInFlight - 1)); i < n_list; ++i) mbar_arrive(&full[i % kSlots]);
}

// The same ring filled by TMA (one thread): 4 bulk loads of 64 rows x 128 bytes per tile (K and
// V halves), completing on the slot's full barrier with the tile's bytes; the copies write the
// 128-byte-swizzled layout themselves and are async-proxy writes (no fence). Rows past the
// sequence in the tile's page hold zeros or an older sequence's keys: finite values the row
// masks (probability 0).
__device__ __forceinline__ void produce_tma(const int32_t* list, int n_list,
                                            unsigned char* ring, uint64_t* full, uint64_t* empty,
                                            const CUtensorMap* km, const CUtensorMap* vm,
                                            const int32_t* pages, int page_size, int g) {
  constexpr int kSlots = kSlotsOf<kKvAct>;
  for (int i = 0; i < n_list; ++i) {
    const int slot = i % kSlots;
    if (i >= kSlots) mbar_wait(&empty[slot], uint32_t(i / kSlots - 1) & 1u);
    const int p0 = list[i] * kKT;
    const int row0 = pages[p0 / page_size] * page_size + p0 % page_size;
    unsigned char* ks = ring + slot * kSlotBytes;
    unsigned char* vs = ks + kTileBytes;
    mbar_expect_tx(&full[slot], kSlotBytes);
    tma_load_2d(ks, km, g * kD, row0, &full[slot]);
    tma_load_2d(ks + kHalfBytes, km, g * kD + 64, row0, &full[slot]);
    tma_load_2d(vs, vm, g * kD, row0, &full[slot]);
    tma_load_2d(vs + kHalfBytes, vm, g * kD + 64, row0, &full[slot]);
  }
}

// FP8 caches: TMA (thread 0) lands tile i's codes in staging buffer i mod kStages; the 128
// producer threads convert them to their exact bf16 values (unscaled: the K scale is in
// P.tau, the V scale applied to O) in the ring slot's layout, fence them for wgmma and hand
// the slot over; once all have read the buffer, thread 0 refills it with tile i + kStages.
template <int KF>
__device__ __forceinline__ void produce_tma_fp8(const int32_t* list, int n_list,
                                                unsigned char* ring, unsigned char* staging,
                                                uint64_t* full, uint64_t* empty,
                                                uint64_t* staged, const CUtensorMap* km,
                                                const CUtensorMap* vm, const int32_t* pages,
                                                int page_size, int g) {
  constexpr int kSlots = kSlotsOf<KF>;
  const int tid = threadIdx.x;
  auto issue = [&](int i) {
    const int st = i % kStages;
    const int p0 = list[i] * kKT;
    const int row0 = pages[p0 / page_size] * page_size + p0 % page_size;
    unsigned char* dst = staging + st * kStageBytes;
    mbar_expect_tx(&staged[st], kStageBytes);
    tma_load_2d(dst, km, g * kD, row0, &staged[st]);
    tma_load_2d(dst + kCodeBytes, vm, g * kD, row0, &staged[st]);
  };
  if (tid == 0)
    for (int i = 0; i < min(kStages, n_list); ++i) issue(i);
  for (int i = 0; i < n_list; ++i) {
    const int slot = i % kSlots, st = i % kStages;
    mbar_wait(&staged[st], uint32_t(i / kStages) & 1u);
    if (i >= kSlots) mbar_wait(&empty[slot], uint32_t(i / kSlots - 1) & 1u);
    const unsigned char* src = staging + st * kStageBytes;
    unsigned char* dst = ring + slot * kSlotBytes;
    // 16-code chunk cc of row j (K: e < 512, V: e >= 512) -> bf16 chunks 2cc and 2cc + 1.
#pragma unroll
    for (int k = 0; k < 2 * kCodeBytes / 16 / 128; ++k) {
      const int e = tid + 128 * k, kv = e >> 9, j = (e >> 3) & 63, cc = e & 7;
      const uint4 c = *reinterpret_cast<const uint4*>(src + kv * kCodeBytes + j * 128 +
                                                      ((cc ^ (j & 7)) << 4));
      unsigned char* d = dst + kv * kTileBytes;
      *reinterpret_cast<uint4*>(d + sw_off(j, 2 * cc)) = kv_codes8_bf16<KF>(make_uint2(c.x, c.y));
      *reinterpret_cast<uint4*>(d + sw_off(j, 2 * cc + 1)) =
          kv_codes8_bf16<KF>(make_uint2(c.z, c.w));
    }
    fence_proxy_async_smem();
    mbar_arrive(&full[slot]);
    asm volatile("bar.sync 3, 128;\n" ::: "memory");  // every producer is done with `st`
    if (tid == 0 && i + kStages < n_list) {
      fence_proxy_async_smem();  // the buffer's generic reads before TMA's writes
      issue(i + kStages);
    }
  }
}
#endif  // SALA_SM90A_DEVICE

}  // namespace sala::cuda::stage2_sm90
