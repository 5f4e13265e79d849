#!/usr/bin/env python3
"""Speculative decoding with a draft model on the trained sala-tiny-chat (issue 21): `sala serve
--speculative-algorithm STANDALONE --speculative-draft-model-path DRAFT` (CPU, fp32) must answer
tests/fixtures/eval/tiny-chat.jsonl exactly as the same server without it (every prediction
equal, token for token), with the model's own dense/sparse rule and with --dense-as-sparse
(every sparse layer on its InfLLM-v2 path). DRAFT is made here: a copy of the model with
Gaussian noise on every weight matrix (scripts/perturb_checkpoint.py, noise 1.0), which
disagrees with it often, so drafts must be rejected and both the target's and the draft
model's states rolled back (counted in /get_server_info). One request at a time: the CPU's
rows are then bit-identical with and without drafts. Also: a draft whose tokenizer differs is
refused at start with an error naming its tokenizer file.
Usage: tiny_chat_standalone.py SALA_BINARY EVAL_DIR WORK_DIR"""
import json
import os
import shutil
import subprocess
import sys

from eval_server import evaluate

sala, eval_dir, work = sys.argv[1:4]
root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
model = os.path.join(root, "models", "sala-tiny-chat")
os.makedirs(work, exist_ok=True)
data = os.path.join(eval_dir, "tiny-chat.jsonl")
draft = os.path.join(work, "draft-noise1.0")
subprocess.run([sys.executable, os.path.join(root, "scripts", "perturb_checkpoint.py"), model,
                draft, "--noise", "1.0", "--seed", "0"], check=True)
spec = ["--speculative-algorithm", "STANDALONE", "--speculative-num-draft-tokens", "4",
        "--speculative-draft-model-path", draft]

failures = []
for name, flags in (("fp32", []), ("fp32-dense-as-sparse", ["--dense-as-sparse"])):
    base, base_answers, _ = evaluate(sala, data, work, name, flags, concurrency=1)
    acc, answers, info = evaluate(sala, data, work, name + "-standalone", flags + spec,
                                  concurrency=1)
    st = info["engine_stats"]
    accept_len = info["internal_states"][0]["avg_spec_accept_length"]
    changed = [i for i in base_answers if answers.get(i) != base_answers[i]]
    print(f"{name}: accuracy {base:.3f} -> STANDALONE {acc:.3f}; {len(changed)} of "
          f"{len(base_answers)} predictions differ; {st['spec_verify_calls']} verify calls, "
          f"{st['spec_drafted_tokens']} drafted, {st['spec_accepted_tokens']} accepted, "
          f"{accept_len:.3f} tokens per verify call; {st['spec_rollbacks']} target rollbacks, "
          f"{st['spec_draft_rollbacks']} draft-model rollbacks; {st['steps']} steps")
    if changed:
        failures.append(f"{name}: predictions {changed[:10]} differ with STANDALONE")
    if acc != base:
        failures.append(f"{name}: accuracy {acc} with STANDALONE, {base} without")
    if not (st["spec_drafted_tokens"] > st["spec_accepted_tokens"] > 0 and accept_len > 1.0
            and st["spec_rollbacks"] > 0 and st["spec_draft_rollbacks"] > 0):
        failures.append(f"{name}: no real speculation (drafted {st['spec_drafted_tokens']}, "
                        f"accepted {st['spec_accepted_tokens']}, rollbacks "
                        f"{st['spec_rollbacks']} / {st['spec_draft_rollbacks']})")

# A draft model with another tokenizer (one token renamed) is refused, naming the file.
bad = os.path.join(work, "draft-other-tokenizer")
shutil.rmtree(bad, ignore_errors=True)
shutil.copytree(draft, bad)
tj = os.path.join(bad, "tokenizer.json")
tok = json.load(open(tj))
vocab = tok["model"]["vocab"]
victim = next(t for t, i in vocab.items() if i == 753)  # "_": in no merge
vocab["zz_not_the_target's"] = vocab.pop(victim)
json.dump(tok, open(tj, "w"))
r = subprocess.run([sala, "serve", "--port", "0", *spec[:-1], bad], capture_output=True,
                   text=True, timeout=120)
err = [l for l in r.stderr.splitlines() if "error" in l]
print(f"other tokenizer: exit {r.returncode}: {err[-1] if err else r.stderr[-300:]}")
if r.returncode == 0 or tj not in r.stderr or "token 753" not in r.stderr:
    failures.append(f"a draft with another tokenizer was not refused by name: {r.stderr[-300:]}")
print("\n".join(failures) or "OK")
sys.exit(1 if failures else 0)
