#!/usr/bin/env bash
# Creates the venvs with the PyPI packages the tests use. Needs python3-venv (and gcc, readelf
# for the second; scripts/install_deps.sh --tests installs them and then runs this):
#   .venv        tests/requirements.txt (+ tests/server/requirements-nodeps.txt): every Python test
#   .venv-torch  tests/requirements-torch.txt: torch (CPU use, no NVIDIA wheels) and the
#                compressed-tensors library, for tests/model/compressed_tensors_check.py only
#                (kept apart: transformers in .venv behaves differently when torch imports)
# A second run with the same requirement files does nothing: their checksum is kept in
# .venv*/.sala-requirements.
#   SALA_NO_TORCH_VENV=1 scripts/setup_venv.sh   skips .venv-torch (then exclude the test it
#                                                serves: ctest -LE torch; see tests/model)
set -euo pipefail
cd "$(dirname "$0")/.."

# make_venv DIR: DIR/bin/python exists afterwards (or the script exits 1).
make_venv() {
  if [ ! -x "$1/bin/python" ] && ! python3 -m venv "$1"; then
    echo "setup_venv.sh: 'python3 -m venv $1' failed; install the Debian package python3-venv" \
         "(scripts/install_deps.sh --tests)" >&2
    exit 1
  fi
}
# up_to_date DIR FILES...: the venv was last made from these very requirement files.
up_to_date() {
  local dir=$1; shift
  [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.sala-requirements" 2>/dev/null)" = "$(cat "$@" | sha256sum | cut -d' ' -f1)" ]
}

reqs="tests/requirements.txt tests/server/requirements-nodeps.txt"
if ! up_to_date .venv $reqs; then
  make_venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r tests/requirements.txt
  # SGLang's bench client (sglang.bench_serving) without its GPU dependencies: the server
  # tests drive it against our server (see tests/server/run_sglang_bench.py).
  .venv/bin/python -m pip install -q --no-deps -r tests/server/requirements-nodeps.txt
  cat $reqs | sha256sum | cut -d' ' -f1 > .venv/.sala-requirements
fi

[ "${SALA_NO_TORCH_VENV:-0}" = 1 ] && exit 0
treqs="tests/requirements-torch.txt scripts/torch_cuda_stubs.py"
if ! up_to_date .venv-torch $treqs; then
  start=$(date +%s)
  rm -f .venv-torch/.sala-requirements
  make_venv .venv-torch
  .venv-torch/bin/python -m pip install -q --upgrade pip
  # --no-deps: torch's NVIDIA requirements stay out (tests/requirements-torch.txt says why).
  .venv-torch/bin/python -m pip install -q --no-deps -r tests/requirements-torch.txt
  site=$(.venv-torch/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  .venv-torch/bin/python scripts/torch_cuda_stubs.py "$site"
  # Nothing missing but what --no-deps leaves out on purpose.
  if ! .venv-torch/bin/python -m pip check >.venv-torch/pip-check.txt 2>&1; then
    if grep -v -E '^torch [^ ]+ requires (cuda-|nvidia-|triton)' .venv-torch/pip-check.txt; then
      echo "setup_venv.sh: tests/requirements-torch.txt misses the requirements above" >&2
      exit 1
    fi
  fi
  .venv-torch/bin/python -c 'import torch, compressed_tensors; assert not torch.cuda.is_available()'
  cat $treqs | sha256sum | cut -d' ' -f1 > .venv-torch/.sala-requirements
  echo "setup_venv.sh: .venv-torch made in $(( $(date +%s) - start )) s ($(du -sh .venv-torch | cut -f1))"
fi
