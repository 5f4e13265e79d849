#!/usr/bin/env bash
# Builds `sala`, serves the bundled sala-tiny-chat model on the CPU, asks it one question
# through the OpenAI-style API and prints the answer; the server keeps running (Ctrl-C stops).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build sala
PORT=${PORT:-30000}
./build/src/cli/sala serve --port "$PORT" &
server=$!
trap 'kill $server 2>/dev/null' INT TERM
for _ in $(seq 100); do curl -sf "localhost:$PORT/health" >/dev/null && break; sleep 0.1; done
question='Which number is the largest? A) 312 B) 887 C) 45 D) 610'
echo "Q: $question"
curl -s "localhost:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$question\"}],\"temperature\":0}" |
  python3 -c 'import json,sys; print("A:", json.load(sys.stdin)["choices"][0]["message"]["content"])'
echo "serving on http://127.0.0.1:$PORT (Ctrl-C to stop)"
wait $server
