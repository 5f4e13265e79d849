#!/usr/bin/env python3
"""Tensor parallelism's gate on the trained sala-tiny-chat (issue 24): `sala serve --tp-size 2`
(CPU backend, two ranks in one process) must answer tests/fixtures/eval/tiny-chat.jsonl
exactly as the same server with one rank (every prediction equal, same accuracy), with
requests batched (16 at a time). Once in fp32 and once in bf16 with --dense-as-sparse (every
sparse layer on its InfLLM-v2 path; the tiny model's one KV head: the sparse mixer replicated
on both ranks). /get_server_info must report tp_size 2.
Usage: tiny_chat_tp.py SALA_BINARY EVAL_DIR WORK_DIR"""
import os
import sys

from eval_server import evaluate

sala, eval_dir, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
data = os.path.join(eval_dir, "tiny-chat.jsonl")

failures = []
for name, flags in (("fp32", []), ("bf16-dense-as-sparse", ["--dtype", "bf16", "--dense-as-sparse"])):
    base, base_answers, _ = evaluate(sala, data, work, name, flags)
    acc, answers, info = evaluate(sala, data, work, name + "-tp2", flags + ["--tp-size", "2"])
    changed = [i for i in base_answers if answers.get(i) != base_answers[i]]
    print(f"{name}: accuracy TP=1 {base:.3f}, TP=2 {acc:.3f}; {len(changed)} of "
          f"{len(base_answers)} predictions differ; server tp_size {info.get('tp_size')}")
    if info.get("tp_size") != 2:
        failures.append(f"{name}: /get_server_info tp_size {info.get('tp_size')}, not 2")
    if changed:
        failures.append(f"{name}: predictions {changed[:10]} differ with --tp-size 2")
    if acc != base:
        failures.append(f"{name}: accuracy {acc} with --tp-size 2, {base} without")
print("\n".join(failures) or "OK")
sys.exit(1 if failures else 0)
