"""core/fp8.h against ml_dtypes (the float8 dtypes JAX uses): e4m3fn after clamping to ±448
(the compressed-tensors recipe that core/fp8.h's saturation stands for), e5m2 as cast. NaN
inputs must give a NaN code (payloads are not compared).

Usage: fp8_vs_ml_dtypes.py FP8_ENCODE_TOOL [STRIDE]
"""
import subprocess
import sys

import ml_dtypes
import numpy as np

tool = sys.argv[1]
stride = int(sys.argv[2]) if len(sys.argv) > 2 else 4099
raw = subprocess.run([tool, str(stride)], capture_output=True, check=True).stdout
ours = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 2)
bits = np.arange(0, 2**32, stride, dtype=np.uint64).astype(np.uint32)
assert len(bits) == len(ours), (len(bits), len(ours))
f = bits.view(np.float32)
nan = np.isnan(f)
with np.errstate(invalid="ignore", over="ignore"):
    ref4 = np.clip(f, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    ref5 = f.astype(ml_dtypes.float8_e5m2).view(np.uint8)
ok4 = np.where(nan, ((ours[:, 0] & 0x7F) == 0x7F) & ((ref4 & 0x7F) == 0x7F), ours[:, 0] == ref4)
ok5 = np.where(nan, ((ours[:, 1] & 0x7F) > 0x7C) & ((ref5 & 0x7F) > 0x7C), ours[:, 1] == ref5)
for name, ok, col, ref in (("e4m3fn", ok4, 0, ref4), ("e5m2", ok5, 1, ref5)):
    bad = np.flatnonzero(~ok)
    for i in bad[:10]:
        print(f"{name}: fp32 0x{bits[i]:08x} ({f[i]!r}): ours 0x{ours[i, col]:02x}, "
              f"ml_dtypes 0x{ref[i]:02x}")
    print(f"{name}: {len(bad)} of {len(f)} values differ (ml_dtypes {ml_dtypes.__version__})")
sys.exit(0 if ok4.all() and ok5.all() else 1)
