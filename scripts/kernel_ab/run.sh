#!/usr/bin/env bash
# scripts/kernel_ab/run.sh OUT_DIR SRC_DIR... (GPU machine, CUDA toolkit only): builds
# gemv_ab.cu against each SRC_DIR (a copy of the repository's src/ holding one variant of the
# skinny GEMV kernels), runs the builds one after another twice (A B A B), and prints each
# build's table; the hash column must agree across builds whose kernels promise the same bits.
# AB_ARGS: arguments of every run (gemv_ab's: a comma list of bf16, int4, fp8).
set -eu
out=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
i=0
for src in "$@"; do
  ( nvcc -O2 -std=c++20 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -I "$src" \
      -o "$out/ab$i" "$here/gemv_ab.cu" "$src/backend/cuda/cuda_gemv.cu" \
      "$src/backend/cuda/cuda_gemv_int4.cu" "$src/backend/cuda/cuda_gemv_fp8.cu" ) &
  i=$((i + 1))
done
wait
for rep in 1 2; do
  i=0
  for src in "$@"; do echo "== $src (rep $rep)"; "$out/ab$i" ${AB_ARGS:-}; i=$((i + 1)); done
done
