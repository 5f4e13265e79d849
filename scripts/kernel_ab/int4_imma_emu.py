#!/usr/bin/env python3
"""Emulates the int8 int4 GEMV's arithmetic (scripts/kernel_ab/int4_imma_gemv.cu) lane by
lane, with the fragments of mma.sync.m16n8k32 (8-bit) as the PTX ISA lays them out, and checks
that its x digits (digit_col, digit_byte), nibble masks, bias quads (the first IMMA's C) and the
joins of digit pairs (nt = 1: lane pairs; nt >= 2: a row's four digits in one lane) give the
exact integer dot product Σ (c − 8) · x_int of every (weight row, x row) for one 16-row half
and one group of 128 k. No GPU, no numpy.

Layout facts used (PTX ISA, "Matrix Fragments for mma.m16n8k32"; lane = 4 g + t):
  A (16 x 32, u8): register 0 bytes b = (row g, k 4t + b), 1 = (g + 8, 4t + b),
                   2 = (g, 4t + 16 + b), 3 = (g + 8, 4t + 16 + b)
  B (32 x 8, s8):  register 0 bytes b = (k 4t + b, column g), 1 = (k 4t + 16 + b, column g)
  C (16 x 8, s32): c0, c1 = (row g, columns 2t, 2t + 1), c2, c3 = (row g + 8, same columns)
The kernel's mirror functions: repacked_nibble (cuda_gemv_int4.cu), digit_byte and digit_col
(int4_imma_gemv.cu). Trials cycle through NT = 1, 2, 4 n8 tiles (M = 2 NT x rows).
Usage: int4_imma_emu.py [TRIALS]
"""
import math
import random
import sys


def repacked_nibble(k8):
    return k8 // 2 + 4 * (k8 % 2)


def digit_byte(k8):
    return (4 if k8 & 2 else 0) + (((k8 & 1) << 1) | ((k8 >> 2) & 1))


def digit_col(m, l, nt):
    return 4 * m + l if nt == 1 else 8 * (2 * (m // 4) + l // 2) + 2 * (m % 4) + l % 2


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    rnd = random.Random(5)
    for trial in range(trials):
        check(rnd, trial, NT=(1, 2, 4)[trial % 3])
    print(f"ok: {trials} trials, every (row, x row) sum exact")


def check(rnd, trial, NT):
    M = 2 * NT  # x rows; digit columns digit_col(m, l, NT) < 8 NT
    cols = {digit_col(m, l, NT) for m in range(M) for l in range(4)}
    assert cols == set(range(8 * NT)), "digit_col is not a bijection onto the columns"
    codes = [[rnd.randrange(16) for _ in range(128)] for _ in range(16)]
    x = [[rnd.gauss(0, 1) * (1e-4 if rnd.random() < 0.1 else 1) for _ in range(128)]
         for _ in range(M)]
    # limb_prep_kernel: digits in B-fragment order, the lanes' biases
    frag = {}  # (chunk, column, word, byte) -> digit
    corr = [[0] * 8 for _ in range(M)]  # per x row: -8 {S0, S1, S0, S1, S2, S3, S2, S3}
    xint = []
    for m in range(M):
        E = 29 - math.floor(math.log2(max(abs(v) for v in x[m])))
        sums = [0] * 4
        row = []
        for k in range(128):
            r = round(x[m][k] * 2.0 ** E)
            row.append(r)
            c, word, k8 = k >> 5, (k & 31) >> 3, k & 7
            for l in range(4):
                d = ((r + 128) & 255) - 128
                r = (r - d) >> 8
                sums[l] += d
                frag[c, digit_col(m, l, NT), word, digit_byte(k8)] = d
            assert r == 0, "more than 4 digits"
        xint.append(row)
        for i in range(8):
            corr[m][i] = -8 * sums[2 * (i // 4) + i % 2]
    # the repacked words: row r, chunk c (lane t = c), word i
    W = [[[0] * 4 for _ in range(4)] for _ in range(16)]
    for r in range(16):
        for k in range(128):
            c, i, k8 = k >> 5, (k & 31) >> 3, k & 7
            W[r][c][i] |= codes[r][k] << (4 * repacked_nibble(k8))

    def byte(v, b):
        return (v >> (8 * b)) & 255

    def quad(nt, t):  # the bias quad lane t loads for tile nt (the C of the word-0 IMMA)
        if NT == 1:
            m, h = t // 2, t % 2
        else:
            m, h = t + 4 * (nt // 2), nt % 2
        return corr[m][4 * h:4 * h + 4]

    acc = {(nt, g, t): list(quad(nt, t)) for nt in range(NT) for g in range(8) for t in range(4)}
    for nt, i in ((nt, i) for nt in range(NT) for i in range(4)):  # n-tile nt, word i
        A = [[0] * 32 for _ in range(16)]
        B = [[0] * 8 for _ in range(32)]
        for g in range(8):
            for t in range(4):
                wg, w8 = W[g][t][i], W[g + 8][t][i]
                regs = (wg & 0x0F0F0F0F, w8 & 0x0F0F0F0F,
                        (wg >> 4) & 0x0F0F0F0F, (w8 >> 4) & 0x0F0F0F0F)
                for b in range(4):
                    A[g][4 * t + b] = byte(regs[0], b)
                    A[g + 8][4 * t + b] = byte(regs[1], b)
                    A[g][4 * t + 16 + b] = byte(regs[2], b)
                    A[g + 8][4 * t + 16 + b] = byte(regs[3], b)
                    B[4 * t + b][g] = frag.get((t, 8 * nt + g, i, b), 0)
                    B[4 * t + 16 + b][g] = frag.get((t, 8 * nt + g, i, 4 + b), 0)
        for g in range(8):
            for t in range(4):
                cells = ((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))
                for e, (rr, cc) in enumerate(cells):
                    acc[nt, g, t][e] += sum(A[rr][kk] * B[kk][cc] for kk in range(32))

    def pairs(nt, g, t):  # a lane's exact int32 pairs a_1·256 + a_0 (rows g, g + 8)
        a = acc[nt, g, t]
        assert all(abs(v) < 2 ** 31 for v in a), "an accumulator overflows int32"
        return (a[1] * 256 + a[0], a[3] * 256 + a[2])

    for g, t in ((g, t) for g in range(8) for t in range(4)):
        for j in range(1 if NT == 1 else NT // 2):
            if NT == 1:  # x row t / 2; digit pair t % 2 here, the other in lane t ^ 1
                m = t // 2
                p, q = pairs(0, g, t), pairs(0, g, t ^ 1)
                lo, hi = (p, q) if t % 2 == 0 else (q, p)
            else:  # x row t + 4j; digits 0, 1 in tile 2j, 2, 3 in tile 2j + 1
                m = t + 4 * j
                lo, hi = pairs(2 * j, g, t), pairs(2 * j + 1, g, t)
            for h in range(2):
                assert abs(lo[h]) < 2 ** 27 and abs(hi[h]) < 2 ** 27, "a pair is too large"
                want = sum((codes[g + 8 * h][k] - 8) * xint[m][k] for k in range(128))
                if lo[h] + 65536 * hi[h] != want:
                    sys.exit(f"trial {trial} (NT {NT}): row {g + 8 * h}, x row {m}, "
                             f"lane t {t}: {lo[h] + 65536 * hi[h]} != {want}")


if __name__ == "__main__":
    main()
