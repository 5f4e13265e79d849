#!/usr/bin/env bash
# Host simulation of the InfLLM-v2 selection kernels (src/backend/cuda/cuda_infllm_select.cu)
# for machines without a GPU: the kernels' own source compiled by g++ with shim headers
# (sim.h: a block's threads as fibers, barriers exact, mma.sync m16n8k16 / ldmatrix.x4 /
# shuffles emulated from the PTX fragment layouts), run on small shapes (d 16/32/64/128,
# bf16 and e4m3 / e5m2 caches, first chunks, later chunks, partial tiles, split decode rows)
# against a double reference of SPEC §9.4–9.5 and against the kernels of revision REF
# (default 8002222, the row-per-warp kernels this layout replaced), all three kernels.
# Not a substitute for the GPU tests (CudaOps.SparseLayer*, CudaKvFp8.*): it checks the
# kernels' indexing, fragment and reduction logic only.
# Usage: scripts/select_sim/run.sh [REF]   (g++ >= 12, the CUDA headers, git; no GPU; a few min)
# Exit 0 and "ALL OK": see driver.cpp for the criteria.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ref=${1:-8002222}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/shim/backend/cuda" "$tmp/shim/cub/block"
src=src/backend/cuda/cuda_infllm_select.cu
printf '#include "sim.h"\n#include "backend/cuda/cuda_check.h"\n' >"$tmp/shim/backend/cuda/cuda_common.cuh"
echo '#include "sim.h"' >"$tmp/shim/backend/cuda/cuda_launch.cuh"
echo '#include "sim.h"' >"$tmp/shim/cub/block/block_scan.cuh"
# cuda_mma.cuh: the emulated instructions (sim.h) + the real paged-cache / SPEC §9.3 helpers.
{
  printf '#pragma once\n#include "sim.h"\n#include "backend/cuda/cuda_kernels.h"\nnamespace sala::cuda {\n'
  awk '/^\/\/ Element offset of token p/{p=1} p{print}' "$root/src/backend/cuda/cuda_mma.cuh"
} >"$tmp/shim/backend/cuda/cuda_mma.cuh"
grep -q 'visible_count' "$tmp/shim/backend/cuda/cuda_mma.cuh" || { echo "select_sim: cuda_mma.cuh not recognised" >&2; exit 2; }
# The kernels of a revision: each file from `namespace sala::cuda {` up to its host launchers,
# in namespace NS::fI (the files' anonymous namespaces would clash); dynamic shared memory
# becomes static arrays (blocks run one at a time).
extract() {  # ns file...
  python3 - "$@" <<'PY'
import sys
ns, files = sys.argv[1], sys.argv[2:]
out = []
for i, f in enumerate(files):
    s = open(f).read()
    a = s.index('namespace sala::cuda {') + len('namespace sala::cuda {')
    ends = [s.find(m, a) for m in ('template <int D, int KF>\nvoid launch_select_d',
                                   'template <int NT>\nvoid launch_topk')]
    k = s[a:min(e for e in ends if e >= 0)]
    k = k.replace('extern __shared__ __align__(16) unsigned char smem_raw[];',
                  'alignas(16) static unsigned char smem_raw[65536];')
    k = k.replace('extern __shared__ uint16_t keys[];', 'static uint16_t keys[65536];')
    assert 'extern __shared__' not in k
    out.append('namespace f%d {%s}  // namespace\n}' % (i, k))
print('namespace sala::cuda { namespace %s {\n%s\n%s\n} }' % (
    ns, '\n'.join(out), '\n'.join('using namespace f%d;' % i for i in range(len(files)))))
PY
}
new=("$root/$src")
[ -f "$root/src/backend/cuda/cuda_infllm_topk.cu" ] && new+=("$root/src/backend/cuda/cuda_infllm_topk.cu")
# The helpers the kernels share with the wgmma score kernel (TileRow, EntryPages, EntryRun),
# included as the file includes them (its #include lines are not extracted).
{
  [ -f "$root/src/backend/cuda/cuda_infllm_select.cuh" ] &&
    echo '#include "backend/cuda/cuda_infllm_select.cuh"'
  extract newk "${new[@]}"
} >"$tmp/kern_new.inc"
git -C "$root" show "$ref:$src" >"$tmp/ref.cu"
extract refk "$tmp/ref.cu" >"$tmp/kern_ref.inc"
# -fno-strict-aliasing: the kernels pun shared memory through uint4 / uint2 stores, as CUDA allows.
g++ -std=c++20 -O2 -fno-strict-aliasing -w -I"$tmp" -I"$here" -I"$tmp/shim" -I"$root/src" \
  -I"${CUDA_HOME:-/usr/local/cuda}/include" "$here/driver.cpp" -o "$tmp/sim"
"$tmp/sim"
