#!/usr/bin/env bash
# The GPU check: one command per mode, a machine-readable summary and a short table last.
#
#   scripts/gpu_check.sh build        configure + build $BUILD (CUDA on, Ninja; sm_90a + sm_80
#                                     code from src/backend/cuda/CMakeLists.txt): sala and the
#                                     op tests of OP_TESTS. Where the C++ packages are (here).
#   scripts/gpu_check.sh pack         build, then pack the stripped binaries and their
#                                     non-system shared libraries into .gpu/pack.tar.xz (~15 MB;
#                                     .gpu/ is git-ignored and travels with `carry`), with the
#                                     commit they were built from. Nothing can be fetched on
#                                     the GPU machine, so build where the C++ packages are.
#                                     Only .gpu/pack.tar.xz is replaced. A/B of two builds in
#                                     one command: pack one, move it to .gpu/b.tar.xz, pack the
#                                     other, then run a mode twice, the second time with
#                                     PACK=$PWD/.gpu/b.tar.xz.
#   scripts/gpu_check.sh correctness  (GPU machine) every check below; exit 1 if any
#                                     fails:
#       op tests     every binary of OP_TESTS, --gtest_output=json (CUDA vs CPU, both modes);
#                    test_cuda_ops' CudaTp.* in a run of their own (as `tp` runs them)
#       graph==eager the GraphReplayMatchesEager* tests of test_cuda_ops (their gtest JSON)
#       golden       `sala golden CASE --device cuda --mode bf16|fp32` for every CASE under
#                    $GOLDEN_ROOT holding a cases.json
#       batch==alone scripts/batch_equality_check.py on models/sala-tiny-chat, $DEVICE
#   scripts/gpu_check.sh sanitize     (GPU machine) compute-sanitizer memcheck and racecheck
#                                     over the small-shape op tests (SAN_FILTER_OPS /
#                                     SAN_FILTER_SPARSE; each run cut at SAN_TIMEOUT s); exit 1
#                                     if any fails. Its own command: correctness alone takes
#                                     ~530 s on an H100.
#   scripts/gpu_check.sh bench        (GPU machine) `sala bench offline --json` on a full-size
#                                     random checkpoint (`sala make-random`, 18 GB, made once in
#                                     $MODEL_DIR): decode B=1/8/64 with 128-token prompts,
#                                     prefill 4K at B=1/4
#   scripts/gpu_check.sh long         bench with the long-context rows (32K/128K/512K prefill,
#                                     decode at 32K/128K) and the short ones (~4 min)
#   scripts/gpu_check.sh decode4k     bench: decode B=1/8/64 at a 4K context, prefill 4K
#   scripts/gpu_check.sh grammar      bench: decode B=1/8/64, each run again with every sequence
#                                     under tests/model/bench_grammar_schema.json (issue 19:
#                                     the grammar step <= 1.05x the plain step at B=8)
#   scripts/gpu_check.sh fp8          (GPU machine) FP8 fidelity, `sala fidelity` teacher-forced:
#                                     GPU FP8 vs the CPU FP8 oracle and GPU FP8 vs GPU bf16 on
#                                     the full-size random checkpoint (FP8_SEQS x FP8_LEN
#                                     positions), and the same two on sala-tiny-chat and the
#                                     golden cases' models
#   scripts/gpu_check.sh kv8          (GPU machine) FP8 KV cache fidelity, `sala fidelity`:
#                                     GPU vs CPU oracle, both with an FP8 e4m3 KV cache, and
#                                     GPU bf16 KV vs GPU FP8 KV, on the full-size random
#                                     checkpoint and (also with --dense-as-sparse, so every
#                                     sparse layer selects) on sala-tiny-chat and the golden
#                                     cases' models
#   scripts/gpu_check.sh kv8-bench    (GPU machine) bench decode4k, then the long prefill rows,
#                                     each with the bf16 KV cache and with FP8 e4m3 KV
#                                     (KV8_BENCH overrides which: decode4k, long or both)
#   scripts/gpu_check.sh w4           (GPU machine) W4A16 fidelity (issue 22), as fp8 with
#                                     :w4 specs (RTN at load, group 128): cuda:bf16:w4 vs the
#                                     CPU oracle cpu:bf16:w4, and vs cuda:bf16. W4 speed:
#                                     BENCH_ARGS="<decode4k's> --quantization w4a16" decode4k
#                                     FP8 speed: BENCH_ARGS="<decode4k's> --quantization fp8"
#                                     decode4k
#   scripts/gpu_check.sh mixed        (GPU machine) the server's mixed steps (issue 18's S8): a
#                                     128K prefill in chunks of 2,048 alone, then again with 7
#                                     sequences of 32K tokens decoding beside it (one row each
#                                     per chunk step), each with its op table (MIXED_BESIDE
#                                     overrides the 7; BENCH_ARGS appends, e.g. --quantization)
#   scripts/gpu_check.sh spec         (GPU machine) speculative decoding (issue 21):
#                                     scripts/spec_equality_check.py on sala-tiny-chat (every
#                                     completion with and without NGRAM, then STANDALONE with a
#                                     noisy copy of the model as the draft, accept lengths and
#                                     tokens/s by task kind at concurrency 1 and 8), then the
#                                     verify step vs the decode step (K = 1, 4; B = 1/8/64, 4K
#                                     context) in bf16 and FP8 on the full-size checkpoint
#   scripts/gpu_check.sh tp           (GPU machine) tensor parallelism (issue 24): the CudaTp.*
#                                     op tests (the peer collectives; TP=2 on one GPU vs TP=1,
#                                     recorded == direct; with two GPUs NCCL vs the peer group,
#                                     bit for bit; `correctness` leaves them out); with two
#                                     GPUs (kind nvidia-h200-x2) also tiny-chat's greedy answers with
#                                     --tp-size 2 vs 1 (tests/e2e/tiny_chat_tp.py, cuda) and the
#                                     bench at TP=1 and TP=2: decode B=1/8/64 at 4K, prefill 4K
#                                     and 128K. NCCL: libnccl.so.2 from the nvidia-nccl wheel.
#   scripts/gpu_check.sh ncu-decode   ncu kernel times of the InfLLM-v2 decode path at 128K
#   scripts/gpu_check.sh ncu-prefill  ncu of late prefill chunks of a long prompt (stage 1,
#                                     stage 2, the lightning chunk kernels): time, throughputs,
#                                     pipes and warp stall reasons per kernel (issue 18)
#   scripts/gpu_check.sh ktrace       kernel timelines of decode steps (4K context, B = 1 and 8,
#                                     graphs on) through the CUPTI tracer scripts/ktrace: what
#                                     each kernel adds to a step's span, PDL overlap included
#                                     (KTRACE_ARGS appends bench flags, e.g. --quantization fp8
#                                     --kv-cache-dtype fp8_e4m3; KTRACE_BATCHES replaces 1,8,
#                                     e.g. 64)
#   scripts/gpu_check.sh exec CMD...  CMD with the binaries' directory in $SALA_GPU_DIR and
#                                     their libraries on LD_LIBRARY_PATH (profiler runs)
#   scripts/gpu_check.sh libs DEST BIN...  copy the non-system shared libraries of BIN... into
#                                     DEST (what `pack` ships; scripts/gpu_ab.sh packs with it)
#   scripts/gpu_check.sh table [FILE] print the table of a summary written before
#   scripts/gpu_check.sh markdown [FILE]  its bench rows as docs/PERF.md table rows
#
# Every mode but build/pack/exec/libs/table/markdown writes $OUT/summary.json (OUT defaults to
# /tmp/gpu_check_out; SUMMARY overrides the path): {mode, commit, date, machine, passed,
# checks: [{name, kind, passed, rc, seconds, details}]} (scripts/gpu_summary.py), logs beside it.
# Binaries: the unpacked .gpu/pack.tar.xz when present, else $BUILD's. DEVICE=cpu runs the
# golden, batch==alone and bench checks on the CPU backend (a dry run of the script on a
# machine without a GPU; the op tests and the sanitizer then fail as not built / not found).
# Each mode fits the device tool's 10 minutes per command on an H200; run them separately.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-cuda}
GOLDEN_ROOT=${GOLDEN_ROOT:-$ROOT/tests/fixtures/golden}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/gpu_check_out}
SUMMARY=${SUMMARY:-$OUT/summary.json}
MODEL_DIR=${MODEL_DIR:-/tmp/sala_random_9b}
OP_TESTS=${OP_TESTS:-"test_cuda_ops test_cuda_sparse test_cuda_f32"}
# Small shapes only: the sanitizers run kernels 10-100x slower. Not the *Long, speed, graph or
# head-128 lightning tests (the same kernels at larger shapes); head 64 runs the bf16 chunk
# kernel with 4 warps exchanging P, V and partial outputs through shared memory (racecheck).
SAN_FILTER_OPS=${SAN_FILTER_OPS:-"CudaOps.Embedding:CudaOps.RmsNorm:CudaOps.AddScaledRmsNorm:\
CudaOps.Elementwise:CudaOps.RopeAndGather:CudaOps.LightningTiny:CudaOps.LightningHead64:\
CudaOps.SplitRmsNormMulSigmoid:\
CudaOps.LinearMulti:\
CudaOps.LinearSiluMul:CudaOps.WideDecodeSteps:CudaOps.QkNormRope:\
CudaFused.RmsNormMulSigmoid:CudaFused.LightningQkAttentionHead16:CudaSample.SameDrawSmall:CudaLogprobs.Small"}
SAN_FILTER_SPARSE=${SAN_FILTER_SPARSE:-"CudaOps.SparseLayerInfLLMv2:CudaOps.SparseLayerDenseAsSparse"}
SAN_TIMEOUT=${SAN_TIMEOUT:-120}  # racecheck of SAN_FILTER_OPS: 65 s on the H200 (CudaSample.SameDrawSmall 33 s)
SUM="python3 $ROOT/scripts/gpu_summary.py"
BIN=""     # directory of sala and the op tests
PACK=${PACK:-$ROOT/.gpu/pack.tar.xz}  # another pack (PACK=.gpu/b.tar.xz): A/B of two builds in one command

