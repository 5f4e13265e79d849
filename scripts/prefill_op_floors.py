#!/usr/bin/env python3
"""Per-op-class table of a long prefill profile against each class's own floor (issue 18).

Reads the [optime] tables that `sala bench offline --long-prefill L1,L2,... --profile-ops N`
prints per prompt length ("prefill L: GPU time by op ...") and the model's config.json, and
prints, per length, each op class's GPU time, its share of the step and its FLOP floor at the
tensor-core peak (SPEC §9 counts, as src/cli/bench_floors.cpp: GEMMs 2·params·L, sparse
layers' stage 1 over the visible level-1 + level-2 entries, stage 2 over at most
total_topk·block_size keys, dense rows over t+1 keys, lightning 4·nh·d² per token).
Usage: prefill_op_floors.py PROFILE.txt CONFIG.json [--fp8] [--chunk 2048]"""
import argparse
import json
import re

PEAK_BF16, PEAK_FP8 = 790e12, 1370e12  # ../shared/PERF.md, measured GEMM ceilings (FLOP/s)


def entries(n, window, stride):  # cache_layout::num_entries: compressed entries of n tokens
    return 0 if n < window else (n - window) // stride + 1


def class_flops(cfg, L, chunk):
    sp = cfg["sparse_config"]
    heads, hd = cfg["num_attention_heads"], cfg["head_dim"]
    qk = heads * hd
    ks, kst, bs, dense_len = sp["kernel_size"], sp["kernel_stride"], sp["block_size"], sp["dense_len"]
    selected = (sp["topk"] + sp["window_size"] // bs) * bs
    mixers = cfg["mixer_types"]
    n_sparse = sum(m == "minicpm4" for m in mixers)
    n_light = len(mixers) - n_sparse
    stage1 = stage2 = dense = 0.0
    for off in range(0, L, chunk):
        end = min(L, off + chunk)
        if end < dense_len:  # SparseConfig::sparse_call: dense chunk
            dense += 4 * qk * sum(t + 1 for t in range(off, end))
            continue
        for t in range(off, end):
            stage1 += 2 * qk * (entries(t + 1, ks, kst) + entries(t + 1, 4 * ks, 4 * kst))
            stage2 += 4 * qk * min(t + 1, selected)
    d = cfg["lightning_head_dim"]
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    kvh = cfg["num_key_value_heads"]
    # Body linear parameters (lm_head excluded: one row of logits per prefill).
    light = H * (3 * cfg["lightning_nh"] * d) + H * cfg["lightning_nh"] * d * 2  # q,k,v,z + o
    sparse = H * (heads * hd * 2 + 2 * kvh * hd) + heads * hd * H  # q, gate, k, v + o
    mlp = 3 * H * I
    params = n_light * light + n_sparse * sparse + len(mixers) * mlp
    return {"gemm": 2 * params * L, "stage1": stage1 * n_sparse, "stage2": stage2 * n_sparse,
            "dense": dense * n_sparse, "lightning": 4 * cfg["lightning_nh"] * d * d * L * n_light}


CLASSES = [  # op names of the [optime] table -> class
    ("gemm", ("gemm", "fp8 gemm sm90", "fp8 gemm", "gemm int4")),
    ("stage2", ("sparse attention",)),
    ("stage1", ("sparse select",)),
    ("dense", ("flash prefill attention",)),
    ("lightning", ("lightning chunked",)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("config")
    ap.add_argument("--fp8", action="store_true", help="GEMM floor at the FP8 peak")
    ap.add_argument("--chunk", type=int, default=2048)
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    tables, cur = {}, None
    for line in open(a.profile):
        m = re.match(r"\[optime\] prefill (\d+): .* ([\d.]+) ms total", line)
        if m:
            cur = int(m.group(1))
            tables[cur] = {}
            continue
        m = re.match(r"\[optime\] (.+?)\s+([\d.]+) ms\s+[\d.]+%\s+(\d+) calls", line)
        if m and cur is not None:
            tables[cur][m.group(1).strip()] = float(m.group(2))
    if not tables:
        raise SystemExit(f"{a.profile}: no '[optime] prefill L' tables (run with --profile-ops)")
    for L, ops in tables.items():
        total = sum(ops.values())
        fl = class_flops(cfg, L, a.chunk)
        print(f"prefill {L}: {total / 1e3:.3f} s of GPU time")
        print(f"  {'class (ops)':<40}{'ms':>10}{'share':>8}{'floor ms':>10}{'of floor':>10}")
        seen = set()
        for cls, names in CLASSES:
            ms = sum(ops.get(n, 0.0) for n in names)
            seen.update(names)
            peak = PEAK_FP8 if (cls == "gemm" and a.fp8) else PEAK_BF16
            floor_ms = 1e3 * fl[cls] / peak
            ratio = f"{100 * floor_ms / ms:.1f} %" if ms > 0 else "-"
            print(f"  {cls + ' (' + ', '.join(n for n in names if n in ops) + ')':<40}"
                  f"{ms:>10.1f}{100 * ms / total:>7.1f}%{floor_ms:>10.1f}{ratio:>10}")
        rest = {n: v for n, v in ops.items() if n not in seen}
        rest_ms = sum(rest.values())
        print(f"  {'other (' + str(len(rest)) + ' ops: norms, SiLU, quantize...)':<40}"
              f"{rest_ms:>10.1f}{100 * rest_ms / total:>7.1f}%")


if __name__ == "__main__":
    main()
