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
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

sala, eval_dir, work = sys.argv[1:4]
modes = [m.split() for m in sys.argv[4:]] or [["--quantization", "fp8"]]
os.makedirs(work, exist_ok=True)
data = os.path.join(eval_dir, "tiny-chat.jsonl")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def evaluate(name, flags):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The pipe is read only if the server dies: no per-request log lines to fill it.
    server = subprocess.Popen([sala, "serve", "--port", str(port), "--no-request-log", *flags],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None:
                sys.exit(f"{name}: sala serve exited: " + server.stdout.read())
            time.sleep(0.1)
        preds, summary = (os.path.join(work, f"{name}.{x}") for x in ("preds.jsonl", "summary.json"))
        subprocess.run([sala, "eval", "--url", url, "--data", data, "--out", preds,
                        "--summary", summary, "--quiet", "--concurrency", "16"], check=True)
        answers = {json.loads(l)["index"]: json.loads(l)["prediction"] for l in open(preds)}
        return json.load(open(summary))["ori_accuracy"], answers
    finally:
        server.terminate()
        server.wait(timeout=30)


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
