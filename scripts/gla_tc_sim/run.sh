#!/usr/bin/env bash
# Host simulation of the lightning layers' tensor-core chunk kernel
# (src/backend/cuda/cuda_lightning_seq_tc.cu) for machines without a GPU: the kernel's own
# source, compiled by g++ with shim headers (sim.h: a std::thread per CUDA thread, std::barrier
# as __syncthreads, mma.sync m16n8k16 and ldmatrix.x4 (.trans) emulated from the PTX fragment
# layouts, cp.async as copies), run on small shapes (d 16/32/64/128, several sequences, partial
# chunks, incoming states, a state written to another slot) against a double reference of the
# chunk form (driver.cpp). Not a substitute for the GPU tests (CudaLightningTc.*): it checks
# the kernel's indexing and fragment logic only.
# Usage: scripts/gla_tc_sim/run.sh   (g++ >= 12 and the CUDA headers; no GPU; ~1 min)
# Exit 0 and "ALL OK": every output within 1 bf16 ulp of the reference, every output written,
# final states within 1e-6 relative.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/shim/backend/cuda"
for f in cuda_common.cuh cuda_kernels.h cuda_mma.cuh; do
  echo '#include "sim.h"' >"$tmp/shim/backend/cuda/$f"
done
# The kernels: from `namespace sala::cuda {` to the end of the anonymous namespace (the host
# launchers stay out); the dynamic shared memory becomes one static array (blocks run one at
# a time).
awk '/^namespace sala::cuda \{/{p=1} p{print} /^}  \/\/ namespace$/{if(p){exit}}' \
  "$root/src/backend/cuda/cuda_lightning_seq_tc.cu" |
  sed 's/extern __shared__ __align__(16) unsigned char seq_smem\[\];/alignas(16) unsigned char seq_smem[232448];/' \
    >"$tmp/kern.inc"
grep -q 'unsigned char seq_smem\[232448\]' "$tmp/kern.inc" || { echo "gla_tc_sim: kernel source not recognised" >&2; exit 2; }
echo "}  // namespace sala::cuda" >>"$tmp/kern.inc"
# -fno-strict-aliasing: the kernels pun shared memory through uint4 / uint2 stores, as CUDA allows.
g++ -std=c++20 -O2 -fno-strict-aliasing -I"$tmp" -I"$here" -I"$tmp/shim" -I"$root/src" \
  -I"${CUDA_HOME:-/usr/local/cuda}/include" "$here/driver.cpp" -o "$tmp/sim" -pthread
"$tmp/sim"
