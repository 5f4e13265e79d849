#!/usr/bin/env bash
# scripts/kernel_ab/int4_ab.sh OUT_DIR (GPU machine, CUDA toolkit only; ~2-3 min): issue 22's
# int4 GEMV experiments in one command. 1. int4_probes.py's probes of the production kernel
# (parts cheapened or switched off: where its time goes; the FP8 GEMV's epilogue and copies
# too), timed A B A B by run.sh with gemv_ab's int4 and fp8 tables; printed as one table, µs
# (mean of the two runs) per kernel, shape and M, one column per probe (raw log:
# OUT_DIR/probes.log; gemv_ab times single launches of one weight buffer, so shapes under the
# 50 MB L2 stream from L2 after the first launch: the int4 32768 x 4096 (67 MB) and every FP8
# shape of >= 64 MB are DRAM's). 2. int4_imma_ab.cu: the int8 tensor-core GEMV experiment
# (int4_imma_gemv.cu) against the ring GEMV at M = 1, 2, 4, 8 (µs per launch of 20 back to
# back over rotated weight copies, TB/s, ulps against the exact product; its exit status says
# whether it is within max(2, ring + 1) ulps).
set -eu
out=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"
nvcc -O2 -std=c++20 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a \
  -I "$root/src" -o "$out/int4_imma_ab" "$here/int4_imma_ab.cu" \
  "$here/int4_imma_gemv.cu" "$root/src/backend/cuda/cuda_gemv.cu" \
  "$root/src/backend/cuda/cuda_gemv_int4.cu" &
imma_build=$!
probes=$(python3 "$here/int4_probes.py" "$root/src" "$out/probes")
AB_ARGS=int4,fp8 "$here/run.sh" "$out/ab" $probes >"$out/probes.log" 2>&1 ||
  { tail -20 "$out/probes.log"; exit 1; }
python3 - "$out/probes.log" <<'PY'
import collections, re, sys
times = collections.defaultdict(list)  # (shape, M, probe) -> µs
probe, order, rows = None, [], []
for line in open(sys.argv[1]):
    m = re.match(r"== .*/(\w+) \(rep", line)
    if m:
        probe = m.group(1)
        order += [probe] if probe not in order else []
        continue
    m = re.match(r"(int4|fp8)\s+(\d+) x\s+(\d+) M=\s*(\d+)\s+([\d.]+) us", line)
    if m and probe:
        key = (f"{m.group(1)} {m.group(2)}x{m.group(3)}", int(m.group(4)))
        rows += [key] if key not in rows else []
        times[key + (probe,)].append(float(m.group(5)))
print("GEMV probes, µs per launch (mean of 2 runs):")
w = [max(8, len(p) + 1) for p in order]
print(f"{'kernel shape':<16}{'M':>3}" + "".join(f"{p:>{n}}" for p, n in zip(order, w)))
for key in rows:
    cells = [times.get(key + (p,), []) for p in order]
    print(f"{key[0]:<16}{key[1]:>3}" +
          "".join(f"{sum(c) / len(c):{n}.2f}" if c else f"{'-':>{n}}" for c, n in zip(cells, w)))
PY
wait $imma_build || { echo "int4_imma_ab.cu did not build"; exit 1; }
echo "== int4_imma_ab (the ring GEMV vs the int8 GEMV)"
"$out/int4_imma_ab"
