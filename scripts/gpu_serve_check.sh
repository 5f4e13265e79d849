#!/usr/bin/env bash
# Serving checks on the GPU machine (after `scripts/gpu_check.sh pack` here; PACK_DIR defaults
# to .gpu; the eval set is the repository's tests/fixtures/eval): the server on
# --device cuda, driven by our own clients, as users run it.
#   1. sala-tiny-chat, bf16 on the GPU: `sala eval` on tiny-chat.jsonl through
#      /v1/chat/completions; agreement with the fp32 reference answers and accuracy.
#   2. The full-size random model (sala make-random + a synthetic full-vocab tokenizer):
#      `sala bench serve` S1/S8/S∞ on a generated speed set (lengths scaled, see SPEED_*);
#      SERVE_BENCH=0 skips it.
# Both for each server configuration of SERVE_MODES (default "bf16"; "bf16 fp8" side by side).
# Prints a short table last; logs and results go to $OUT.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpu_serve_out}
PACK_DIR=${PACK_DIR:-$ROOT/.gpu}
EVAL_DIR=${EVAL_DIR:-$ROOT/tests/fixtures/eval}
mkdir -p "$OUT" /tmp/sala_gpu
tar -C /tmp/sala_gpu -xJf "$PACK_DIR/pack.tar.xz"
G=/tmp/sala_gpu
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && cuda_libs="$cuda_libs:$d"
done
if [ -z "$cuda_libs" ]; then
  f=$(find / -xdev -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
  [ -n "$f" ] && cuda_libs=":$(dirname "$f")"
fi
export LD_LIBRARY_PATH="$G/lib$cuda_libs:${LD_LIBRARY_PATH:-}"
ldd "$G/bin/sala" | grep "not found" && echo "MISSING LIBRARIES"
SALA=$G/bin/sala
ops="not run"
if [ "${CHECK_OPS:-0}" = 1 ]; then  # the pack's op tests and golden bf16 cases (GOLDEN_ROOT) first
  ops="op tests pass"
  for t in test_cuda_ops test_cuda_sparse test_cuda_f32; do  # gpu_check.sh's OP_TESTS
    SALA_REQUIRE_GPU=1 "$G/bin/$t" >"$OUT/$t.log" 2>&1 || ops="op tests FAIL ($t)"
  done
  for c in tiny-dense tiny-sparse; do
    "$SALA" golden "${GOLDEN_ROOT:-$ROOT/tests/fixtures/golden}/$c" --device cuda --mode bf16 \
      >"$OUT/golden_$c.log" 2>&1
    ops="$ops; golden $c: $(tail -1 "$OUT/golden_$c.log")"
  done
fi
wait_health() {
  for _ in $(seq 1200); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.25; done
  return 1
}

# SERVE_MODES: the server configurations compared in this one run (same machine, same set),
# each MODE[-chunkN][:TIERS]: bf16 (no flag), fp8 (`--quantization fp8`: W8A8 e4m3 projections
# quantized at load), fp8kv8 (fp8 and `--kv-cache-dtype fp8_e4m3`); -chunkN adds
# `--chunked-prefill-size N`; :TIERS (e.g. :8) runs only those bench serve tiers (default
# 1,8,inf). TINY_EVAL=0 skips the tiny-chat accuracy part.
mode_flags() {
  local m=${1%%:*} f=""
  case "$m" in *-chunk*) f="--chunked-prefill-size ${m##*-chunk}"; m=${m%-chunk*} ;; esac
  case "$m" in
    bf16) echo "$f" ;;
    fp8) echo "--quantization fp8 $f" ;;
    fp8kv8) echo "--quantization fp8 --kv-cache-dtype fp8_e4m3 $f" ;;
    *) echo "unknown mode $1" >&2; exit 2 ;;
  esac
}
mode_tiers() { case "$1" in *:*) echo "${1#*:}" ;; *) echo "1,8,inf" ;; esac; }
SERVE_MODES=${SERVE_MODES:-bf16}

