#!/usr/bin/env python3
"""Probes of the int4 ring GEMV (cuda_gemv_int4.cu): where does its time go?

Session 16's ncu put the int4 GEMV at 1.8-1.9 TB/s, bound by instruction latency, not DRAM;
its SASS stage loop (scripts/sass_stats.sh) is ~56 % dequantization (3 SHF + 4 LOP3 + 4 HFMA2
per word of 8 codes), ~5 % HMMA, the rest copies, loads and addresses, and every 32-row tile
ends in a cross-warp epilogue with two CTA barriers. Before a new design (fewer instructions
per weight: bias16, or int8 tensor cores on exact x limbs, docs/PERF.md), these probes time the
kernel with parts of it cheapened or switched off, as the stage-2 probes did (session 28).
Every probe but `base` computes WRONG outputs (its hash differs); only its time means anything.
The FP8 GEMV (cuda_gemv_fp8.cu, issue 17 / 20) gets the epilogue and copy probes as well; the
dequantization probes leave it as it is (a control).

  base      HEAD's kernel.
  b16dq     the bias16 dequantization: one shift + one LOP3 per code pair (8 per word instead
            of 11; the values 1 + c/16 without the -1.5 sum(x) correction, which a real bias16
            kernel adds per group).
  lop4      one LOP3 per code pair, no shifts, no HFMA2 (4 per word): the cost of an int8
            tensor-core design's 3 per word, with this kernel's bf16 MMAs.
  noepi     no cross-warp epilogue (the int4 and the FP8 ring kernels): each thread folds its
            accumulators into one value and stores nothing (no shared-memory reduction, no
            barriers).
  nocopy    no cp.async at all (weights and scales; the bf16 and FP8 rings too; bulk copies:
            none, their slot barriers expect 0 bytes): the stage loop computes on whatever the
            ring holds; DRAM and the copy issue are gone, the compute remains.
  and the combinations lop4_noepi, nocopy_noepi, nocopy_lop4_noepi.

Usage: int4_probes.py SRC_DIR OUT_DIR  -> OUT_DIR/<probe>/ (copies of SRC_DIR, patched), one
per line on stdout, for scripts/kernel_ab/run.sh:
  AB_ARGS=int4 scripts/kernel_ab/run.sh /tmp/ab $(scripts/kernel_ab/int4_probes.py src /tmp/p)
"""
import pathlib
import shutil
import sys

INT4 = "backend/cuda/cuda_gemv_int4.cu"
INT4_RING = "backend/cuda/cuda_gemv_int4.cuh"  # the scale copies (cp4)
INT4_MATH = "backend/cuda/cuda_gemv_int4_math.cuh"  # the dequantization
FP8 = "backend/cuda/cuda_gemv_fp8.cu"
RING = "backend/cuda/cuda_gemv_ring.cuh"

DEQUANT_OLD = ("    const uint32_t h = and_or(w >> (4 * j), 0x000f000fu, 0x43004300u);"
               "  // 128 + (q + 8)\n"
               '    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(p[j]) : "r"(h), "r"(0x3f803f80u),'
               ' "r"(0xc308c308u));')
FINISH_OLD = ("    finish<kRows, 2, NT, Unscaled, kPass>(r.red, acc, int64_t(wk.tile(ti)) * kRows,"
              " N, M, o,\n"
              "                                          wk.epi(ti), r.gate, Unscaled{});\n"
              "    __syncthreads();  // red is reused by the next tile")
FP8_FINISH_OLD = ("    finish<kRows>(red, acc, n0, N, M, o, wk.epi(ti), gate, Scale{sxs, wsn});\n"
                  "    __syncthreads();  // red is reused by the next tile")
FOLD = """    (void)red, (void)gate;
    float fold = 0.f;
#pragma unroll
    for (int r_ = 0; r_ < 2; ++r_)
#pragma unroll
      for (int n_ = 0; n_ < NT; ++n_)
#pragma unroll
        for (int i_ = 0; i_ < 4; ++i_) fold += acc[r_][n_][i_];
    if (fold == 1234.5f) static_cast<bf16*>(o.y[0])[threadIdx.x] = f2b(fold);"""
CP16_OLD = ('  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src)'
            ' : "memory");')
CP4_OLD = ('  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src)'
           ' : "memory");')
# Bulk copies (sm_90, the rings at M <= 16 since 7f5d3e8): the copy is dropped and its slot
# barrier's phase expects 0 bytes, so the arrival alone completes it (no hang).
BULK_OLD = ('  asm volatile(\n'
            '      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint'
            ' [%0], "\n'
            '      "[%1], %2, [%3], %4;" ::"r"(dst),\n'
            '      "l"(src), "r"(bytes), "r"(bar), "l"(policy)\n'
            '      : "memory");')
EXPECT_OLD = '"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)'
PATCHES = {
    "b16dq": [(INT4_MATH, DEQUANT_OLD,
               "    p[j] = and_or(j ? w >> (4 * j - 3) : w << 3, 0x00780078u, 0x3f803f80u);")],
    "lop4": [(INT4_MATH, DEQUANT_OLD, "    p[j] = and_or(w, 0x000f000fu << j, 0x43004300u);")],
    "noepi": [(INT4, FINISH_OLD, FOLD.replace("(void)red, (void)gate;", "(void)r;")),
              (FP8, FP8_FINISH_OLD, FOLD)],
    "nocopy": [
        (RING, CP16_OLD, "  (void)dst, (void)src;"),
        (RING, BULK_OLD, "  (void)dst, (void)src, (void)bytes, (void)bar, (void)policy;"),
        (RING, EXPECT_OLD, EXPECT_OLD.replace('"r"(bytes)', '"r"(0u * bytes)')),
        (INT4_RING, CP4_OLD, "  (void)dst, (void)src;"),
    ],
}
PROBES = ["base", "b16dq", "lop4", "noepi", "nocopy", "lop4_noepi", "nocopy_noepi",
          "nocopy_lop4_noepi"]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    for probe in PROBES:
        dst = out / probe
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)
        for part in probe.split("_"):
            for rel, old, new in PATCHES.get(part, []):
                f = dst / rel
                text = f.read_text()
                if text.count(old) != 1:
                    sys.exit(f"{probe}: the text to patch is not in {rel} exactly once "
                             "(the kernel changed: update int4_probes.py)")
                f.write_text(text.replace(old, new))
        print(dst)


if __name__ == "__main__":
    main()
