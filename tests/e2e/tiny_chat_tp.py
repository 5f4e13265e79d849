#!/usr/bin/env python3
"""Tensor parallelism's gate on the trained sala-tiny-chat (issue 24): `sala serve --tp-size 2`
(CPU backend, two ranks in one process) against the same server with one rank, on
tests/fixtures/eval/tiny-chat.jsonl with requests batched (16 at a time).
- fp32 (the model's own dense/sparse rule): every prediction equal, same accuracy.
- bf16 with --dense-as-sparse (every sparse layer on its InfLLM-v2 path; the tiny model's one
  KV head: the sparse mixer replicated on both ranks): the row-parallel o_proj / down_proj
  sum their K-halves apart, so a bf16-rounded logit may move by one ulp. Every differing
  answer must trace to a near-tie: where the greedy outputs first part, TP=1's and TP=2's top-2
  candidates are the same two tokens and TP=1's logprob gap between them is <= 0.125 (two
  bf16 ulps of a logit below 16); at most 4 of the 160 may differ.
- Seeded sampling (fp32, temperature 0.8): 8 prompts' texts equal.
/get_server_info must report tp_size 2.
With DEVICE cuda (two GPUs: rank r on GPU r over NCCL; scripts/gpu_check.sh tp) the bf16 run
only (the CUDA backend's contract), on --device cuda.
Usage: tiny_chat_tp.py SALA_BINARY EVAL_DIR WORK_DIR [DEVICE]"""
import contextlib
import json
import os
import sys
import urllib.request

from eval_server import run_eval, running_server, server_info

sala, eval_dir, work = sys.argv[1:4]
device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
os.makedirs(work, exist_ok=True)
data = os.path.join(eval_dir, "tiny-chat.jsonl")
questions = [json.loads(l)["question"] for l in open(data)]


def chat(url, question, **params):
    body = {"messages": [{"role": "user", "content": question}], **params}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]


def near_tie(urls, question):
    """(True, why) when the two servers' greedy outputs first part at a near-tie."""
    steps = [chat(u, question, temperature=0, max_tokens=64, logprobs=True,
                  top_logprobs=2)["logprobs"]["content"] for u in urls]
    for pos, (a, b) in enumerate(zip(*steps)):
        if a["token"] == b["token"]:
            continue
        top1 = [(t["token"], t["logprob"]) for t in a["top_logprobs"]]
        top2 = [(t["token"], t["logprob"]) for t in b["top_logprobs"]]
        gap = top1[0][1] - top1[1][1]
        same = {t for t, _ in top1} == {t for t, _ in top2}
        why = f"token {pos}: TP=1 top-2 {top1}, TP=2 top-2 {top2}, gap {gap:.4f}"
        return same and gap <= 0.125, why
    return False, "the outputs do not part"


failures = []
runs = ((("fp32", [], 0), ("bf16-dense-as-sparse", ["--dtype", "bf16", "--dense-as-sparse"], 4))
        if device == "cpu" else (("cuda-dense-as-sparse", ["--device", device, "--dense-as-sparse"], 4),))
for name, flags, max_differ in runs:
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(running_server(sala, f"{name}-tp{tp}", flags + ["--tp-size", str(tp)]))
                for tp in (1, 2)]
        (base, base_answers), (acc, answers) = (run_eval(sala, u, data, work, f"{name}-tp{tp}")
                                                for u, tp in zip(urls, (1, 2)))
        tp_size = server_info(urls[1]).get("tp_size")
        changed = [i for i in base_answers if answers.get(i) != base_answers[i]]
        print(f"{name}: accuracy TP=1 {base:.3f}, TP=2 {acc:.3f}; {len(changed)} of "
              f"{len(base_answers)} predictions differ; server tp_size {tp_size}")
        if tp_size != 2:
            failures.append(f"{name}: /get_server_info tp_size {tp_size}, not 2")
        if len(changed) > max_differ:
            failures.append(f"{name}: predictions {changed[:10]} differ with --tp-size 2")
        for i in changed:
            ok, why = near_tie(urls, questions[i])
            print(f"  prediction {i}: {base_answers[i]!r} -> {answers.get(i)!r}: {why}")
            if not ok:
                failures.append(f"{name}: prediction {i} differs, not at a near-tie ({why})")
        if name == "fp32":
            for i in range(8):
                texts = [chat(u, questions[i * 20], temperature=0.8, max_tokens=24, seed=1000 + i)
                         ["message"]["content"] for u in urls]
                if texts[0] != texts[1]:
                    failures.append(f"seeded sample {i}: {texts[0]!r} with TP=1, {texts[1]!r} with TP=2")
print("\n".join(failures) or "OK")
sys.exit(1 if failures else 0)
