#!/usr/bin/env bash
# Static SASS statistics of the kernels of one CUDA source, without a GPU: compiles FILE.cu for
# sm_90a with the backend's flags, prints ptxas's registers / spills per kernel matching
# PATTERN, then scripts/sass_loops.py's loop table (instructions per loop, opcode histogram).
# How session 30 cut the int4 GEMV's stage loop by 14 % before any GPU was lent.
#
#   scripts/sass_stats.sh FILE.cu [PATTERN] [--min N]
#
# cuobjdump: the CUDA toolkit's when it has one (the GPU machine's does); else the PyPI wheel
# nvidia-cuda-cuobjdump (pinned, sha256-checked: scripts/fetch_pypi_file.sh) unpacked into the
# dependency cache ($SALA_DEPS_DIR, default ~/.cache/sala-deps). Writes under $SASS_OUT
# (default /tmp/sala_sass): the cubin and the whole listing, for reading around a loop.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
src=$1 pattern=${2:-}
shift $(($# >= 2 ? 2 : 1))
out=${SASS_OUT:-/tmp/sala_sass}
deps=${SALA_DEPS_DIR:-$HOME/.cache/sala-deps}
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"

# cuobjdump -sass runs nvdisasm: both come from the same CUDA release.
TOOLS_VERSION=13.5.37
declare -A TOOL_SHA256=(
  [cuobjdump]=38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58
  [nvdisasm]=d3fdbdd49fa53e2e4aacd3db8259d052bd2b049ececdcb69e92e083c6728e7ca)
cuobjdump_bin() {
  if command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null; then
    command -v cuobjdump; return
  fi
  local dir="$deps/cuda-tools-$TOOLS_VERSION" tool wheel
  for tool in cuobjdump nvdisasm; do
    [ -x "$dir/nvidia/cu13/bin/$tool" ] && continue
    wheel=$(bash "$ROOT/scripts/fetch_pypi_file.sh" "$deps" \
      "nvidia_cuda_$tool-$TOOLS_VERSION-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl" \
      "${TOOL_SHA256[$tool]}" "nvidia-cuda-$tool==$TOOLS_VERSION" --only-binary :all:)
    mkdir -p "$dir"
    python3 -m zipfile -e "$wheel" "$dir"
    chmod +x "$dir/nvidia/cu13/bin/$tool"
  done
  export PATH="$dir/nvidia/cu13/bin:$PATH"
  echo "$dir/nvidia/cu13/bin/cuobjdump"
}

cubin=$out/$(basename "$src" .cu).cubin
nvcc -I "$ROOT/src" -isystem=/usr/local/cuda/include -O3 -DNDEBUG \
  -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -std=c++20 -x cu -cubin \
  "$ROOT/$src" -o "$cubin" -Xptxas -v 2>"$out/ptxas.txt" ||
  { grep -v "ptxas info" "$out/ptxas.txt" >&2; echo "$src: nvcc failed" >&2; exit 1; }
# ptxas prints "Compiling entry function 'NAME'", then its stack / spill line, then "Used N
# registers".
awk -v p="$pattern" '/Compiling entry function/ { name = $0; sub(/.*function .?/, "", name);
  sub(/.? for .*/, "", name); want = index(name, p) > 0; spill = "" }
  want && /spill/ { spill = $0; sub(/.*info *: */, "", spill) }
  want && /Used [0-9]+ registers/ { sub(/.*Used/, "Used");
    print substr(name, 1, 100) ": " $0 "; " spill }' "$out/ptxas.txt"
cuobjdump=$(cuobjdump_bin)
PATH="$(dirname "$cuobjdump"):$PATH" "$cuobjdump" -sass "$cubin" >"$out/listing.sass"
python3 "$ROOT/scripts/sass_loops.py" "$out/listing.sass" "$pattern" "$@"
