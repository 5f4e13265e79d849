#!/usr/bin/env python3
"""Speculative decoding's gate on the trained sala-tiny-chat (issue 21): `sala serve
--speculative-algorithm NGRAM` (CPU, fp32) must answer tests/fixtures/eval/tiny-chat.jsonl
exactly as the same server without it (every prediction equal, token for token), and must
really speculate: drafts verified, some accepted, some rejected (rollbacks happened), an
average accepted length above 1 in /get_server_info's internal_states. Once with the model's
own dense/sparse rule and once with --dense-as-sparse (every sparse layer on its InfLLM-v2
path). One request at a time: the CPU's rows are then bit-identical with and without drafts
(steps of <= 16 rows run one GEMV per row).
Usage: tiny_chat_speculative.py SALA_BINARY EVAL_DIR WORK_DIR"""
import os
import sys

from eval_server import evaluate

sala, eval_dir, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
data = os.path.join(eval_dir, "tiny-chat.jsonl")
spec = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"]

failures = []
for name, flags in (("fp32", []), ("fp32-dense-as-sparse", ["--dense-as-sparse"])):
    base, base_answers, _ = evaluate(sala, data, work, name, flags, concurrency=1)
    acc, answers, info = evaluate(sala, data, work, name + "-ngram", flags + spec, concurrency=1)
    st = info["engine_stats"]
    accept_len = info["internal_states"][0]["avg_spec_accept_length"]
    changed = [i for i in base_answers if answers.get(i) != base_answers[i]]
    print(f"{name}: accuracy {base:.3f} -> NGRAM {acc:.3f}; {len(changed)} of "
          f"{len(base_answers)} predictions differ; {st['spec_verify_calls']} verify calls, "
          f"{st['spec_drafted_tokens']} drafted, {st['spec_accepted_tokens']} accepted, "
          f"{accept_len:.3f} tokens per verify call; {st['steps']} steps")
    if changed:
        failures.append(f"{name}: predictions {changed[:10]} differ with NGRAM")
    if acc != base:
        failures.append(f"{name}: accuracy {acc} with NGRAM, {base} without")
    if not (st["spec_drafted_tokens"] > st["spec_accepted_tokens"] > 0 and accept_len > 1.0):
        failures.append(f"{name}: no real speculation (drafted {st['spec_drafted_tokens']}, "
                        f"accepted {st['spec_accepted_tokens']})")
print("\n".join(failures) or "OK")
sys.exit(1 if failures else 0)
