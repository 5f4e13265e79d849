#!/usr/bin/env bash
# Runs each libFuzzer harness of tests/fuzz for a bounded time on its seed corpus
# (tests/fuzz/corpus/<name>/, read only: new inputs go to BUILD/fuzz-corpus/<name>/).
#
#   scripts/fuzz.sh [BUILD_DIR] [SECONDS_EACH] [NAME...]     defaults: build-fuzz 45, all
#
# BUILD_DIR must be configured with -DSALA_FUZZ=ON and clang (.ci/run does it). A finding
# (crash, sanitizer report, timeout, unexpected exception: tests/fuzz/fuzz_common.h) stops
# that fuzzer; its input is saved as BUILD/fuzz-artifacts/<name>-crash-* and the script
# exits 1 after running the rest. Reproduce with: BUILD/tests/fuzz/<name> <that file>.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-fuzz}
secs=${2:-45}
shift $(( $# > 2 ? 2 : $# ))
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(fuzz_protocol fuzz_tokenizer fuzz_chat_template fuzz_config fuzz_safetensors)
# A leak is reported at exit only; halt_on_error keeps UBSan fatal as in the build flags.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
for n in "${names[@]}"; do
  bin="$build/tests/fuzz/$n"
  [ -x "$bin" ] || { echo "fuzz.sh: $bin not built (ninja -C $build fuzz)" >&2; failed+=("$n"); continue; }
  work="$build/fuzz-corpus/$n" art="$build/fuzz-artifacts"
  mkdir -p "$work" "$art"
  t0=$(date +%s)
  # -timeout: one input taking 10 s is a finding (a request must not hold a thread that long);
  # -rss_limit_mb: one input needing 2 GB is a finding too; -max_len bounds the input size.
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
      -print_final_stats=1 -artifact_prefix="$art/$n-" "$work" "tests/fuzz/corpus/$n" \
      >"$build/fuzz-$n.log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz-$n.log" | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$build/fuzz-$n.log" | tail -1)
  echo "fuzz $n: rc=$rc, ${runs:-?} inputs, $cov, $(( $(date +%s) - t0 )) s"
  if [ $rc -ne 0 ]; then
    failed+=("$n")
    grep -E 'ERROR|FUZZ FINDING|runtime error|Test unit written' "$build/fuzz-$n.log" | head -5
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]} (logs: $build/fuzz-<name>.log)"
  exit 1
fi
