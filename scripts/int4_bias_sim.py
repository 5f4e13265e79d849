#!/usr/bin/env python3
"""Precision of three int4 GEMV arithmetics on the CPU (numpy emulation, issue 22): a
design check before a kernel, whose GPU twin must then be measured. The MMA is modelled as
exact bf16 products summed exactly per 16-k chunk, rounded to fp32, chunks added in fp32.

  current : per group of G k, acc = Σ x·(q − 8), then out = fma(acc, s, out) in fp32 (the
            int4 GEMV's arithmetic since session 16);
  bias-out: acc' = Σ x·(128 + q) (the lop3 codes as bf16 values without the subtraction), then
            t = fma(−136, Σx, acc') with Σx the group's fp32 sum of x, out = fma(t, s, out);
  bias16  : the nibble in the mantissa's top bits instead (bf16 value 1 + q/16, the same lop3
            with the shift folded), acc" = Σ x·(1 + q/16), t = fma(−1.5, Σx, acc"),
            out = fma(t, 16·s, out): a bias 6x the signal's spread instead of 34x.
  limbsL  : int8 tensor cores (session 34's design, docs/PERF.md): per group x in fixed point,
            x_int = rint(x · 2^E) with E the largest power keeping |x_int| < 2^(8L − 2), as L
            balanced base-256 digits d_l (s8); exact int32 sums a_l = Σ c·d_l − 8 Σ d_l of the
            codes c = q + 8 (u8), then t = Σ_l a_l 2^(8l) by fp32 fmas from the top limb down
            (L = 4: the prototype's pairs a_1·256 + a_0, a_3·256 + a_2 exact, then one fma),
            out = fma(t, s · 2^−E, out). Only x's rounding to L·8 − 2 bits and the fp32 steps
            are inexact.
Each against the exact product (float64), both rounded to bf16: the share of outputs that
differ by ≥ 1 bf16 ulp and the largest difference in ulps.
Usage: int4_bias_sim.py [ROWS] [SEED]   (.venv's python: numpy)"""
import sys

import numpy as np

ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 0
G = 128


