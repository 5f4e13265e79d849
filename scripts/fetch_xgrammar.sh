#!/usr/bin/env bash
# Puts xgrammar's source distribution (sdist) from PyPI into the dependency cache and checks
# its sha256. The engine builds xgrammar's C++ core from it (cmake/xgrammar.cmake): the
# structured-output grammar engine. Only the sdist is used, never a wheel: the C++ sources
# (cpp/, include/, 3rdparty/picojson, 3rdparty/dlpack) are in it.
#
#   scripts/fetch_xgrammar.sh [CACHE_DIR]   default: $SALA_DEPS_DIR, else ~/.cache/sala-deps
#
# Prints the sdist's path (scripts/fetch_pypi_file.sh does the work: preparing the sdist's
# metadata makes pip install scikit-build-core and nanobind into its throw-away venv).
set -euo pipefail
VERSION=0.2.8
SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
exec bash "$(dirname "$0")/fetch_pypi_file.sh" "${1:-${SALA_DEPS_DIR:-$HOME/.cache/sala-deps}}" \
  "xgrammar-$VERSION.tar.gz" "$SHA256" "xgrammar==$VERSION" --no-binary xgrammar