build() {
  set -e
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DSALA_CUDA=ON
  # shellcheck disable=SC2086  # OP_TESTS is a list
  ninja -C "$BUILD" sala $OP_TESTS
  set +e
}

# copy_libs DEST BIN...: every shared library the binaries need except glibc's own and the
# CUDA driver/toolkit ones (the GPU machine has CUDA 13 and its driver), into DEST.
copy_libs() {
  local dest=$1 b lib
  shift
  for b in "$@"; do
    ldd "$b" | awk '/=> \// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*|libcuda.so*|libcudart.so*|libcublas*) ;;
      *) cp -L "$lib" "$dest/" ;;
    esac
  done
}

pack() {
  build
  set -e
  # Staged outside .gpu/, which may hold other packs and notes (only pack.tar.xz is replaced;
  # what travels is all of .gpu/: carry at most 64 MiB with the tree).
  local g=$ROOT/.gpu st
  st=$(mktemp -d)
  mkdir -p "$g" "$st/bin" "$st/lib"
  cp "$BUILD/src/cli/sala" "$st/bin/"
  for t in $OP_TESTS; do cp "$BUILD/tests/ops/$t" "$st/bin/"; done
  copy_libs "$st/lib" "$st"/bin/*
  # The kernel tracer (ktrace mode) and the CUPTI it was linked with, side by side.
  if [ -e "$BUILD/scripts/ktrace/libsala_ktrace.so" ]; then
    cp "$BUILD/scripts/ktrace/libsala_ktrace.so" "$st/lib/"
    copy_libs "$st/lib" "$BUILD/scripts/ktrace/libsala_ktrace.so"
  fi
  strip "$st"/bin/*
  commit_stamp >"$st/commit"
  # xz's largest preset with a dictionary that spans the four binaries (they share most of
  # their code): ~15 MB instead of tar -J's ~26, which with the tree overran carry's 64 MiB.
  tar -C "$st" -cf - bin lib commit | xz -T2 --lzma2=preset=9,dict=512MiB >"$g/pack.tar.xz"
  rm -rf "$st"
  du -sh "$g"/*
  set +e
}

# The commit the binaries come from: the pack's stamp when packed binaries run, else git.
commit_stamp() {
  if [ -n "${COMMIT:-}" ]; then
    echo "$COMMIT"
  elif [ -n "$BIN" ] && [ -e "$BIN/../commit" ]; then  # packed binaries: the commit they were built from
    cat "$BIN/../commit"
  elif git -C "$ROOT" rev-parse --short HEAD >/dev/null 2>&1; then
    local c
    c=$(git -C "$ROOT" rev-parse --short HEAD)
    git -C "$ROOT" diff --quiet HEAD -- src tests CMakeLists.txt 2>/dev/null || c="$c+dirty"
    echo "$c"
  else
    echo unknown
  fi
}

machine() {
  local m
  m=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  echo "${m:-$(uname -n) (no nvidia-smi), device $DEVICE}"
}

setup() {
  mkdir -p "$OUT"
  : >"$OUT/checks.jsonl"
  if [ -e "$PACK" ]; then
    rm -rf /tmp/sala_gpu && mkdir -p /tmp/sala_gpu && tar -C /tmp/sala_gpu -xJf "$PACK"
    BIN=/tmp/sala_gpu/bin
    LIBS=/tmp/sala_gpu/lib
  else
    # Not packed: $BUILD's binaries, side by side in one directory of links.
    BIN=$OUT/bin
    LIBS=""
    mkdir -p "$BIN"
    ln -sf "$BUILD/src/cli/sala" "$BIN/sala"
    for t in $OP_TESTS; do ln -sf "$BUILD/tests/ops/$t" "$BIN/$t"; done
  fi
  # cuBLASLt / cudart of the machine's CUDA 13 (toolkit or the pip wheels PyTorch uses).
  local cuda_libs="" d f
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublasLt.so.13" ] && cuda_libs="$cuda_libs:$d"
  done
  if [ -z "$cuda_libs" ] && [ "$DEVICE" = cuda ]; then
    f=$(find / -xdev -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
    [ -n "$f" ] && cuda_libs=":$(dirname "$f")"
    f=$(find / -xdev -name 'libcudart.so.13*' 2>/dev/null | head -1)
    [ -n "$f" ] && cuda_libs="$cuda_libs:$(dirname "$f")"
  fi
  export LD_LIBRARY_PATH="$LIBS$cuda_libs:${LD_LIBRARY_PATH:-}"
  [ "$DEVICE" = cuda ] && export SALA_REQUIRE_GPU=1
  export SALA_GOLDEN_DIR=$GOLDEN_ROOT  # tiny-dense / tiny-sparse for graph == eager
  # NCCL for --tp-size over GPUs (loaded at run time): the pip wheel PyTorch uses. NVLink
  # multicast stays off (the machines' rule; cuda_comm_nccl.cpp also keeps it off).
  local nccl
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))'     2>/dev/null)
  [ -n "$nccl" ] && [ -e "$nccl/libnccl.so.2" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl"
  export NCCL_NVLS_ENABLE=0
  echo "machine: $(machine); commit: $(commit_stamp); binaries: $BIN"
  if ldd "$BIN/sala" 2>&1 | grep -i "not found"; then echo "MISSING LIBRARIES"; fi
}

finish() {
  local rc
  $SUM finish "$OUT/checks.jsonl" "$SUMMARY" --mode "$1" --commit "$(commit_stamp)" \
    --machine "$(machine)"
  rc=$?
  bundle
  return $rc
}

# run_logged LOG CMD...: CMD's output to the terminal and LOG; sets RC and SECS.
run_logged() {
  local log=$1 t0=$SECONDS
  shift
  "$@" >"$log" 2>&1
  RC=$?
  SECS=$((SECONDS - t0))
  tail -n 4 "$log"
  bundle
}

# $OUT/00_logs.tar.gz: every file of $OUT so far (the device tool brings back only the first
# few files by name, and nothing that a command cut at its time limit had not written yet).
# (Written beside $OUT first: a file appearing in the directory tar reads fails the tar.)
bundle() {
  tar -czf "$OUT.logs.tmp" -C "$OUT" --exclude=00_logs.tar.gz . 2>/dev/null &&
    mv "$OUT.logs.tmp" "$OUT/00_logs.tar.gz"
}

correctness() {
  setup
  local t c mode
  for t in $OP_TESTS; do
    echo "== $t"
    # Tensor parallelism's tests run in their own mode (`tp`): a collective that never meets
    # its peer traps and would end the binary with the tests after it unrun.
    run_logged "$OUT/$t.log" "$BIN/$t" --gtest_output="json:$OUT/$t.json" \
      --gtest_filter='-CudaTp.*'
    $SUM gtest "$OUT/checks.jsonl" "op tests $t" "$OUT/$t.json" "$RC" "$SECS"
    if [ "$t" = test_cuda_ops ]; then
      $SUM gtest "$OUT/checks.jsonl" "graph == eager" "$OUT/$t.json" "$RC" 0 \
        --only 'CudaOps.GraphReplayMatchesEager*'
      # ... and then in a run of their own, so that a trapped collective ends only that run.
      echo "== $t CudaTp.*"
      tp_op_tests
    fi
  done
  local cases=()
  for c in "$GOLDEN_ROOT"/*/cases.json; do [ -e "$c" ] && cases+=("$(dirname "$c")"); done
  if [ ${#cases[@]} = 0 ]; then
    echo "no golden case (*/cases.json) under GOLDEN_ROOT=$GOLDEN_ROOT" >"$OUT/golden.log"
    $SUM lines "$OUT/checks.jsonl" "golden (no cases)" "$OUT/golden.log" 1 0 "golden"
  fi
  for mode in bf16 fp32; do
    for c in "${cases[@]}"; do
      echo "== golden $(basename "$c") $mode"
      run_logged "$OUT/golden_$(basename "$c")_$mode.log" \
        "$BIN/sala" golden "$c" --device "$DEVICE" --mode "$mode"
      $SUM golden "$OUT/checks.jsonl" "golden $(basename "$c") $mode" \
        "$OUT/golden_$(basename "$c")_$mode.log" "$RC" "$SECS"
    done
  done
  echo "== batch == alone"
  run_logged "$OUT/batch_equality.log" \
    python3 "$ROOT/scripts/batch_equality_check.py" "$BIN/sala" "$ROOT/models/sala-tiny-chat" "$DEVICE"
  $SUM lines "$OUT/checks.jsonl" "batch == alone" "$OUT/batch_equality.log" "$RC" "$SECS" \
    "outputs equal to alone|differs"
  finish correctness
}

# The sanitizers over the small-shape op tests: a mode of their own, because `correctness`
# alone takes ~530 s on an H100 (test_cuda_ops 368 s) of the device tool's 600 s per command.
sanitize() {
  setup
  local t tool filter report
  for tool in memcheck racecheck; do
    for t in test_cuda_ops test_cuda_sparse; do
      filter=$SAN_FILTER_OPS
      [ "$t" = test_cuda_sparse ] && filter=$SAN_FILTER_SPARSE
      echo "== compute-sanitizer $tool $t"
      # racecheck: every hazard with its two accesses, none left out, no backtraces
      # (gpu_summary.py racecheck tells the known ring-slot reports from any other).
      report=""
      [ "$tool" = racecheck ] &&
        report="--racecheck-report hazard --print-limit 0 --show-backtrace no"
      # shellcheck disable=SC2086  # report, SAN_ARGS: option lists, split on purpose
      run_logged "$OUT/san_${tool}_$t.log" timeout "$SAN_TIMEOUT" \
        compute-sanitizer --tool "$tool" --error-exitcode 1 $report ${SAN_ARGS:-} \
        "$BIN/$t" --gtest_filter="$filter"
      [ "$RC" = 124 ] && echo "timed out after $SAN_TIMEOUT s" >>"$OUT/san_${tool}_$t.log"
      if [ "$tool" = racecheck ]; then
        $SUM racecheck "$OUT/checks.jsonl" "$tool $t" "$OUT/san_${tool}_$t.log" "$RC" "$SECS"
      else
        $SUM lines "$OUT/checks.jsonl" "$tool $t" "$OUT/san_${tool}_$t.log" "$RC" "$SECS" \
          "ERROR SUMMARY|Invalid|timed out|PASSED|FAILED|not found|No such file|failed to run"
      fi
    done
  done
  finish sanitize
}

# `sala bench offline` on the full-size random checkpoint; BENCH_ARGS picks the rows.
bench() {
  setup
  local t0=$SECONDS
  if [ ! -e "$MODEL_DIR/model.safetensors.index.json" ] && [ ! -e "$MODEL_DIR/model.safetensors" ]; then
    "$BIN/sala" make-random --like-config "$ROOT/configs/minicpm-sala-9b.json" --out "$MODEL_DIR" \
      2>&1 | tail -3
  fi
  echo "make-random: $((SECONDS - t0)) s"
  # --profile-ops N: GPU time per op of the eager steps of >= N rows (the prefills), one table
  # per long-prefill length and one at exit; decode steps run as CUDA graphs, not timed per op.
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
  run_logged "$OUT/bench.log" \
    "$BIN/sala" bench offline --model-path "$MODEL_DIR" --device "$DEVICE" $BENCH_ARGS \
    --profile-ops "${PROFILE_OPS:-1024}" --json "$OUT/bench.json"
  $SUM bench "$OUT/checks.jsonl" "bench $1" "$OUT/bench.json" "$RC" "$SECS"
  finish "$1"
}

SHORT_BENCH_ARGS="--decode-batches 1,8,64 --decode-input 128 --decode-output 128 \
  --prefill-batches 1,4 --prefill-input 4096"
# Issue 7's rows: chunked prefill of 32K / 128K / 512K prompts and decode at 32K / 128K
# contexts, plus the short decode/prefill rows. About 4 minutes with the model made.
LONG_BENCH_ARGS="--decode-batches 1,8,64 --decode-output 128 --prefill-batches 1,4 \
  --long-prefill 32768,131072,524288 --long-decode-contexts 32768,131072 \
  --long-decode-batches 1,8 --long-decode-steps 64"
# Issue 5's wording: decode at a 4K context (4096-token prompts, 128 steps).
DECODE4K_BENCH_ARGS="--decode-batches 1,8,64 --decode-input 4096 --decode-output 128 \
  --prefill-batches 1 --prefill-input 4096"

# Issue 18's S8 steps: what decode rows add to a prompt chunk's step (bench_mixed.h).
MIXED_BENCH_ARGS="--decode-batches 1 --decode-input 32768 --decode-output 8 --prefill-batches 1 \
  --prefill-input 512 --long-prefill 131072 --long-prefill-beside ${MIXED_BESIDE:-7}"

# Issue 19: the grammar's cost per decode step. The random checkpoint has no tokenizer: the
# grammar's vocabulary is the tiny model's, widened to the 9B vocab_size with token pairs
# (src/cli/bench_grammar.h says why).
GRAMMAR_BENCH_ARGS="--decode-batches 1,8,64 --decode-input 128 --decode-output 128 \
  --prefill-batches 1 --prefill-input 256 --decode-grammar $ROOT/tests/model/bench_grammar_schema.json \
  --grammar-tokenizer $ROOT/models/sala-tiny-chat"

# Fidelity of the quantized modes: FP8 weights (issue 17), W4A16 (issue 22), the FP8 KV cache
# (issue 17). `sala fidelity` prints top-1 agreement, KL, logit cosine and the greedy prefix; a
# run that fails (or prints no agreement line) fails the check. Per model: the GPU against the
# CPU oracle in the same mode (cpu:bf16:TAG vs cuda:bf16:TAG) and GPU bf16 against GPU TAG; the
# CPU side of the 9B comparison is the oracle in bf16 emulation (~3 min on 16 cores).
# quant_fidelity TAG [PAIR...]: TAG the fidelity spec's quantization tag (fp8 | w4 | kv8) and
# the mode's name; PAIRs ("a,b") are added for the small models only.
quant_fidelity() {
  setup
  local t0=$SECONDS m pair a b name pairs q=$1
  shift
  [ -e "$MODEL_DIR/model.safetensors.index.json" ] || [ -e "$MODEL_DIR/model.safetensors" ] ||
    "$BIN/sala" make-random --like-config "$ROOT/configs/minicpm-sala-9b.json" --out "$MODEL_DIR" 2>&1 | tail -1
  echo "make-random: $((SECONDS - t0)) s"
  for m in "$MODEL_DIR" "$ROOT/models/sala-tiny-chat" "$GOLDEN_ROOT"/tiny-*; do
    pairs="cpu:bf16:$q,cuda:bf16:$q cuda:bf16,cuda:bf16:$q"
    [ "$m" = "$MODEL_DIR" ] || pairs="$pairs $*"
    for pair in $pairs; do
      IFS=, read -r a b <<<"$pair"
      name="fidelity $(basename "$m") $a vs $b"
      echo "== $name"
      run_logged "$OUT/fidelity_$(basename "$m")_${a//:/_}_${b//:/_}.log" \
        "$BIN/sala" fidelity --model-path "$m" --config-a "$a" --config-b "$b" \
        --random "${FP8_SEQS:-2}" --length "${FP8_LEN:-160}" --greedy "${FP8_GREEDY:-4}"
      $SUM lines "$OUT/checks.jsonl" "$name" \
        "$OUT/fidelity_$(basename "$m")_${a//:/_}_${b//:/_}.log" "$RC" "$SECS" \
        "top-1 agreement|KL|greedy"
    done
  done
  finish "$q"
}
# The FP8 KV cache's small-model pairs: with --dense-as-sparse every sparse layer selects, in
# e4m3 and e5m2.
KV8_TINY_PAIRS="cpu:bf16:dense-as-sparse:kv8,cuda:bf16:dense-as-sparse:kv8 \
cpu:bf16:dense-as-sparse:kv=fp8_e5m2,cuda:bf16:dense-as-sparse:kv=fp8_e5m2"

# bf16 KV vs FP8 e4m3 KV in one command: decode at a 4K context and the long prefill rows.
KV8_LONG_BENCH_ARGS="--decode-batches 1 --decode-output 16 --prefill-batches 1 \
  --long-prefill 32768,131072,524288 --long-decode-contexts 32768,131072 \
  --long-decode-batches 1,8 --long-decode-steps 64"
kv8_bench() {
  local kv which
  for which in ${KV8_BENCH:-decode4k long}; do
    for kv in auto fp8_e4m3; do
      if [ "$which" = decode4k ]; then
        OUT=$OUT/kv8_${which}_$kv BENCH_ARGS="$DECODE4K_BENCH_ARGS --kv-cache-dtype $kv" \
          bench "$which kv $kv" | grep -E "^(caches|decode|prefill)"
      else
        OUT=$OUT/kv8_${which}_$kv PROFILE_OPS=2048 \
          BENCH_ARGS="$KV8_LONG_BENCH_ARGS --kv-cache-dtype $kv" \
          bench "$which kv $kv" | grep -E "^(caches|decode|prefill|long)"
      fi
    done
  done
}

# test_cuda_ops' CudaTp.* (correctness and tp). Eager module loading: ranks sharing one GPU
# spin in a collective until the other rank's kernel runs, and loading that kernel lazily may
# need a context synchronisation (CUDA's lazy-loading guide: a deadlock between kernels that
# wait for each other).
tp_op_tests() {
  CUDA_MODULE_LOADING=EAGER run_logged "$OUT/tp_ops.log" "$BIN/test_cuda_ops" \
    --gtest_filter='CudaTp.*' --gtest_output="json:$OUT/tp_ops.json"
  $SUM gtest "$OUT/checks.jsonl" "tp op tests" "$OUT/tp_ops.json" "$RC" "$SECS"
}

tp() {
  setup
  tp_op_tests
  cat "$OUT/tp_ops.log"
  local gpus tp
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "${gpus:-0}" -ge 2 ]; then
    run_logged "$OUT/tp_e2e.log" python3 "$ROOT/tests/e2e/tiny_chat_tp.py" "$BIN/sala" \
      "$ROOT/tests/fixtures/eval" "$OUT/tp_e2e" "$DEVICE"
    cat "$OUT/tp_e2e.log"
    $SUM lines "$OUT/checks.jsonl" "tiny-chat TP=2 vs TP=1" "$OUT/tp_e2e.log" "$RC" "$SECS" \
      "accuracy|differs|OK"
    for tp in 1 2; do
      OUT=$OUT/tp$tp BENCH_ARGS="$DECODE4K_BENCH_ARGS --long-prefill 131072 --tp-size $tp" \
        bench "tp $tp" | grep -E "^(decode|prefill|long)"
    done
  else
    echo "one GPU: NCCL, tiny-chat TP=2 and the TP bench not run (kind nvidia-h200-x2)"
  fi
  finish tp
}

spec() {
  setup
  run_logged "$OUT/spec_equality.log" python3 "$ROOT/scripts/spec_equality_check.py" \
    "$BIN/sala" "$ROOT/tests/fixtures/eval/tiny-chat.jsonl" "$OUT/spec_equality.json" \
    --model-path "$ROOT/models/sala-tiny-chat" --device "$DEVICE"
  cat "$OUT/spec_equality.log"
  $SUM lines "$OUT/checks.jsonl" "spec equality tiny-chat" "$OUT/spec_equality.log" "$RC" \
    "$SECS" "differ|tok/s"
  # The same with a draft model sharing the GPU: a noisy copy, so drafts are often rejected.
  python3 "$ROOT/scripts/perturb_checkpoint.py" "$ROOT/models/sala-tiny-chat" "$OUT/draft" \
    --noise 1.0 --seed 0 >/dev/null
  SPEC_DRAFT=$OUT/draft run_logged "$OUT/spec_standalone.log" python3 \
    "$ROOT/scripts/spec_equality_check.py" "$BIN/sala" "$ROOT/tests/fixtures/eval/tiny-chat.jsonl" \
    "$OUT/spec_standalone.json" --model-path "$ROOT/models/sala-tiny-chat" --device "$DEVICE"
  cat "$OUT/spec_standalone.log"
  rm -rf "$OUT/draft"
  $SUM lines "$OUT/checks.jsonl" "spec equality tiny-chat STANDALONE" "$OUT/spec_standalone.log" \
    "$RC" "$SECS" "differ|tok/s"
  local q
  for q in "" "--quantization fp8"; do
    # shellcheck disable=SC2086  # $q is a list of options
    OUT=$OUT/verify${q:+_fp8} BENCH_ARGS="--decode-batches 1,8,64 --decode-input 4096 \
      --decode-output 128 --prefill-batches 1 --prefill-input 4096 --verify-draft-tokens 1,4 $q" \
      bench "verify${q:+ fp8}" | grep -E "^(decode|verify)"
  done
}

# Kernel times of the InfLLM-v2 decode path (issue 7's 128K decode): ncu over a bench with a
# 131072-token context, graphs off, only the sparse-layer kernels; scripts/ncu_summary.py
# prints the mean per kernel over the last 4 decode steps (8 sparse layers × 7 kernels).
# About 2 minutes with the model made. NCU_CONTEXT / NCU_KERNELS override the defaults.
ncu_decode() {
  setup
  local c=${NCU_CONTEXT:-131072}
  [ -e "$MODEL_DIR/model.safetensors.index.json" ] || [ -e "$MODEL_DIR/model.safetensors" ] ||
    "$BIN/sala" make-random --like-config "$ROOT/configs/minicpm-sala-9b.json" --out "$MODEL_DIR" 2>&1 | tail -1
  ncu --metrics gpu__time_duration.sum,launch__grid_size --kernel-name-base demangled \
    -k "regex:${NCU_KERNELS:-select|sparse_attn|combine|append_kv|compress|attention_kernel}" \
    --csv --log-file "$OUT/ncu.csv" "$BIN/sala" bench offline --model-path "$MODEL_DIR" --device cuda --disable-cuda-graph \
    --decode-batches 1 --decode-output 2 --prefill-batches 1 --prefill-input 256 \
    --long-decode-contexts "$c" --long-decode-batches 1 --long-decode-steps 4 2>&1 | grep -E "^decode"
  python3 "$ROOT/scripts/ncu_summary.py" "$OUT/ncu.csv" --last $((4 * 8 * 7))
}

# Where a decode step's time goes (issues 17 / 20 / 22): the CUPTI tracer (scripts/ktrace)
# records every kernel of a `bench offline` decode run (graph replay and PDL as untraced), then
# ktrace_summary.py splits each recorded step's span into idle time and what each kernel
# pushed the step's end by, over the last 16 replays of each recording, with the last
# replay's timeline. The untraced run beside it says what the tracing costs.
ktrace() {
  setup
  local kt=${KTRACE_LIB:-$LIBS/libsala_ktrace.so}
  [ -e "$kt" ] || kt=$BUILD/scripts/ktrace/libsala_ktrace.so
  [ -e "$MODEL_DIR/model.safetensors.index.json" ] || [ -e "$MODEL_DIR/model.safetensors" ] ||
    "$BIN/sala" make-random --like-config "$ROOT/configs/minicpm-sala-9b.json" --out "$MODEL_DIR" 2>&1 | tail -1
  local args="--model-path $MODEL_DIR --device cuda --decode-batches ${KTRACE_BATCHES:-1,8}
    --decode-input 4096 --decode-output 64 --prefill-batches 1 --prefill-input 256
    ${KTRACE_ARGS:-}"
  # shellcheck disable=SC2086  # args is a list
  "$BIN/sala" bench offline $args 2>&1 | grep -E "^decode" | sed 's/^/untraced: /'
  # shellcheck disable=SC2086
  KTRACE_OUT=$OUT/ktrace.csv CUDA_INJECTION64_PATH=$kt "$BIN/sala" bench offline $args 2>&1 |
    grep -E "^decode|ktrace" | sed 's/^/traced:   /'
  python3 "$ROOT/scripts/ktrace/ktrace_summary.py" "$OUT/ktrace.csv" --graph-launches 16 \
    --top 40 --timeline >"$OUT/ktrace.txt"
  grep -E "^graph" "$OUT/ktrace.txt"
}

# What bounds the long prefill's non-GEMM kernels (issue 18; session 13's op profile: stage 2,
# stage 1 and the lightning chunk kernels at 5-12 % of their FLOP floors): ncu over a
# NCU_PREFILL-token prefill (default 131072, chunks of NCU_CHUNK = 2048), only those kernels,
# about two chunks' launches late in the prompt (--launch-skip counts matching launches; the
# bench runs the long prompt alone, --long-only, so its first launches are the prompt's).
# NCU_KV adds --kv-cache-dtype (fp8_e4m3); NCU_REGEX replaces the kernel regex, NCU_COUNT the
# 100 launches, NCU_ARGS appends bench flags (e.g. --quantization fp8). The 4K one-shot step's
# memory-bound kernels: NCU_PREFILL=4096 NCU_CHUNK=4096 NCU_REGEX='silu_mul|rmsnorm|flash|gla_'
# (a chunk count under 8 skips nothing).
# scripts/ncu_summary.py --metrics prints each kernel's mean of every metric.
NCU_PREFILL_METRICS="gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,\
l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,\
smsp__inst_executed.avg.per_cycle_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,\
sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,\
smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio"
ncu_prefill() {
  setup
  # The kernels' launches per chunk vary with the path (stage-1 kernels per sparse layer, one
  # lightning kernel per layer): skip an underestimate of the chunks before the last 8 (8
  # sparse layers x 2 + 24 lightning layers x 1 launches per chunk), then take 100 launches,
  # i.e. ~2 chunks late in the prompt. Kernels in anonymous namespaces are matched by their
  # demangled names (ncu's default base name does not match them).
  local L=${NCU_PREFILL:-131072} c=${NCU_CHUNK:-2048} per=$((8 * 2 + 24)) skip
  skip=$(( (L / c - 8) * per )) && [ "$skip" -ge 0 ] || skip=0
  [ -e "$MODEL_DIR/model.safetensors.index.json" ] || [ -e "$MODEL_DIR/model.safetensors" ] ||
    "$BIN/sala" make-random --like-config "$ROOT/configs/minicpm-sala-9b.json" --out "$MODEL_DIR" 2>&1 | tail -1
  # shellcheck disable=SC2046,SC2086  # the optional flag pair; NCU_ARGS is a list
  ncu --metrics "$NCU_PREFILL_METRICS" --kernel-name-base demangled \
    -k "regex:${NCU_REGEX:-select_|sparse_attn|gla_}" --launch-skip "$skip" \
    --launch-count "${NCU_COUNT:-100}" --csv --log-file "$OUT/ncu_prefill.csv" \
    "$BIN/sala" bench offline --model-path "$MODEL_DIR" --device cuda --long-only \
    --long-prefill "$L" --chunk "$c" $([ -n "${NCU_KV:-}" ] && echo --kv-cache-dtype "$NCU_KV") \
    ${NCU_ARGS:-} 2>&1 | grep -E "^prefill"
  python3 "$ROOT/scripts/ncu_summary.py" "$OUT/ncu_prefill.csv" --metrics
}

case "${1:-}" in
  build) build ;;
  pack) pack ;;
  correctness) correctness ;;
  sanitize) sanitize ;;
  bench) BENCH_ARGS=${BENCH_ARGS:-$SHORT_BENCH_ARGS} bench bench ;;
  long) PROFILE_OPS=${PROFILE_OPS:-2048} BENCH_ARGS=${BENCH_ARGS:-$LONG_BENCH_ARGS} bench long ;;
  decode4k) BENCH_ARGS=${BENCH_ARGS:-$DECODE4K_BENCH_ARGS} bench decode4k ;;
  grammar) BENCH_ARGS=${BENCH_ARGS:-$GRAMMAR_BENCH_ARGS} bench grammar ;;
  mixed) PROFILE_OPS=${PROFILE_OPS:-2000} BENCH_ARGS="$MIXED_BENCH_ARGS ${BENCH_ARGS:-}" bench mixed ;;
  tp) tp ;;
  ncu-decode) ncu_decode ;;
  ktrace) ktrace ;;
  ncu-prefill) ncu_prefill ;;
  spec) spec ;;
  fp8) quant_fidelity fp8 ;;
  w4) quant_fidelity w4 ;;
  kv8)
    # shellcheck disable=SC2086  # KV8_TINY_PAIRS is a list
    quant_fidelity kv8 $KV8_TINY_PAIRS ;;
  kv8-bench) kv8_bench ;;
  exec) shift; setup >&2; export SALA_GPU_DIR=$BIN; "$@" ;;
  libs) shift; mkdir -p "$1" && copy_libs "$@" ;;
  table|markdown) $SUM "$1" "${2:-$SUMMARY}" ;;
  *) echo "usage: $0 build|pack|correctness|sanitize|bench|long|decode4k|grammar|mixed|fp8|w4|kv8|kv8-bench|spec|ncu-decode|ncu-prefill|ktrace|exec CMD...|libs DEST BIN...|table|markdown [FILE]" >&2
     exit 2 ;;
esac
