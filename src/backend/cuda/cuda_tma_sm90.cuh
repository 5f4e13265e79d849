// Hopper TMA and wgmma plumbing shared by the wgmma kernels (cuda_skinny_sm90.cu,
// scripts/kernel_ab/skinny_fp8_ab.cu): 2-D tensor maps with 128-byte swizzle, the bulk tensor
// load that completes on an mbarrier, and the shared-memory descriptor of such a tile.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_mma.cuh"  // smem_addr, mbarriers

namespace sala::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SALA_SM90A_DEVICE 1
// One arrival that also expects `bytes` of TMA transactions on the barrier's phase.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// The box of map tm at (c0 = inner coordinate, c1 = row) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* tm, int c0, int c1,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(smem_addr(dst)),
      "l"(tm), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

// wgmma descriptor of a K-major operand in 128-byte-swizzled rows (TMA's
// CU_TENSOR_MAP_SWIZZLE_128B, 1024-byte aligned): 8-row groups 1024 bytes apart; the slice of
// the next 32 bytes of k starts 32 bytes further.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}
#endif

// The driver's cuTensorMapEncodeTiled (null when the driver has none).
inline PFN_cuTensorMapEncodeTiled_v12000 tma_encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// 2-D map of [rows, cols] elements of type dt, rows row_bytes apart, boxes of [box_rows,
// box_cols] (box_cols x element size == 128 bytes: one swizzle row), 128-byte swizzle.
inline CUtensorMap make_tma_map_2d(const void* base, CUtensorMapDataType dt, int64_t rows,
                                   int64_t cols, int64_t row_bytes, int box_cols, int box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = tma_encode_fn()(&m, dt, 2, const_cast<void*>(base), dims, strides, box, elem,
                                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s:%d: cuTensorMapEncodeTiled failed (%d)\n", __FILE__, __LINE__, int(r));
    std::abort();
  }
  return m;
}

}  // namespace sala::cuda
