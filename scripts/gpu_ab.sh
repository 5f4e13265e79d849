#!/usr/bin/env bash
# A/B of whole builds of several commits in ONE GPU command (kernel variants of issue 18: the
# same machine, the same checkpoint, one table). Two halves:
#
#   scripts/gpu_ab.sh pack NAME=REV [NAME=REV ...]   (here, where the C++ packages are)
#       builds `sala` and the op-test binaries AB_TEST_BIN of each REV in a worktree
#       /tmp/sala_ab/NAME (CUDA on, Ninja, ccache keyed on paths relative to the tree, so a
#       worktree reuses main's objects), and packs them in .gpu/ab.tar.xz: NAME/bin/ per build,
#       one shared lib/ (scripts/gpu_check.sh libs), solid xz so that the near-identical
#       binaries cost little (the device tool carries ≤ 64 MiB with the tree: ≈ 4 builds).
#   scripts/gpu_ab.sh run                             (GPU machine; carry [".gpu"])
#       unpacks .gpu/ab.tar.xz; makes the full-size random checkpoint once ($MODEL_DIR); then
#       per build, in the order packed: each AB_TEST_BIN --gtest_filter=AB_TESTS under `timeout
#       AB_TEST_TIMEOUT` (a build that fails or hangs, e.g. a ring-protocol deadlock, gets no
#       bench), and `sala bench offline --long-prefill AB_LENGTHS --profile-ops 1024` for each
#       KV format of AB_KV; last, one table: build × KV × length → stage 1 ("sparse select"),
#       stage 2 ("sparse attention"), lightning ("lightning chunked") GPU ms and the prefill's
#       seconds, then build × KV × batch → decode ms per step. Logs under $OUT.
#
# Settings (environment): AB_TESTS (default: the sparse and selection tests), AB_TEST_BIN
# (test_cuda_sparse; a space-separated list runs AB_TESTS in each, e.g. "test_cuda_sparse
# test_cuda_ops": a filter that matches nothing in a binary runs nothing there), AB_TEST_TIMEOUT (150 s), AB_LENGTHS (32768,131072), AB_KV (formats benched per build, default
# "bf16": bf16 = bf16 weights and KV cache, fp8_e4m3 = bf16 weights + FP8 KV, fp8w = FP8
# weights + FP8 KV, issue 18's FP8 rows, w4 = W4A16 RTN at load), AB_DECODE (the bench's decode
# options, default "--decode-batches 1 --decode-input 128 --decode-output 4"; e.g. issue 20's
# "--decode-batches 1,8,64 --decode-input 4096 --decode-output 128"), AB_LENGTHS empty: no
# long prefill (decode only), AB_BENCH_TIMEOUT (150 s per bench), MODEL_DIR
# (/tmp/sala_random_9b), OUT (/tmp/gpu_ab_out), AB_DEVICE (cuda; cpu with
# MODEL_DIR=models/sala-tiny-chat and short AB_LENGTHS is a dry run of the script),
# AB_NCU_TESTS (a gtest filter: also run those tests of each build under ncu's sections
# AB_NCU_SECTIONS (default "SpeedOfLight ComputeWorkloadAnalysis"; e.g. add WarpStateStats
# SchedulerStats), clocks left alone, kernels matching AB_NCU_KERNELS (a
# regex; default "select_|sparse_attn|gla_"), more ncu options AB_NCU_ARGS (e.g. "--launch-skip
# 770 --launch-count 1": one launch of a test that launches the kernel many times), CSV to
# $OUT/ncu_BUILD.csv; empty: no ncu),
# AB_PACK (the pack file, default .gpu/ab.tar.xz: another name keeps two packs at once),
# AB_BUILDS (a space-separated subset of the packed builds to run, in the packed order; default
# all), AB_BENCH_EXTRA (more `bench offline` options, e.g. "--long-decode-contexts 131072
# --long-decode-batches 1,8"), AB_BENCH_ON_FAIL=1 (bench a build whose tests failed, not one
# that hung: when several changes share a build, one failing test need not lose the others'
# numbers), AB_TESTS_IN (pack: the builds that get the AB_TEST_BIN binaries, default all; the
# others ship `sala` alone, for benches, and run no tests: the device tool carries ≤ 64 MiB).
# The golden cases the tests read (CudaOps.GraphReplay*) come from this tree
# (SALA_GOLDEN_DIR), not the path each build was compiled in.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
AB_TESTS=${AB_TESTS:-"CudaOps.Sparse*:CudaKvFp8.Sparse*:CudaFused.Sparse*:CudaInfllmSelect.*"}
AB_TEST_BIN=${AB_TEST_BIN:-test_cuda_sparse}
AB_TEST_TIMEOUT=${AB_TEST_TIMEOUT:-150}
AB_LENGTHS=${AB_LENGTHS-32768,131072}  # set and empty: no long prefill
AB_KV=${AB_KV:-bf16}
AB_BENCH_TIMEOUT=${AB_BENCH_TIMEOUT:-150}
AB_DEVICE=${AB_DEVICE:-cuda}
AB_NCU_TESTS=${AB_NCU_TESTS:-}
AB_BENCH_EXTRA=${AB_BENCH_EXTRA:-}
AB_DECODE=${AB_DECODE:-"--decode-batches 1 --decode-input 128 --decode-output 4"}
AB_NCU_SECTIONS=${AB_NCU_SECTIONS:-"SpeedOfLight ComputeWorkloadAnalysis"}
AB_NCU_KERNELS=${AB_NCU_KERNELS:-"select_|sparse_attn|gla_"}
AB_NCU_ARGS=${AB_NCU_ARGS:-}
MODEL_DIR=${MODEL_DIR:-/tmp/sala_random_9b}
OUT=${OUT:-/tmp/gpu_ab_out}
PACK=${AB_PACK:-$ROOT/.gpu/ab.tar.xz}

