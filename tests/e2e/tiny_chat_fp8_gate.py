#!/usr/bin/env python3
"""The FP8 fidelity gate on the trained sala-tiny-chat (issue 17): `sala serve --quantization
fp8` (W8A8 e4m3, CPU) must score within 1 point of the same server without it, on
tests/fixtures/eval/tiny-chat.jsonl through `sala eval` (/v1/chat/completions, as the SOAR
toolkit scores). Checked for the bf16 numeric mode and with --dense-as-sparse (every sparse
layer on its InfLLM-v2 path). Prints both accuracies and how many answers changed.
Other quantized modes go through the same gate with their flags as one more argument, e.g.
"--kv-cache-dtype fp8_e4m3" (FP8 KV cache) or "--kv-cache-dtype fp8_e4m3 --quantization fp8";
several such arguments are each compared with the same baseline.
Usage: tiny_chat_fp8_gate.py SALA_BINARY EVAL_DIR WORK_DIR [QUANTIZED_FLAGS ...]"""
import os
import sys

from eval_server import evaluate as evaluate_server

sala, eval_dir, work = sys.argv[1:4]
modes = [m.split() for m in sys.argv[4:]] or [["--quantization", "fp8"]]
os.makedirs(work, exist_ok=True)
data = os.path.join(eval_dir, "tiny-chat.jsonl")


def evaluate(name, flags):
    accuracy, answers, _ = evaluate_server(sala, data, work, name, flags)
    return accuracy, answers


failures = []
for name, flags in (("bf16", ["--dtype", "bf16"]),
                    ("bf16-dense-as-sparse", ["--dtype", "bf16", "--dense-as-sparse"])):
    base, base_answers = evaluate(name, flags)
    for mode in modes:
        label = " ".join(mode)
        tag = "".join(m.strip("-") for m in mode).replace("/", "_")
        fp8, fp8_answers = evaluate(name + "-" + tag, flags + mode)
        changed = sum(base_answers[i] != fp8_answers.get(i) for i in base_answers)
        print(f"{name}: accuracy {base:.3f} -> {label} {fp8:.3f} ({fp8 - base:+.3f} points); "
              f"{changed} of {len(base_answers)} answers changed")
        if abs(fp8 - base) > 1.0:
            failures.append(f"{name}: {label} accuracy {fp8} is more than 1 point from {base}")
print("\n".join(failures) or "OK")
sys.exit(1 if failures else 0)
