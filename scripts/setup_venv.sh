#!/usr/bin/env bash
# Creates .venv with the PyPI packages the tests use (tests/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r tests/requirements.txt