def bf16(a):
    """Round float32 values to bf16 (nearest even), returned as float32."""
    a = np.asarray(a, np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def ulps(got, ref):
    """|got − ref| in bf16 ulps of ref (both bf16 values)."""
    e = np.floor(np.log2(np.maximum(np.abs(ref), 1e-30)))
    return np.abs(got.astype(np.float64) - ref) / np.exp2(e - 7)


def group_sums(prod):
    """[N, K] float64 products -> [N, K/G] fp32: 16-k chunks exact then rounded, chunks added
    in fp32 in order (an MMA's fp32 accumulator)."""
    n, k = prod.shape
    chunks = prod.reshape(n, k // 16, 16).sum(axis=2).astype(np.float32)
    return np.cumsum(chunks.reshape(n, k // G, G // 16), axis=2, dtype=np.float32)[..., -1]


def fma_rows(a, s, out):
    return (a.astype(np.float64) * s + out.astype(np.float64)).astype(np.float32)


def f32(a):
    return np.asarray(a, np.float64).astype(np.float32)


def limbs(q, x, s, L):
    """Emulates the int8 tensor-core arithmetic (see the docstring's limbsL) for codes q
    [N, K] (0..15), x [K], group scales s [N, K/G]; returns fp32 outputs [N]."""
    n, k = q.shape
    out = np.zeros(n, np.float32)
    xd = x.astype(np.float64)
    for g in range(k // G):
        xg = xd[g * G:(g + 1) * G]
        amax = np.abs(xg).max()
        E = 0 if amax == 0 else int(8 * L - 3 - np.floor(np.log2(amax)))
        xi = np.rint(xg * 2.0 ** E).astype(np.int64)
        assert np.abs(xi).max() < 2 ** (8 * L - 2)
        digits, r = [], xi.copy()
        for _ in range(L):
            d = ((r + 128) & 255) - 128  # balanced digit, s8
            digits.append(d)
            r = (r - d) >> 8
        assert np.all(r == 0)
        qg = q[:, g * G:(g + 1) * G].astype(np.int64)
        a = [qg @ d - 8 * d.sum() for d in digits]  # exact int32 sums per limb
        if L == 4:  # the prototype's order: exact int32 pairs, then one fp32 fma
            p0, p1 = f32(a[1] * 256 + a[0]), f32(a[3] * 256 + a[2])
            t = f32(p1.astype(np.float64) * 65536.0 + p0)
        else:
            t = f32(a[L - 1])
            for l in range(L - 2, -1, -1):  # t = fma(t, 256, a_l) in fp32
                t = f32(t.astype(np.float64) * 256.0 + a[l])
        out = fma_rows(t, f32(s[:, g].astype(np.float64) * 2.0 ** (-E)), out)
    return out


def run(x, K, label):
    rng = np.random.default_rng(SEED + K)
    w = rng.normal(0, 0.02, (ROWS, K)).astype(np.float32)
    # RTN int4, group G, bf16 scales (core/int4.h's scheme: amax / 7 rounded to bf16).
    wg = w.reshape(ROWS, K // G, G)
    s = bf16(np.maximum(np.abs(wg).max(axis=2) / 7.0, 1e-8))
    q = np.clip(np.rint(wg / s[..., None]), -8, 7).astype(np.int64) + 8  # codes 0..15
    q = q.reshape(ROWS, K)
    sk = np.repeat(s, G, axis=1).astype(np.float64)
    exact = ((q - 8) * sk) @ x.astype(np.float64)
    ref = bf16(exact.astype(np.float32))
    xd = x.astype(np.float64)
    acc = group_sums((q - 8) * xd)                      # [N, K/G]
    accb = group_sums((q + 128) * xd)
    acc16 = group_sums((1 + q / 16.0) * xd)
    sx = np.cumsum(x.reshape(K // G, G), axis=1, dtype=np.float32)[:, -1]  # [K/G]
    out_c = np.zeros(ROWS, np.float32)
    out_b = np.zeros(ROWS, np.float32)
    out_16 = np.zeros(ROWS, np.float32)
    for g in range(K // G):
        out_c = fma_rows(acc[:, g], s[:, g], out_c)
        t = (accb[:, g].astype(np.float64) - 136.0 * sx[g]).astype(np.float32)
        out_b = fma_rows(t, s[:, g], out_b)
        t16 = (acc16[:, g].astype(np.float64) - 1.5 * sx[g]).astype(np.float32)
        out_16 = fma_rows(t16, 16.0 * s[:, g], out_16)
    outs = [("current", out_c), ("bias-out", out_b), ("bias16", out_16)]
    outs += [(f"limbs{L}", limbs(q, x, s, L)) for L in (2, 3, 4)]
    for name, out in outs:
        u = ulps(bf16(out), ref)
        rel = np.abs(out.astype(np.float64) - exact) / np.maximum(np.abs(exact), 1e-30)
        print(f"{label:<28} K={K:<6} {name:<9} ≥1 ulp: {np.mean(u >= 1) * 100:6.3f} %  "
              f"max {u.max():5.1f} ulp  median rel err {np.median(rel):.2e}  "
              f"p99.9 rel err {np.quantile(rel, 0.999):.2e}")


for K in (4096, 16384):
    rng = np.random.default_rng(SEED + 7)
    run(bf16(rng.normal(0, 1, K)), K, "x ~ N(0, 1)")
    g = rng.normal(0, 1.5, K)
    u = rng.normal(0, 1.0, K)
    run(bf16(g / (1 + np.exp(-g)) * u), K, "x = silu(g)·u (down_proj)")
    run(bf16(rng.normal(0.3, 1, K)), K, "x ~ N(0.3, 1) (biased)")
