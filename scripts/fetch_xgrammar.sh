#!/usr/bin/env bash
# Puts xgrammar's source distribution (sdist) from PyPI into the dependency cache and checks
# its sha256. The engine builds xgrammar's C++ core from it (cmake/xgrammar.cmake): the
# structured-output grammar engine. Only the sdist is used, never a wheel: the C++ sources
# (cpp/, include/, 3rdparty/picojson, 3rdparty/dlpack) are in it.
#
#   scripts/fetch_xgrammar.sh [CACHE_DIR]   default: $SALA_DEPS_DIR, else ~/.cache/sala-deps
#
# Prints the sdist's path. Does nothing (and needs no network) when the file is already there
# with the right checksum. pip fetches the sdist; preparing its metadata makes pip install
# scikit-build-core and nanobind into a throw-away build environment, so a temporary venv
# (Debian: python3-venv) keeps the system Python untouched.
set -euo pipefail
VERSION=0.2.8
SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
cache=${1:-${SALA_DEPS_DIR:-$HOME/.cache/sala-deps}}
file="$cache/xgrammar-$VERSION.tar.gz"

ok() { [ -f "$file" ] && [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$SHA256" ]; }
if ok; then echo "$file"; exit 0; fi

mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m venv "$tmp/venv" >/dev/null 2>&1; then
  echo "fetch_xgrammar.sh: 'python3 -m venv' failed; install the Debian package python3-venv" \
       "(scripts/install_deps.sh)" >&2
  exit 1
fi
if ! "$tmp/venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
       --no-binary xgrammar "xgrammar==$VERSION" -d "$tmp/dl" >&2; then
  echo "fetch_xgrammar.sh: pip could not download xgrammar==$VERSION's sdist from PyPI" >&2
  exit 1
fi
got=$(sha256sum "$tmp/dl/xgrammar-$VERSION.tar.gz" | cut -d' ' -f1)
if [ "$got" != "$SHA256" ]; then
  echo "fetch_xgrammar.sh: xgrammar-$VERSION.tar.gz has sha256 $got, expected $SHA256" >&2
  exit 1
fi
mv "$tmp/dl/xgrammar-$VERSION.tar.gz" "$file"
echo "$file"
