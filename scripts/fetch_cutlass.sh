#!/usr/bin/env bash
# Puts the PyPI wheel `nvidia-cutlass` (CUTLASS/CuTe's C++ headers are in it, under
# cutlass_library/source/include) into the dependency cache and checks its sha256. The CUDA
# backend's Hopper FP8 GEMM with per-token x per-channel scales in its epilogue
# (src/backend/cuda/cuda_gemm_fp8_sm90.cu) is built on those headers (cmake/cutlass.cmake).
#
#   scripts/fetch_cutlass.sh [CACHE_DIR]   default: $SALA_DEPS_DIR, else ~/.cache/sala-deps
#
# Prints the wheel's path (scripts/fetch_pypi_file.sh does the work). The wheel is pure Python
# + headers (py3-none-any): no build step.
set -euo pipefail
VERSION=4.2.0.0
SHA256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
exec bash "$(dirname "$0")/fetch_pypi_file.sh" "${1:-${SALA_DEPS_DIR:-$HOME/.cache/sala-deps}}" \
  "nvidia_cutlass-$VERSION-py3-none-any.whl" "$SHA256" "nvidia-cutlass==$VERSION" \
  --only-binary :all:
