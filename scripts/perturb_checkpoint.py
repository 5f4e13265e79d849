#!/usr/bin/env python3
"""Writes a perturbed copy of a SALA checkpoint: a draft model for speculative decoding's tests
(`--speculative-algorithm STANDALONE`) that disagrees with its original often, made at test time
instead of committed. Every weight matrix (2-D tensor) W becomes W + noise · std(W) · N(0, 1)
(numpy's generator seeded with --seed, tensors in name order), stored in W's dtype; norms (1-D)
and every other file of the directory are copied as they are, so the tokenizer is the original's.

Usage: perturb_checkpoint.py SRC_DIR OUT_DIR [--noise 0.3] [--seed 0]"""
import argparse
import json
import os
import shutil
import struct

import ml_dtypes
import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--noise", type=float, default=0.3, help="noise std, relative to each matrix's")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.src):
        if f != "model.safetensors":
            shutil.copy(os.path.join(a.src, f), os.path.join(a.out, f))
    raw = open(os.path.join(a.src, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = bytearray(raw[8 + n:])
    rng = np.random.default_rng(a.seed)
    for name in sorted(k for k in header if k != "__metadata__"):
        t = header[name]
        if len(t["shape"]) != 2 or t["dtype"] not in DTYPES:
            continue
        b, e = t["data_offsets"]
        w = np.frombuffer(bytes(data[b:e]), dtype=DTYPES[t["dtype"]]).astype(np.float32)
        w = w + a.noise * float(w.std()) * rng.standard_normal(w.shape, dtype=np.float32)
        data[b:e] = w.astype(DTYPES[t["dtype"]]).tobytes()
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(raw[:8 + n])
        f.write(data)
    print(f"wrote {a.out} (noise {a.noise}, seed {a.seed})")


if __name__ == "__main__":
    main()
