#!/usr/bin/env python3
"""Encode speed of the SALA tokenizer vs HF's fast tokenizer on a 1 MB mixed text, and the
time to encode a 128K-token prompt.

  speed.py --tool build/tests/tokenizer/tokenizer_tool [--tokenizer DIR] [--max-128k-ms N]

Fails if the ids differ, or if a 128K-token prompt takes longer than --max-128k-ms
(default 500 ms: generous for slow CI machines; the figure is printed).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from parity import BASE_TEXTS, resolve_dir  # noqa: E402


def make_text(rnd, nbytes):
    parts, size = [], 0
    pool = BASE_TEXTS[5:40] + ["\n\n", " ", "The model reads the long document and answers. "] * 3
    while size < nbytes:
        p = rnd.choice(pool)
        parts.append(p)
        size += len(p.encode())
    return "".join(parts)


def ours(tool, d, path):
    r = subprocess.run([tool, d, "--bench", path, "5"], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"FAIL: {r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tokenizer", default="sala-tiny-chat")
    ap.add_argument("--max-128k-ms", type=float, default=500.0)
    args = ap.parse_args()
    d = resolve_dir(args.tokenizer)
    import transformers
    transformers.logging.set_verbosity_error()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    rnd = random.Random(7)
    text = make_text(rnd, 1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "text.txt")
        with open(path, "w") as f:
            f.write(text)
        o = ours(args.tool, d, path)
        best = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            ids = tok.encode(text)
            best = min(best, time.perf_counter() - t0)
        nbytes = len(text.encode())
        print(f"1 MB text ({nbytes} bytes, {len(ids)} tokens): ours {o['mb_per_s']:.2f} MB/s "
              f"({o['seconds'] * 1e3:.1f} ms), HF fast tokenizer {nbytes / best / 1e6:.2f} MB/s ({best * 1e3:.1f} ms)")
        if o["tokens"] != len(ids):
            sys.exit(f"FAIL: token count differs: ours {o['tokens']} vs HF {len(ids)}")
        # a prompt of 128K tokens: cut the text at the byte offset of token 131072
        enc = tok(text * (1 + 131072 // len(ids)), return_offsets_mapping=True, add_special_tokens=False)
        cut = enc["offset_mapping"][131071][1]
        big = (text * (1 + 131072 // len(ids)))[:cut]
        with open(path, "w") as f:
            f.write(big)
        o = ours(args.tool, d, path)
        t0 = time.perf_counter()
        n_hf = len(tok.encode(big))
        hf_ms = (time.perf_counter() - t0) * 1e3
        print(f"128K-token prompt ({o['tokens']} tokens, {o['bytes']} bytes): ours {o['seconds'] * 1e3:.1f} ms, "
              f"HF {hf_ms:.1f} ms")
        if o["tokens"] != n_hf:
            sys.exit(f"FAIL: token count differs: ours {o['tokens']} vs HF {n_hf}")
        if o["seconds"] * 1e3 > args.max_128k_ms:
            sys.exit(f"FAIL: 128K-token prompt took {o['seconds'] * 1e3:.1f} ms > {args.max_128k_ms} ms")


if __name__ == "__main__":
    main()
