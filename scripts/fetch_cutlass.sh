#!/usr/bin/env bash
# Puts the PyPI wheel `nvidia-cutlass` (CUTLASS/CuTe's C++ headers are in it, under
# cutlass_library/source/include) into the dependency cache and checks its sha256. The CUDA
# backend's Hopper FP8 GEMM with per-token x per-channel scales in its epilogue
# (src/backend/cuda/cuda_gemm_fp8_sm90.cu) is built on those headers (cmake/cutlass.cmake).
#
#   scripts/fetch_cutlass.sh [CACHE_DIR]   default: $SALA_DEPS_DIR, else ~/.cache/sala-deps
#
# Prints the wheel's path. Does nothing (and needs no network) when the file is already there
# with the right checksum. The wheel is pure Python + headers (py3-none-any): no build step.
set -euo pipefail
VERSION=4.2.0.0
SHA256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
cache=${1:-${SALA_DEPS_DIR:-$HOME/.cache/sala-deps}}
name="nvidia_cutlass-$VERSION-py3-none-any.whl"
file="$cache/$name"

ok() { [ -f "$file" ] && [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$SHA256" ]; }
if ok; then echo "$file"; exit 0; fi

mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A throw-away venv, as scripts/fetch_xgrammar.sh: the system Python may have no pip.
if ! python3 -m venv "$tmp/venv" >/dev/null 2>&1; then
  echo "fetch_cutlass.sh: 'python3 -m venv' failed; install the Debian package python3-venv" \
       "(scripts/install_deps.sh)" >&2
  exit 1
fi
if ! "$tmp/venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
       --only-binary :all: "nvidia-cutlass==$VERSION" -d "$tmp/dl" >&2; then
  echo "fetch_cutlass.sh: pip could not download nvidia-cutlass==$VERSION from PyPI" >&2
  exit 1
fi
got=$(sha256sum "$tmp/dl/$name" | cut -d' ' -f1)
if [ "$got" != "$SHA256" ]; then
  echo "fetch_cutlass.sh: $name has sha256 $got, expected $SHA256" >&2
  exit 1
fi
mv "$tmp/dl/$name" "$file"
echo "$file"
