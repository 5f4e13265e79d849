"""scripts/sass_loops.py on a synthetic cuobjdump listing: kernels are split at "Function :",
a loop is a backward branch (guarded or not) with the instructions from its target to it,
guards are not part of an opcode, forward branches make no loop, PATTERN selects kernels and
--min drops short loops.

Usage: test_sass_loops.py SASS_LOOPS_PY
"""
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("sass_loops", sys.argv[1])
sl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sl)

LISTING = """
	code for sm_90a
		Function : kernel_a
	.headerflags	@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;             /* 0x00000a00ff017b82 */
        /*0010*/                   IMAD.MOV.U32 R2, RZ, RZ, 0x1 ;     /* 0x00000001ff027424 */
        /*0020*/                   LOP3.LUT R3, R2, 0xf000f, R4, 0xea, !PT ; /* 0x000f000f02037812 */
        /*0030*/               @P0 LOP3.LUT R3, R3, 0xf, RZ, 0xc0, !PT ;   /* 0x0000000f03030812 */
        /*0040*/                   HMMA.16816.F32.BF16 R8, R4, R6, RZ ; /* 0x000000060408723c */
        /*0050*/              @!P1 BRA 0x80 ;                      /* 0x0000000000089947 */
        /*0060*/                   IADD3 R2, R2, 0x1, RZ ;            /* 0x0000000102027810 */
        /*0070*/                   BRA 0x20 ;                         /* 0xfffffffa00687947 */
        /*0080*/                   EXIT ;                             /* 0x000000000000794d */
		..........

		Function : kernel_b
        /*0000*/                   NOP ;                              /* 0x0000000000007918 */
        /*0010*/               @P2 BRA 0x0 ;                        /* 0xfffffffc00fc2947 */
        /*0020*/                   EXIT ;                             /* 0x000000000000794d */
"""

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


ks = list(sl.kernels(LISTING))
check([n for n, _ in ks] == ["kernel_a", "kernel_b"], f"kernel names: {[n for n, _ in ks]}")
check(len(ks[0][1]) == 9 and ks[0][1][2] == (0x20, "LOP3.LUT R3, R2, 0xf000f, R4, 0xea, !PT"),
      f"kernel_a instructions: {ks[0][1][:3]}")
la = list(sl.loops(ks[0][1]))
check([(s, e, len(b)) for s, e, b in la] == [(0x20, 0x70, 6)], f"kernel_a loops: {la}")
check(sl.opcode("@!P1 BRA 0x80") == "BRA" and sl.opcode("@P0 LOP3.LUT R3, R3") == "LOP3.LUT",
      "guards are stripped from opcodes")
lb = list(sl.loops(ks[1][1]))
check([(s, e, len(b)) for s, e, b in lb] == [(0x0, 0x10, 2)], f"kernel_b loops: {lb}")

r = sl.report(LISTING, "kernel_a", min_len=1)
check("kernel_a: 9 instructions" in r and "kernel_b" not in r, f"pattern: {r}")
check("loop 0x20-0x70: 6 instructions; LOP3.LUT 2," in r, f"histogram: {r}")
check("loop" not in sl.report(LISTING, "kernel_a", min_len=7), "--min drops short loops")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("sass_loops: all checks passed")
