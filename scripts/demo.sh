#!/usr/bin/env bash
# The first command: installs what is missing (scripts/install_deps.sh), builds `sala` only
# (no tests; no CUDA backend unless SALA_CUDA=ON) in build-demo/, serves the bundled
# sala-tiny-chat model on the CPU, asks it one question through the OpenAI-style API and prints
# the answer; the server keeps running until Ctrl-C (with --once it stops after the answer).
#
# Environment: PORT (30000), SALA_CUDA (OFF; ON/AUTO also build the CUDA backend), DEVICE
# (cpu; cuda needs SALA_CUDA=ON and a GPU), HEALTH_TIMEOUT (seconds to wait for /health, 120),
# SALA_NO_INSTALL=1 (check the prerequisites, install nothing), JOBS (parallel compile jobs;
# Ninja's default otherwise).
# Whatever way the script ends (an error, Ctrl-C, --once), it stops the server it started.
set -euo pipefail
cd "$(dirname "$0")/.."
once=0
case "${1:-}" in
  "") ;;
  --once) once=1 ;;
  -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
  *) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
PORT=${PORT:-30000}
SALA_CUDA=${SALA_CUDA:-OFF}
DEVICE=${DEVICE:-cpu}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-120}
BUILD=build-demo
LOG=$BUILD/demo-server.log

fail() { echo "demo.sh: $*" >&2; exit 1; }

if [ "${SALA_NO_INSTALL:-0}" != 1 ]; then
  bash scripts/install_deps.sh || fail "the dependencies could not be installed (see above)"
fi
# command -> the Debian package that provides it (the libraries are checked by CMake)
for pair in cmake:cmake ninja:ninja-build g++:g++ pkg-config:pkg-config curl:curl \
            python3:python3; do
  command -v "${pair%%:*}" >/dev/null 2>&1 ||
    fail "'${pair%%:*}' not found: install the Debian package ${pair#*:} (scripts/install_deps.sh)"
done
# Something already on the port would answer our requests instead of the new server.
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  fail "port $PORT is already in use; choose another with PORT=... scripts/demo.sh"
fi

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSALA_TESTS=OFF \
      -DSALA_CUDA="$SALA_CUDA" >/dev/null || fail "CMake configuration failed (see above)"
ninja -C "$BUILD" ${JOBS:+-j "$JOBS"} sala || fail "the build failed (see above)"

server=""
stop_server() {
  [ -n "$server" ] || return 0
  kill "$server" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}
trap stop_server EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$BUILD/src/cli/sala" serve --port "$PORT" --device "$DEVICE" >"$LOG" 2>&1 &
server=$!
echo "starting the server on port $PORT (log: $LOG)"
deadline=$(( $(date +%s) + HEALTH_TIMEOUT ))
until curl -sf --max-time 2 "http://127.0.0.1:$PORT/health" >/dev/null; do
  if ! kill -0 "$server" 2>/dev/null; then
    tail -n 20 "$LOG" >&2
    fail "the server exited during start-up (log above, full log: $LOG)"
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    tail -n 20 "$LOG" >&2
    fail "no answer from http://127.0.0.1:$PORT/health within $HEALTH_TIMEOUT s" \
         "(a slow machine: HEALTH_TIMEOUT=...)"
  fi
  sleep 0.2
done

question='Which number is the largest? A) 312 B) 887 C) 45 D) 610'
echo "Q: $question"
body=$(curl -sf --max-time 300 "http://127.0.0.1:$PORT/v1/chat/completions" \
         -H 'Content-Type: application/json' \
         -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$question\"}],\"temperature\":0}") ||
  fail "the chat request failed (server log: $LOG)"
read_answer='import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'
answer=$(python3 -c "$read_answer" \
           <<<"$body" 2>/dev/null) || fail "unexpected reply: $body"
echo "A: $answer"
[ "$once" = 1 ] && exit 0
echo "serving on http://127.0.0.1:$PORT (Ctrl-C to stop; log: $LOG)"
wait "$server"
