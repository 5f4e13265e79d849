#!/usr/bin/env bash
# Puts one pinned file from PyPI (a source distribution or a wheel) into the dependency cache
# and checks its sha256: the shared body of scripts/fetch_xgrammar.sh and
# scripts/fetch_cutlass.sh, which name the file, its checksum and pip's options.
#
#   scripts/fetch_pypi_file.sh CACHE_DIR FILE_NAME SHA256 REQUIREMENT [PIP_OPTION...]
#
# Prints the file's path. Does nothing (and needs no network) when the file is already there
# with the right checksum. pip runs in a throw-away venv (Debian: python3-venv), so the system
# Python is left untouched and need not have pip; preparing an sdist's metadata makes pip
# install its build backend there too.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 CACHE_DIR FILE_NAME SHA256 REQUIREMENT [PIP_OPTION...]" >&2; exit 2; }
cache=$1 name=$2 sha=$3 req=$4
shift 4
file="$cache/$name"
me="$(basename "$0") ($req)"

ok() { [ -f "$file" ] && [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$sha" ]; }
if ok; then echo "$file"; exit 0; fi

mkdir -p "$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m venv "$tmp/venv" >/dev/null 2>&1; then
  echo "$me: 'python3 -m venv' failed; install the Debian package python3-venv" \
       "(scripts/install_deps.sh)" >&2
  exit 1
fi
if ! "$tmp/venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps "$@" \
       "$req" -d "$tmp/dl" >&2; then
  echo "$me: pip could not download $req from PyPI" >&2
  exit 1
fi
if [ ! -f "$tmp/dl/$name" ]; then
  echo "$me: pip did not fetch $name (got: $(ls "$tmp/dl" | tr '\n' ' '))" >&2
  exit 1
fi
got=$(sha256sum "$tmp/dl/$name" | cut -d' ' -f1)
if [ "$got" != "$sha" ]; then
  echo "$me: $name has sha256 $got, expected $sha" >&2
  exit 1
fi
mv "$tmp/dl/$name" "$file"
echo "$file"
