#!/usr/bin/env bash
# Installs the Debian packages SALA needs (Debian 12 "bookworm" names). Only what is
# missing is installed; when everything is there it does nothing and takes well under a second.
#
#   scripts/install_deps.sh           build + run: what scripts/demo.sh and `sala serve` need,
#                                     and xgrammar's sdist from PyPI (scripts/fetch_xgrammar.sh:
#                                     the grammar engine's sources, checked by sha256, cached in
#                                     $SALA_DEPS_DIR, default ~/.cache/sala-deps); with nvcc
#                                     also CUTLASS's headers (scripts/fetch_cutlass.sh)
#   scripts/install_deps.sh --tests   also what the tests need (GoogleTest, python3-venv, ccache,
#                                     clang-14 + libclang-rt-14-dev + libomp-14-dev for fuzzing),
#                                     then the PyPI packages of tests/requirements.txt into .venv
#                                     and of tests/requirements-torch.txt into .venv-torch
#                                     (scripts/setup_venv.sh; its stub CUDA libraries need gcc)
#   scripts/install_deps.sh --check [--tests]   only report what is missing (exit 1 if anything is)
#
# Installing needs root: run as root, or with sudo available; otherwise it prints the
# apt-get command to run and exits 1. The CUDA toolkit is not installed here: the CUDA backend
# is built when nvcc is found (/usr/local/cuda/bin on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

# Build: compiler, CMake + Ninja, pkg-config (openblas, cpp-httplib and sentencepiece are found
# through it), and the libraries of src/*/CMakeLists.txt (OpenMP comes with g++); python3-venv
# for pip, which fetches xgrammar's sdist (scripts/fetch_xgrammar.sh).
BUILD_PKGS="g++ cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev
  libcpp-httplib-dev libsentencepiece-dev libopenblas-dev python3-venv"
# Run: scripts/demo.sh talks to the server with curl and reads the JSON answer with python3.
RUN_PKGS="curl python3"
# Tests: the C++ tests link GoogleTest (no gmock); the Python tests run in a venv; ccache is an
# optional speedup that CMake uses when it is present. The libFuzzer harnesses (tests/fuzz,
# SALA_FUZZ=ON) need clang with its runtime (libFuzzer, ASan, UBSan) and clang's OpenMP.
TEST_PKGS="libgtest-dev python3-venv ccache clang-14 libclang-rt-14-dev libomp-14-dev"

tests=0 check=0
for arg in "$@"; do
  case "$arg" in
    --tests) tests=1 ;;
    --check) check=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "install_deps.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
pkgs="$BUILD_PKGS $RUN_PKGS"
[ "$tests" = 1 ] && pkgs="$pkgs $TEST_PKGS"

if ! command -v dpkg-query >/dev/null 2>&1; then
  # Not Debian: nothing can be checked here; name what is needed and let CMake tell the rest.
  echo "install_deps.sh: not a Debian-based system (no dpkg-query); install the equivalents of" \
       "these Debian packages yourself:" $pkgs >&2
  exit 0
fi

missing=""
for p in $pkgs; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing="$missing $p"
done
missing=${missing# }

if [ -n "$missing" ]; then
  if [ "$check" = 1 ]; then echo "missing Debian packages: $missing"; exit 1; fi
  if [ "$(id -u)" = 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "install_deps.sh: these Debian packages are missing: $missing" >&2
    echo "  and installing them needs root (not root, no sudo). As root, run:" >&2
    echo "    apt-get update && apt-get install -y $missing" >&2
    exit 1
  fi
  echo "install_deps.sh: installing $missing"
  apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get)
  if ! "${apt[@]}" update -qq || ! "${apt[@]}" install -y -qq $missing >/dev/null; then
    echo "install_deps.sh: apt-get failed; the packages needed are: $missing" >&2
    exit 1
  fi
fi

xgrammar_sdist() {  # the name fetch_xgrammar.sh gives the cached file
  echo "${SALA_DEPS_DIR:-$HOME/.cache/sala-deps}/xgrammar-$(sed -n 's/^VERSION=//p' scripts/fetch_xgrammar.sh).tar.gz"
}
# With the CUDA toolkit: CUTLASS's headers (the nvidia-cutlass wheel) for the Hopper FP8 GEMM.
have_nvcc() { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }
cutlass_wheel() {  # the name fetch_cutlass.sh gives the cached file
  echo "${SALA_DEPS_DIR:-$HOME/.cache/sala-deps}/nvidia_cutlass-$(sed -n 's/^VERSION=//p' scripts/fetch_cutlass.sh)-py3-none-any.whl"
}
if [ "$check" = 1 ]; then
  [ -f "$(xgrammar_sdist)" ] || { echo "missing: $(xgrammar_sdist) (scripts/fetch_xgrammar.sh)"; exit 1; }
  if have_nvcc && [ ! -f "$(cutlass_wheel)" ]; then
    echo "missing: $(cutlass_wheel) (scripts/fetch_cutlass.sh)"; exit 1
  fi
else
  bash scripts/fetch_xgrammar.sh >/dev/null
  if have_nvcc; then bash scripts/fetch_cutlass.sh >/dev/null; fi
fi

if [ "$tests" = 1 ] && [ "$check" = 0 ]; then
  bash scripts/setup_venv.sh
fi
