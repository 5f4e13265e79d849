#!/usr/bin/env bash
# CUDA backend check on the GPU machine, from binaries built elsewhere.
#
#   scripts/gpu_check.sh pack   (here, after building build-cuda: packs the stripped sala,
#                                the op tests of OP_TESTS, their non-system shared
#                                libraries and the golden cases into .gpu/pack.tar.xz (~26 MB;
#                                .gpu/ is git-ignored and travels with `carry`; unpacked it would
#                                exceed the 64 MiB limit)
#   scripts/gpu_check.sh long   (on the GPU machine: `bench` with the long-context rows)
#   scripts/gpu_check.sh decode4k (on the GPU machine: `bench` with decode rows at a 4K context,
#                                issue 5's wording: 4096-token prompts, 128 steps, B = 1 / 8 / 64)
#   scripts/gpu_check.sh run    (on the GPU machine, repository root: op tests against the
#                                CPU backend in bf16 emulation and in fp32 mode (every binary
#                                of OP_TESTS), then `sala golden` tiny-dense, tiny-sparse and
#                                tiny-real-sparse on the GPU in bf16 mode and in fp32 mode;
#                                prints a table last)
#   scripts/gpu_check.sh ncu-decode (on the GPU machine: ncu kernel times of the InfLLM-v2
#                                decode path at a 128K context, summarised per kernel)
#   scripts/gpu_check.sh exec CMD...  (on the GPU machine: CMD with the pack unpacked at
#                                $SALA_GPU_DIR (bin/sala, bin/<op tests>) and its libraries on
#                                LD_LIBRARY_PATH: profiler runs, batch_equality_check.py)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
G=$ROOT/.gpu
BUILD=${BUILD:-$ROOT/build-cuda}
GOLDEN=${GOLDEN:-$ROOT/tests/fixtures/golden}
# The CUDA op test binaries (tests/ops): all of them are packed and run.
OP_TESTS=${OP_TESTS:-"test_cuda_ops test_cuda_sparse test_cuda_f32"}

