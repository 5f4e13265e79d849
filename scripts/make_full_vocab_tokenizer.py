#!/usr/bin/env python3
"""Gives a random-weight checkpoint (sala make-random) a tokenizer of its vocab_size, so it
can be served and benchmarked end to end: the bundled sala-tiny-chat tokenizer (Llama-style
BPE, byte fallback) extended with synthetic merges up to vocab_size - 8 regular ids, then the
8 MiniCPM special tokens at the top (ids vocab_size-8 .. vocab_size-1), as the released
checkpoint has them. Uses only the standard library.
Usage: make_full_vocab_tokenizer.py MODEL_DIR"""
import json
import os
import shutil
import sys

out_dir = sys.argv[1]
src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "sala-tiny-chat")
cfg = json.load(open(os.path.join(out_dir, "config.json")))
V = cfg["vocab_size"]
t = json.load(open(os.path.join(src, "tokenizer.json")))
vocab = t["model"]["vocab"]
merges = t["model"]["merges"]
specials = [a for a in t["added_tokens"] if a["id"] >= len(vocab)]
n_regular = V - len(specials)
base = [tok for tok, i in sorted(vocab.items(), key=lambda x: x[1])
        if not (tok.startswith("<") and tok.endswith(">"))]
pieces = list(base)
i = 0
while len(vocab) < n_regular:  # new token = an existing piece + a base piece
    a = pieces[i // len(base) % len(pieces)]
    b = base[i % len(base)]
    i += 1
    if a + b in vocab:
        continue
    vocab[a + b] = len(vocab)
    merges.append([a, b])
    pieces.append(a + b)
for k, a in enumerate(specials):
    a["id"] = n_regular + k
t["model"]["vocab"] = vocab
t["model"]["merges"] = merges
json.dump(t, open(os.path.join(out_dir, "tokenizer.json"), "w"), ensure_ascii=False)
for f in ("tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(os.path.join(src, f), os.path.join(out_dir, f))
json.dump({"bos_token_id": 1, "eos_token_id": [2, n_regular], "pad_token_id": 2},
          open(os.path.join(out_dir, "generation_config.json"), "w"))
print(f"{out_dir}: tokenizer with {len(vocab)} regular + {len(specials)} special ids")