pack() {
  [ $# -gt 0 ] || { echo "usage: $0 pack NAME=REV [NAME=REV ...]" >&2; exit 2; }
  local stage=/tmp/sala_ab/pack spec name rev tree t names=()
  rm -rf "$stage" && mkdir -p "$stage/lib"
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/sala-ccache}" CCACHE_NOHASHDIR=1
  export PATH="/usr/local/cuda/bin:$PATH"
  for spec in "$@"; do
    name=${spec%%=*} rev=${spec#*=}
    case "$name" in ""|*[!A-Za-z0-9_-]*|"$spec") echo "bad NAME=REV: $spec" >&2; exit 2 ;; esac
    tree=/tmp/sala_ab/$name
    local bins=$AB_TEST_BIN
    case " ${AB_TESTS_IN:-$name} " in *" $name "*) ;; *) bins="" ;; esac
    git -C "$ROOT" worktree remove --force "$tree" 2>/dev/null
    rm -rf "$tree"
    git -C "$ROOT" worktree add --detach "$tree" "$rev" >/dev/null || exit 1
    echo "== $name: $(git -C "$tree" log --oneline -1 | cut -c1-90)"
    # shellcheck disable=SC2086  # bins: a list of targets
    (cd "$tree" && CCACHE_BASEDIR=$tree cmake -S . -B build-cuda -G Ninja -DSALA_CUDA=ON \
      -DCMAKE_BUILD_TYPE=Release >"$tree/cmake.log" 2>&1 &&
      CCACHE_BASEDIR=$tree ninja -C build-cuda sala $bins >"$tree/build.log" 2>&1) ||
      { echo "$name: build failed (see $tree/build.log)" >&2; exit 1; }
    mkdir -p "$stage/$name/bin"
    cp "$tree/build-cuda/src/cli/sala" "$stage/$name/bin/"
    for t in $bins; do cp "$tree/build-cuda/tests/ops/$t" "$stage/$name/bin/"; done
    git -C "$tree" log --oneline -1 >"$stage/$name/commit"
    names+=("$name")
  done
  bash "$ROOT/scripts/gpu_check.sh" libs "$stage/lib" "$stage"/*/bin/*
  strip "$stage"/*/bin/*
  printf '%s\n' "${names[@]}" >"$stage/order"
  mkdir -p "$ROOT/.gpu"
  tar -C "$stage" -cf - order lib "${names[@]}" | xz -9e -T2 >"$PACK"
  ls -la "$PACK"
}

# table FILE...: "build kv length stage1_ms stage2_ms prefill_s" rows from bench logs named
# bench_BUILD.KV.txt (the op table of each "prefill N" section, then its "prefill B=1 L=N" row).
table() {
  local f b kv
  printf '%-12s %-10s %9s %12s %12s %12s %10s\n' build kv length "stage 1 ms" "stage 2 ms" \
    "lightning ms" prefill
  for f in "$@"; do
    b=$(basename "$f" .txt) && b=${b#bench_} && kv=${b#*.} && b=${b%%.*}
    awk -v b="$b" -v kv="$kv" '
      /\[optime\] prefill [0-9]+:/ { n = $3; sub(":", "", n); cur = n }
      /\[optime\] sparse select/ && cur != "" { s1[cur] = $4 }
      /\[optime\] sparse attention/ && cur != "" { s2[cur] = $4 }
      /\[optime\] lightning chunked/ && cur != "" { lt[cur] = $4 }
      /^prefill B=1 +L=/ { l = $3; sub("L=", "", l);
        printf "%-12s %-10s %9s %12s %12s %12s %9s s\n", b, kv, l, (l in s1 ? s1[l] : "-"),
               (l in s2 ? s2[l] : "-"), (l in lt ? lt[l] : "-"), $4 }' "$f"
  done
  printf '\n%-12s %-10s %6s %12s %10s\n' build kv batch "ms / step" "of floor"
  for f in "$@"; do
    b=$(basename "$f" .txt) && b=${b#bench_} && kv=${b#*.} && b=${b%%.*}
    awk -v b="$b" -v kv="$kv" '/^decode +B=[0-9]+ +[0-9.]+ ms\/step/ { n = $2; sub("B=", "", n);
      printf "%-12s %-10s %6s %12s %10s\n", b, kv, n, $3, $(NF - 2) }' "$f"
  done
}

# $OUT/00_logs.tar.gz: every log so far, refreshed after each test run and bench (the device
# tool brings back only the first few files of $OUT by name, and nothing a killed command had
# not written yet).
# (Written beside $OUT first: a file appearing in the directory tar reads fails the tar.)
bundle() {
  tar -czf "$OUT.logs.tmp" -C "$OUT" --exclude=00_logs.tar.gz . 2>/dev/null &&
    mv "$OUT.logs.tmp" "$OUT/00_logs.tar.gz"
}

run() {
  mkdir -p "$OUT"
  [ -e "$PACK" ] || { echo "no $PACK: run '$0 pack' where the build is" >&2; exit 1; }
  local dir=/tmp/sala_ab_run b rc kv x logs=() cl="" d f t
  rm -rf "$dir" && mkdir -p "$dir" && tar -C "$dir" -xJf "$PACK" || exit 1
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublasLt.so.13" ] && cl="$cl:$d"
  done
  if [ -z "$cl" ] && [ "$AB_DEVICE" = cuda ]; then
    f=$(find / -xdev -name 'libcublasLt.so.13*' 2>/dev/null | head -1) && cl=":$(dirname "$f")"
    f=$(find / -xdev -name 'libcudart.so.13*' 2>/dev/null | head -1) && cl="$cl:$(dirname "$f")"
  fi
  export LD_LIBRARY_PATH="$dir/lib$cl:${LD_LIBRARY_PATH:-}"
  local first
  first=$(head -1 "$dir/order")
  [ -e "$MODEL_DIR/config.json" ] ||
    "$dir/$first/bin/sala" make-random --like-config "$ROOT/configs/minicpm-sala-9b.json" \
      --out "$MODEL_DIR" 2>&1 | tail -1
  while read -r b; do
    case " ${AB_BUILDS:-$b} " in *" $b "*) ;; *) continue ;; esac
    echo "== $b: $(cut -c1-100 "$dir/$b/commit")"
    rc=0
    : >"$OUT/tests_$b.txt"
    for t in $AB_TEST_BIN; do
      if [ ! -e "$dir/$b/bin/$t" ]; then
        echo "$t: not packed for $b (AB_TESTS_IN)" >>"$OUT/tests_$b.txt"
        continue
      fi
      SALA_GOLDEN_DIR="$ROOT/tests/fixtures/golden" timeout "$AB_TEST_TIMEOUT" "$dir/$b/bin/$t" \
        --gtest_filter="$AB_TESTS" >>"$OUT/tests_$b.txt" 2>&1 || rc=$?
    done
    echo "tests rc=$rc: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tests_$b.txt" | tr '\n' ' ')"
    bundle
    grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/tests_$b.txt" | head -5
    grep -E '^\[ (select|gla tc) \]' "$OUT/tests_$b.txt" | head -12
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "${AB_BENCH_ON_FAIL:-0}" = 1 ]; then
      echo "$b: tests failed (rc=$rc); benched anyway (AB_BENCH_ON_FAIL=1)"
    elif [ "$rc" != 0 ]; then
      echo "$b: no bench (tests rc=$rc; 124 = timed out)"; continue
    fi
    if [ -n "$AB_NCU_TESTS" ]; then
      : >"$OUT/ncu_$b.csv"
      for t in $AB_TEST_BIN; do
        # shellcheck disable=SC2046,SC2086  # one --section per name
        timeout "$AB_TEST_TIMEOUT" ncu --clock-control none --csv \
          $(printf -- '--section %s ' $AB_NCU_SECTIONS) --kernel-name-base demangled \
          --kernel-name "regex:$AB_NCU_KERNELS" $AB_NCU_ARGS \
          "$dir/$b/bin/$t" --gtest_filter="$AB_NCU_TESTS" >>"$OUT/ncu_$b.csv" 2>&1
      done
      echo "ncu: $(grep -c '"Duration"' "$OUT/ncu_$b.csv") kernels profiled"
    fi
    for kv in $AB_KV; do
      case "$kv" in
        bf16) x="" ;;
        fp8w) x="--quantization fp8 --kv-cache-dtype fp8_e4m3" ;;
        w4) x="--quantization w4a16" ;;
        *) x="--kv-cache-dtype $kv" ;;
      esac
      [ -n "$AB_LENGTHS" ] && x="$x --long-prefill $AB_LENGTHS"
      # shellcheck disable=SC2086  # x, AB_DECODE, AB_BENCH_EXTRA: option lists
      timeout "$AB_BENCH_TIMEOUT" "$dir/$b/bin/sala" bench offline --model-path "$MODEL_DIR" \
        --device "$AB_DEVICE" $AB_DECODE --prefill-batches 1 --prefill-input 256 \
        --profile-ops 1024 $x $AB_BENCH_EXTRA >"$OUT/bench_$b.$kv.txt" 2>&1
      echo "bench $kv rc=$?"
      bundle
      logs+=("$OUT/bench_$b.$kv.txt")
    done
  done <"$dir/order"
  echo
  [ ${#logs[@]} -gt 0 ] && table "${logs[@]}"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) run ;;
  table) shift; table "$@" ;;
  *) echo "usage: $0 pack NAME=REV...|run|table BENCH_LOG..." >&2; exit 2 ;;
esac
