// Hopper TMA and wgmma plumbing shared by the wgmma kernels (cuda_skinny_sm90.cu,
// cuda_infllm_attn_sm90.cu): 2-D tensor maps with 128-byte
// swizzle, the bulk tensor load that completes on an mbarrier, shared-memory descriptors of
// such tiles, and the wgmma instructions the kernels issue.
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
// wgmma descriptor of an MN-major B operand whose n extent is one 128-byte swizzled row
// (64 bf16: wgmma n = 64) and whose k rows are 128 bytes apart in 1024-byte groups of 8:
// both byte offsets are the 8-row group stride (with one 64-wide n group only the k-group
// stride is read, whichever field holds it).
__device__ __forceinline__ uint64_t smem_desc_sw128_mn64(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1024 >> 4) << 16) |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

#define SALA_WGMMA_D32                                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
      "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
      "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),           \
      "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),           \
      "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define SALA_WGMMA_D32_REGS                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

// d (+)= A·B over k = 16, both operands K-major in shared memory (descriptors), m64 n64, bf16
// in, fp32 accumulators in wgmma's layout: d[4j + 2h + e] is row 16·warp + lane/4 + 8h,
// column 8j + 2·(lane%4) + e. accumulate = 0: d = A·B (d's old values are not read).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db,
                                                int accumulate = 1) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SALA_WGMMA_D32_REGS
               ", %32, %33, p, 1, 1, 0, 0;\n}\n"
               : SALA_WGMMA_D32
               : "l"(da), "l"(db), "r"(accumulate));
}
// d += A·B over k = 16, A from registers (mma.sync's m16n8k16 A fragment per warp: rows
// 16·warp .. + 15 of the 64), B MN-major in shared memory (smem_desc_sw128_mn64).
__device__ __forceinline__ void wgmma_m64n64k16_rs_mn(float (&d)[32], const uint32_t (&a)[4],
                                                      uint64_t db) {
  asm volatile("{\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SALA_WGMMA_D32_REGS
               ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n}\n"
               : SALA_WGMMA_D32
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// d += A·B over k = 16, A from registers (as above), B K-major in shared memory
// (smem_desc_sw128): the int4 skinny GEMM's dequantized weights times the x rows.
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                   uint64_t db) {
  asm volatile("{\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SALA_WGMMA_D32_REGS
               ", {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n}\n"
               : SALA_WGMMA_D32
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#define SALA_WGMMA_D64 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
  "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
  "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
  "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
  "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
  "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
  "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
  "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
  "+f"(d[63])
#define SALA_WGMMA_D64_REGS \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
// d (+)= A·B over k = 16, m64 n128, both operands K-major in shared memory (descriptors):
// d[4j + 2h + e] is row 16·warp + lane/4 + 8h, column 8j + 2·(lane%4) + e (j < 16).
// accumulate = 0: d = A·B.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db,
                                                 int accumulate = 1) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " SALA_WGMMA_D64_REGS
               ", %64, %65, p, 1, 1, 0, 0;\n}\n"
               : SALA_WGMMA_D64
               : "l"(da), "l"(db), "r"(accumulate));
}
#undef SALA_WGMMA_D64
#undef SALA_WGMMA_D64_REGS
#undef SALA_WGMMA_D32
#undef SALA_WGMMA_D32_REGS

// The compiler knows nothing of asynchronous wgmma: pinning registers with an empty asm that
// "modifies" them keeps an accumulator from being read before the wgmma.wait that follows
// its MMAs (call it after the wait), and a register A operand from being reused for other
// values while its MMA may still read it (call it after the wait that retires that MMA).
template <int N>
__device__ __forceinline__ void pin_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Orders this thread's generic-proxy shared-memory writes (st.shared, landed cp.async) before
// later async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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
// box_cols] (box_cols x element size == 128 bytes: one swizzle row), 128-byte swizzle; or no
// swizzle (box rows of any multiple of 16 bytes, dense in shared memory).
inline CUtensorMap make_tma_map_2d(const void* base, CUtensorMapDataType dt, int64_t rows,
                                   int64_t cols, int64_t row_bytes, int box_cols, int box_rows,
                                   CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = tma_encode_fn()(&m, dt, 2, const_cast<void*>(base), dims, strides, box, elem,
                                     CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s:%d: cuTensorMapEncodeTiled failed (%d)\n", __FILE__, __LINE__, int(r));
    std::abort();
  }
  return m;
}

}  // namespace sala::cuda
