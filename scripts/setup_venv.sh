#!/usr/bin/env bash
# Creates .venv with the PyPI packages the tests use (tests/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r tests/requirements.txt
# SGLang's bench client (sglang.bench_serving) without its GPU dependencies: the server
# tests drive it against our server (see tests/server/run_sglang_bench.py).
.venv/bin/python -m pip install -q --no-deps -r tests/server/requirements-nodeps.txt
