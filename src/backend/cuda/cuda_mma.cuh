// Tensor-core and paged-cache helpers shared by the attention kernels (cuda_flash.cu,
// cuda_infllm_select.cu, cuda_infllm_attn.cu). mma.sync m16n8k16, ldmatrix and cp.async are
// sm_80+, so these kernels are the portable path as well as the Hopper one.
//
// Fragment layout of mma m16n8k16 (lane = 4·qr + qc/2, qr = lane/4, qc = 2·(lane%4)):
//   A (16×16, row-major): a0 = A[qr][qc..qc+1], a1 = A[qr+8][qc..], a2 = A[qr][qc+8..],
//                         a3 = A[qr+8][qc+8..]
//   B (16×8, k × n):      b0 = B[qc..qc+1][qr], b1 = B[qc+8..qc+9][qr]
//   C (16×8, fp32):       c0,c1 = C[qr][qc..qc+1], c2,c3 = C[qr+8][qc..qc+1]
#pragma once
#include <cstdint>

#include "backend/cache_layout.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace sala::cuda {

__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (lower address)
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_raw(bf16 lo, bf16 hi) {
  return uint32_t(*reinterpret_cast<uint16_t*>(&lo)) | (uint32_t(*reinterpret_cast<uint16_t*>(&hi)) << 16);
}

// ldmatrix_x4 / ldmatrix_x4_trans at a shared-memory address (smem_addr): hot loops keep
// per-lane base addresses and add constant offsets, not a generic-to-shared conversion per load.
__device__ __forceinline__ void ldsm_x4(uint32_t* r, uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t* r, uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// Four 8×8 bf16 matrices, transposed: lane l gives the address of row l%8 of matrix l/8.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const bf16* row_addr) {
  ldsm_x4_trans(r, uint32_t(__cvta_generic_to_shared(row_addr)));
}

// Four 8×8 bf16 matrices (A fragments of m16n8k16 from a row-major 16×16 tile when lane l
// gives row (l % 8) + 8·((l / 8) % 2), column 8·(l / 16)).
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const bf16* row_addr) {
  ldsm_x4(r, uint32_t(__cvta_generic_to_shared(row_addr)));
}

// 16-byte global -> shared copy; src_bytes 0 writes zeros (rows past the end).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// mbarriers in shared memory (sm_80+), for producer / consumer rings: a phase completes when
// `count` arrivals have happened; waiters poll the parity of the phase they need.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_at(uint32_t bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive_at(smem_addr(bar)); }
// One arrival, made when every cp.async this thread issued before has landed (the barrier's
// count includes it: .noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Returns once the phase of parity `parity` has completed (acquire: the data it guards is
// visible). try_wait lets the hardware suspend the warp on sm_90; test_wait polls before.
__device__ __forceinline__ void mbar_wait_at(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n"
                 " selp.b32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#else
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
                 " selp.b32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#endif
  } while (!done);
}
// Whether the phase of `parity` has completed, without waiting.
__device__ __forceinline__ bool mbar_ready(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
               " selp.b32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  mbar_wait_at(smem_addr(bar), parity);
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Element offset of token p's row in a paged cache (pages of g.page_size tokens).
__device__ __forceinline__ int64_t token_off(const CacheGeom& g, const int32_t* pages, int64_t p) {
  return cache_layout::token_offset(pages, p, g.page_size, g.row);
}
// Element offset of compressed entry j (stride s) in its paged cache (page_size / s per page).
__device__ __forceinline__ int64_t entry_off(const CacheGeom& g, const int32_t* pages, int64_t j, int s) {
  return cache_layout::entry_offset(pages, j, s, g.page_size, g.row);
}

// SPEC §9.3 / §9.4 (the CPU twin is backend/cpu/infllm_rules.h).
__device__ __forceinline__ long long num_entries(long long L, int w, int s) {
  return cache_layout::num_entries(L, w, s);
}
__device__ __forceinline__ long long visible_count(long long t, long long n, long long T, int w,
                                                   int s, bool first) {
  long long c;
  if (first)
    c = (t + 1) / s - 1 + n - (T - s + 1) / s;  // C truncation, as the kernel computes it
  else
    c = t + 1 >= w ? (t + 1 - w) / s + 1 : 0;
  return c < 0 ? 0 : (c > n ? n : c);
}

}  // namespace sala::cuda
