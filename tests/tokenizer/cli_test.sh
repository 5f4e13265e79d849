#!/bin/sh
# `sala tokenize` / `sala detokenize` round trip on the demo model's tokenizer.
set -e
SALA="$1"; M="$2"
ids=$("$SALA" tokenize --model-path "$M" "hello world")
[ "$ids" = "1 303 351 404 423 271 749 750" ] || { echo "FAIL: tokenize gave '$ids'"; exit 1; }
ids=$("$SALA" tokenize --model-path "$M" --no-special "hello world")
[ "$ids" = "303 351 404 423 271 749 750" ] || { echo "FAIL: tokenize --no-special gave '$ids'"; exit 1; }
text=$("$SALA" detokenize --model-path "$M" "1,303,351,404,423,271,749,750")
[ "$text" = "<s> hello world" ] || { echo "FAIL: detokenize gave '$text'"; exit 1; }
text=$("$SALA" detokenize --model-path "$M" --skip-special "[1, 303, 351, 404, 423, 271, 749, 750]")
[ "$text" = "hello world" ] || { echo "FAIL: detokenize --skip-special gave '$text'"; exit 1; }
if "$SALA" detokenize --model-path "$M" "1 999999" 2>/dev/null; then echo "FAIL: out-of-range id accepted"; exit 1; fi
echo "cli ok"
