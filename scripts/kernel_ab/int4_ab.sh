#!/usr/bin/env bash
# scripts/kernel_ab/int4_ab.sh OUT_DIR (GPU machine, CUDA toolkit only; ~2-3 min): issue 22's
# int4 GEMV experiments in one command. 1. int4_probes.py's probes of the production kernel
# (parts cheapened or switched off: where its time goes), timed A B A B by run.sh with
# gemv_ab's int4 table only. 2. int4_imma_ab.cu: the int8 tensor-core prototype against the
# production kernel at M = 1, 2 (µs, TB/s, ulps against the exact product).
set -eu
out=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"
nvcc -O2 -std=c++20 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a \
  -I "$root/src" -o "$out/int4_imma_ab" "$here/int4_imma_ab.cu" \
  "$root/src/backend/cuda/cuda_gemv.cu" &
probes=$(python3 "$here/int4_probes.py" "$root/src" "$out/probes")
AB_ARGS=int4 "$here/run.sh" "$out/ab" $probes
wait
echo "== int4_imma_ab"
"$out/int4_imma_ab"
