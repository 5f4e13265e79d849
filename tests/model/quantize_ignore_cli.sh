#!/usr/bin/env bash
# `sala quantize --ignore` from the command line: a user's own mix (RTN) is written with the
# matched modules listed in the config's ignore and loads; patterns that split a stacked family,
# match nothing, do not compile, or come with a scheme that does not take them are refused with
# a message naming the problem, and nothing is written.
# Usage: quantize_ignore_cli.sh SALA MODEL_DIR WORK_DIR
set -u
sala=$1 model=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fails=0
expect_error() {  # want, args...
  local want=$1; shift
  local out
  if out=$("$sala" quantize --model-path "$model" --out "$work/bad" "$@" 2>&1); then
    echo "FAIL: accepted: $*"; fails=$((fails + 1)); return
  fi
  if ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL: $* -> '$out' lacks '$want'"; fails=$((fails + 1))
  fi
  if [ -e "$work/bad/config.json" ]; then echo "FAIL: $* wrote a checkpoint"; fails=$((fails + 1)); fi
}
expect_error "keeps part of layer 1" --scheme w4a16 --method rtn \
  --ignore model.layers.1.self_attn.q_proj
expect_error "matches no Linear module" --scheme w4a16 --method rtn --ignore 're:nothing'
expect_error "not a valid regex" --scheme fp8 --ignore 're:model\.layers\.('
expect_error "--ignore is implemented for" --scheme w4a16 --ignore 're:model\.layers\.1\.mlp\.'
if ! "$sala" quantize --model-path "$model" --out "$work/ok" --scheme w4a16 --method rtn \
    --ignore 're:model\.layers\.1\.mlp\.' --ignore model.layers.2.self_attn.o_proj >/dev/null 2>&1; then
  echo "FAIL: a valid --ignore was refused"; fails=$((fails + 1))
else
  ignore=$(python3 -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))['quantization_config']['ignore']))" "$work/ok/config.json")
  for m in lm_head model.layers.1.mlp.gate_proj model.layers.1.mlp.up_proj \
           model.layers.1.mlp.down_proj model.layers.2.self_attn.o_proj; do
    grep -qw -- "$m" <<<"$ignore" || { echo "FAIL: $m not in ignore ($ignore)"; fails=$((fails + 1)); }
  done
  n=$(wc -w <<<"$ignore")
  [ "$n" = 5 ] || { echo "FAIL: ignore holds $n modules, not 5 ($ignore)"; fails=$((fails + 1)); }
  out=$("$sala" generate --model-path "$work/ok" --prompt-ids 1,2,3 --max-new-tokens 4 2>&1) ||
    { echo "FAIL: the checkpoint does not generate: $out"; fails=$((fails + 1)); }
fi
[ "$fails" = 0 ] && echo "quantize --ignore: all checks passed"
exit "$fails"
