#!/bin/sh
# Runs a Python test with the repo venv; fails loudly (never skips) if the venv is missing.
PY="$1"; shift
if [ ! -x "$PY" ]; then
  echo "FAIL: $PY not found: create the venv with scripts/setup_venv.sh (tests/requirements.txt)" >&2
  exit 1
fi
exec "$PY" "$@"