pack() {
  set -e
  rm -rf "$G" && mkdir -p "$G/bin" "$G/lib" "$G/golden"
  cp "$BUILD/src/cli/sala" "$G/bin/"
  for t in $OP_TESTS; do cp "$BUILD/tests/ops/$t" "$G/bin/"; done
  # Every shared library the binaries need except glibc's own and the CUDA driver/toolkit
  # ones (the GPU machine has CUDA 13 and its driver).
  for b in "$G"/bin/*; do
    ldd "$b" | awk '/=> \// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*|libcuda.so*|libcudart.so*|libcublas*) ;;
      *) cp -L "$lib" "$G/lib/" ;;
    esac
  done
  for c in tiny-dense tiny-sparse tiny-real-sparse; do cp -r "$GOLDEN/$c" "$G/golden/"; done
  strip "$G"/bin/*
  tar -C "$G" -cJf "$ROOT/.gpu.pack.tar.xz" bin lib golden
  rm -rf "$G" && mkdir -p "$G" && mv "$ROOT/.gpu.pack.tar.xz" "$G/pack.tar.xz"
  du -sh "$G"
}

setup() {
  out=${OUT:-/tmp/gpu_check_out}
  mkdir -p "$out"
  if [ -e "$G/pack.tar.xz" ]; then
    mkdir -p /tmp/sala_gpu && tar -C /tmp/sala_gpu -xJf "$G/pack.tar.xz" && G=/tmp/sala_gpu
  fi
  # cuBLASLt / cudart of the machine's CUDA 13 (toolkit or the pip wheels PyTorch uses).
  local cuda_libs=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublasLt.so.13" ] && cuda_libs="$cuda_libs:$d"
  done
  if [ -z "$cuda_libs" ]; then
    local f
    f=$(find / -xdev -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
    [ -n "$f" ] && cuda_libs=":$(dirname "$f")"
    f=$(find / -xdev -name 'libcudart.so.13*' 2>/dev/null | head -1)
    [ -n "$f" ] && cuda_libs="$cuda_libs:$(dirname "$f")"
  fi
  export LD_LIBRARY_PATH="$G/lib$cuda_libs:${LD_LIBRARY_PATH:-}"
  export SALA_REQUIRE_GPU=1
  export SALA_GOLDEN_DIR="$G/golden"  # tiny-dense for the graph-vs-eager test
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$G/bin/sala" | grep -i "not found" && echo "MISSING LIBRARIES"
}

run() {
  setup
  local t0 ops_ok=1
  declare -A orc os grc gs
  for t in $OP_TESTS; do
    t0=$SECONDS
    "$G/bin/$t" 2>&1 | tee "$out/$t.log"
    orc[$t]=${PIPESTATUS[0]}
    os[$t]=$((SECONDS - t0))
    [ "${orc[$t]}" = 0 ] || ops_ok=0
  done
  local golden_ok=1
  for mode in bf16 fp32; do
    for c in tiny-dense tiny-sparse tiny-real-sparse; do
      t0=$SECONDS
      "$G/bin/sala" golden "$G/golden/$c" --device cuda --mode $mode 2>&1 |
        tee "$out/golden_${c}_$mode.log"
      grc[$c.$mode]=${PIPESTATUS[0]}
      gs[$c.$mode]=$((SECONDS - t0))
      [ "${grc[$c.$mode]}" = 0 ] || golden_ok=0
    done
  done

  echo
  echo "================ CUDA backend check ================"
  printf "%-34s %-6s %s\n" "check" "rc" "result"
  for t in $OP_TESTS; do
    printf "%-34s %-6s %s\n" "$t (${os[$t]}s)" "${orc[$t]}" \
      "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')"
  done
  for mode in bf16 fp32; do
    for c in tiny-dense tiny-sparse tiny-real-sparse; do
      printf "%-34s %-6s %s\n" "golden $c $mode cuda (${gs[$c.$mode]}s)" "${grc[$c.$mode]}" \
        "$(grep -E '^[0-9]+ scenarios' "$out/golden_${c}_$mode.log")"
    done
  done
  for t in $OP_TESTS; do grep -E "^\[ (sparse|graph) \]" "$out/$t.log"; done
  [ "$ops_ok" = 1 ] && [ "$golden_ok" = 1 ]
}

# Full-size random model (configs/minicpm-sala-9b.json, 18 GB written on the GPU machine):
# decode and prefill speed through `sala bench offline` (issue 5's targets).
bench() {
  setup
  local m=/tmp/sala_random_9b t0=$SECONDS
  [ -e "$m/model.safetensors.index.json" ] || [ -e "$m/model.safetensors" ] ||
    "$G/bin/sala" make-random --like-config "$ROOT/configs/minicpm-sala-9b.json" --out "$m" 2>&1 | tail -3
  echo "make-random: $((SECONDS - t0)) s"
  # SALA_CUDA_OPTIME=1024: GPU time per op of the steps of >= 1024 rows (the prefills),
  # printed at exit; decode steps run as CUDA graphs and are not timed per op.
  SALA_CUDA_OPTIME=${SALA_CUDA_OPTIME:-1024} "$G/bin/sala" bench offline --model-path "$m" --device cuda \
    ${BENCH_ARGS:---decode-batches 1 8 64 --decode-input 128 --decode-output 128 --prefill-batches 1 4 \
    --prefill-input 4096} --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
}

# The long-context rows of issue 7 (docs/PERF.md "Long context"): chunked prefill of 32K /
# 128K / 512K prompts and decode at 32K / 128K contexts, plus the short decode/prefill rows.
# About 4 minutes of device time with the model already made.
LONG_BENCH_ARGS="--decode-batches 1,8,64 --decode-output 128 --prefill-batches 1,4 \
  --long-prefill 32768,131072,524288 --long-decode-contexts 32768,131072 \
  --long-decode-batches 1,8 --long-decode-steps 64"

# Kernel times of the InfLLM-v2 decode path (issue 7's 128K decode): ncu over a bench with a
# 131072-token context, graphs off, only the sparse-layer kernels; scripts/ncu_summary.py
# prints the mean per kernel over the last 4 decode steps (8 sparse layers × 7 kernels).
# About 2 minutes with the model made. NCU_CONTEXT / NCU_KERNELS override the defaults.
ncu_decode() {
  setup
  local m=/tmp/sala_random_9b c=${NCU_CONTEXT:-131072}
  [ -e "$m/model.safetensors.index.json" ] || [ -e "$m/model.safetensors" ] ||
    "$G/bin/sala" make-random --like-config "$ROOT/configs/minicpm-sala-9b.json" --out "$m" 2>&1 | tail -1
  SALA_DISABLE_CUDA_GRAPH=1 ncu --metrics gpu__time_duration.sum,launch__grid_size \
    -k "regex:${NCU_KERNELS:-select|sparse_attn|combine|append_kv|compress|attention_kernel}" \
    --csv --log-file "$out/ncu.csv" "$G/bin/sala" bench offline --model-path "$m" --device cuda \
    --decode-batches 1 --decode-output 2 --prefill-batches 1 --prefill-input 256 \
    --long-decode-contexts "$c" --long-decode-batches 1 --long-decode-steps 4 2>&1 | grep -E "^decode"
  python3 "$ROOT/scripts/ncu_summary.py" "$out/ncu.csv" --last $((4 * 8 * 7))
}

case "${1:-run}" in
  pack) pack ;;
  run) run ;;
  bench) bench ;;
  long) SALA_CUDA_OPTIME=${SALA_CUDA_OPTIME:-8192} BENCH_ARGS=${BENCH_ARGS:-$LONG_BENCH_ARGS} bench ;;
  all) run; bench ;;
  decode4k) BENCH_ARGS=${BENCH_ARGS:-"--decode-batches 1,8,64 --decode-input 4096 --decode-output 128 \
    --prefill-batches 1 --prefill-input 4096"} bench ;;
  ncu-decode) ncu_decode ;;
  exec) shift; setup >&2; export SALA_GPU_DIR=$G; "$@" ;;
  *) echo "usage: $0 pack|run|bench|long|decode4k|all|ncu-decode|exec CMD..." >&2; exit 2 ;;
esac
