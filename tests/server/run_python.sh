#!/bin/sh
# run_python.sh PYTHON SCRIPT [ARGS...]: fails loudly when the repo venv is missing.
py="$1"; shift
if [ ! -x "$py" ]; then
  echo "error: $py not found: create the venv (python3 -m venv .venv && .venv/bin/pip install -r tests/requirements.txt)" >&2
  exit 1
fi
cd "$(dirname "$1")" && exec "$py" "$@"
