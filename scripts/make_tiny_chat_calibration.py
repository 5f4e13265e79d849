#!/usr/bin/env python3
"""Writes tests/fixtures/eval/tiny-chat.calibration.txt: calibration text for `sala quantize
--calibration` on models/sala-tiny-chat (issue 22). One ChatML conversation per line (newlines
escaped as \\n, which `sala quantize` unescapes): a question of each of the eval set's four kinds
(arith, mcq, needle, copy) in the eval set's wording, and its correct answer, made from a seed
of its own, so no sample is an eval question (checked below).
Usage: make_tiny_chat_calibration.py EVAL_JSONL OUT_TXT [N_PER_KIND [SEED]] (another SEED: a
held-out set of the same kind, e.g. a `sala fidelity --corpus`)"""
import json
import random
import sys

eval_path, out_path = sys.argv[1:3]
per_kind = int(sys.argv[3]) if len(sys.argv) > 3 else 16
WORDS = ("amber beacon canyon cedar cloud comet copper drift echo ember falcon frost garden "
         "glacier harbor harvest ivory lantern maple marble meadow orbit pebble prism quartz raven "
         "river saffron silver sparrow stone summit thunder tide velvet violet willow").split()
rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 22022)
eval_questions = {json.loads(line)["question"] for line in open(eval_path)}


def arith():
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    return f"What is {a}+{b}?", str(a + b)


def mcq():
    nums = rng.sample(range(1, 1000), 4)
    letter = "ABCD"[nums.index(max(nums))]
    opts = " ".join(f"{l}) {n}" for l, n in zip("ABCD", nums))
    return f"Which number is the largest? {opts}", f"ANSWER: {letter}"


def needle():
    key = f"{rng.choice(WORDS)}-{rng.randint(10, 99)}"
    code = str(rng.randint(1000, 9999))
    hay = [rng.choice(WORDS) for _ in range(rng.randint(60, 180))]
    hay.insert(rng.randint(0, len(hay)), f"The secret code for {key} is {code}.")
    return " ".join(hay) + f"\nWhat is the secret code for {key}?", code


def copy():
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8)))
    return f"Repeat exactly: {words}", words


lines = []
for _ in range(per_kind):
    for make in (arith, mcq, needle, copy):
        q, a = make()
        assert q not in eval_questions, q
        chat = f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>"
        lines.append(chat.replace("\n", "\\n"))
with open(out_path, "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"wrote {len(lines)} samples to {out_path}")