# 1. tiny-chat accuracy on the GPU, per mode.
declare -A tiny
for mode in $SERVE_MODES; do
  tag=${mode//[:,]/_}  # file names
  [ "${TINY_EVAL:-1}" = 0 ] && { tiny[$mode]="not run (TINY_EVAL=0)"; continue; }
  # shellcheck disable=SC2046  # the mode's flags, split on purpose
  "$SALA" serve --device cuda --port 30001 --model-path "$ROOT/models/sala-tiny-chat" $(mode_flags "$mode") \
    >"$OUT/serve_tiny_$tag.log" 2>&1 &
  pid=$!
  wait_health http://127.0.0.1:30001 || { echo "tiny server did not start"; tail "$OUT/serve_tiny_$tag.log"; }
  "$SALA" eval --url http://127.0.0.1:30001 --data "$EVAL_DIR/tiny-chat.jsonl" --quiet \
    --out "$OUT/tiny_gpu_preds_$tag.jsonl" --summary "$OUT/tiny_gpu_summary_$tag.json" --concurrency 16 | tail -6
  kill $pid; wait $pid 2>/dev/null
  tiny[$mode]=$(python3 - "$OUT/tiny_gpu_preds_$tag.jsonl" "$EVAL_DIR/tiny-chat.reference.jsonl" "$OUT/tiny_gpu_summary_$tag.json" <<'PY'
import json, sys
preds = sorted((json.loads(l) for l in open(sys.argv[1])), key=lambda p: p["index"])
refs = [json.loads(l) for l in open(sys.argv[2])]
same = sum(p["prediction"] == r["output_text"] for p, r in zip(preds, refs))
ref_acc = 100 * sum(r["correct"] for r in refs) / len(refs)
acc = json.load(open(sys.argv[3]))["ori_accuracy"]
print(f"{same}/{len(refs)} answers equal the fp32 reference; accuracy {acc:.2f} (reference {ref_acc:.2f})")
PY
)
done

# 2. Full-size random model: S1 / S8 / S∞, per mode (SERVE_BENCH=0 skips it: the tiny-chat
# accuracy alone fits a short command).
if [ "${SERVE_BENCH:-1}" != 0 ]; then
M=/tmp/sala-9b-random
t0=$SECONDS
"$SALA" make-random --like-config "$ROOT/configs/minicpm-sala-9b.json" --out $M >"$OUT/make_random.log" 2>&1
python3 "$ROOT/scripts/make_full_vocab_tokenizer.py" $M >>"$OUT/make_random.log" 2>&1
echo "make-random: $((SECONDS - t0)) s"
"$SALA" make-speed-set --out "$OUT/speed.jsonl" --n "${SPEED_N:-16}" --seed 1 --scale "${SPEED_SCALE:-0.03}" \
  --output-scale "${SPEED_OUTPUT_SCALE:-0.1}" --max-prompt-tokens "${SPEED_MAX_PROMPT:-12000}" | tail -3
for mode in $SERVE_MODES; do
  tag=${mode//[:,]/_}
  # shellcheck disable=SC2046
  "$SALA" serve --device cuda --port 30002 --model-path $M $(mode_flags "$mode") >"$OUT/serve_9b_$tag.log" 2>&1 &
  pid=$!
  t0=$SECONDS
  wait_health http://127.0.0.1:30002 || { echo "9B server did not start"; tail "$OUT/serve_9b_$tag.log"; }
  echo "9B server ($mode) ready in $((SECONDS - t0)) s"
  "$SALA" bench serve --url http://127.0.0.1:30002 --data "$OUT/speed.jsonl" --quiet \
    --concurrency "$(mode_tiers "$mode")" \
    --out "$OUT/bench_serve_9b_$tag.json" --svg "$OUT/bench_serve_9b_$tag.svg" 2>&1 | tail -8 |
    tee "$OUT/bench_table_$tag.txt"
  # The server's steps by kind per tier (mean ms per step, and inside the forward).
  python3 - "$OUT/bench_serve_9b_$tag.json" <<'PY' | tee -a "$OUT/bench_table_$tag.txt"
import json, sys
for t in json.load(open(sys.argv[1]))["tiers"]:
    es = t.get("engine_steps") or {}
    print(t["label"], "engine steps:", ", ".join(
        f"{k} {v['steps']} x {1e3 * v['seconds'] / v['steps']:.2f} ms "
        f"(forward {1e3 * v['forward_seconds'] / v['steps']:.2f})"
        for k, v in es.items() if v["steps"] > 0) or "not reported")
PY
  kill $pid; wait $pid 2>/dev/null
done

fi
echo
echo "================ GPU serving check ================"
echo "ops/golden: $ops"
for mode in $SERVE_MODES; do
  tag=${mode//[:,]/_}
  echo "---- $mode"
  echo "tiny-chat on cuda ($mode): ${tiny[$mode]}"
  if [ -e "$OUT/bench_table_$tag.txt" ]; then cat "$OUT/bench_table_$tag.txt"; fi
done
