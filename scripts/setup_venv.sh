#!/usr/bin/env bash
# Creates .venv with the PyPI packages the tests use (tests/requirements.txt). Needs python3-venv
# (scripts/install_deps.sh --tests installs it and then runs this). A second run with the same
# requirement files does nothing: their checksum is kept in .venv/.sala-requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
reqs="tests/requirements.txt tests/server/requirements-nodeps.txt"
sum=$(cat $reqs | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat .venv/.sala-requirements 2>/dev/null)" = "$sum" ]; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  if ! python3 -m venv .venv; then
    echo "setup_venv.sh: 'python3 -m venv' failed; install the Debian package python3-venv" \
         "(scripts/install_deps.sh --tests)" >&2
    exit 1
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r tests/requirements.txt
# SGLang's bench client (sglang.bench_serving) without its GPU dependencies: the server
# tests drive it against our server (see tests/server/run_sglang_bench.py).
.venv/bin/python -m pip install -q --no-deps -r tests/server/requirements-nodeps.txt
echo "$sum" > .venv/.sala-requirements
