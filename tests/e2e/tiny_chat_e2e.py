#!/usr/bin/env python3
"""End to end on the bundled sala-tiny-chat model, the way users check it (issue 8):
serve it on the CPU with `sala serve`, run `sala eval` on tests/fixtures/eval/tiny-chat.jsonl
(through /v1/chat/completions, as the SOAR toolkit does), and require
  * every greedy answer == the reference output_text, row by row (the model-level test
    tiny_chat_model_reference shows where a near-tie would excuse a difference; there is none),
  * ori_accuracy == the reference's accuracy;
then the same prompts through /generate with the chat-templated text.
Usage: tiny_chat_e2e.py SALA_BINARY EVAL_DIR WORK_DIR"""
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import requests
from transformers import AutoTokenizer

sala, eval_dir, work = sys.argv[1:4]
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
model_dir = os.path.join(root, "models", "sala-tiny-chat")
rows = [json.loads(l) for l in open(os.path.join(eval_dir, "tiny-chat.jsonl"))]
refs = [json.loads(l) for l in open(os.path.join(eval_dir, "tiny-chat.reference.jsonl"))]
os.makedirs(work, exist_ok=True)

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
url = f"http://127.0.0.1:{port}"
# The pipe is read only if the server dies: no per-request log lines to fill it.
server = subprocess.Popen([sala, "serve", "--port", str(port), "--no-request-log"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
failures = []
try:
    for _ in range(600):
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            pass
        if server.poll() is not None:
            sys.exit("sala serve exited: " + server.stdout.read())
        time.sleep(0.1)

    # 1. sala eval through /v1/chat/completions.
    preds_path, summary_path = os.path.join(work, "preds.jsonl"), os.path.join(work, "summary.json")
    subprocess.run([sala, "eval", "--url", url, "--data", os.path.join(eval_dir, "tiny-chat.jsonl"),
                    "--out", preds_path, "--summary", summary_path, "--quiet", "--concurrency", "16"],
                   check=True)
    preds = sorted((json.loads(l) for l in open(preds_path)), key=lambda p: p["index"])
    assert len(preds) == len(refs) == len(rows), (len(preds), len(refs))
    same = 0
    for p, r in zip(preds, refs):
        if p["prediction"] == r["output_text"]:
            same += 1
        else:
            failures.append(f"chat row {p['index']}: {p['prediction']!r} != reference {r['output_text']!r}")
    ref_acc = 100.0 * sum(r["correct"] for r in refs) / len(refs)
    ori = json.load(open(summary_path))["ori_accuracy"]
    print(f"/v1/chat/completions via sala eval: {same}/{len(refs)} answers equal the reference; "
          f"ori_accuracy {ori:.2f} (reference {ref_acc:.2f})")
    if abs(ori - ref_acc) > 1e-9:
        failures.append(f"ori_accuracy {ori} != reference {ref_acc}")

    # 2. /generate with the templated text. The template starts with the BOS string and
    # /generate tokenizes with BOS added (as SGLang does), so the BOS text is left out.
    tok = AutoTokenizer.from_pretrained(model_dir)

    def generate(i):
        text = tok.apply_chat_template([{"role": "user", "content": rows[i]["question"]}],
                                       add_generation_prompt=True, tokenize=False)
        assert text.startswith(tok.bos_token)
        body = {"text": text[len(tok.bos_token):],
                "sampling_params": {"temperature": 0, "max_new_tokens": 64}}
        r = requests.post(url + "/generate", json=body, timeout=600)
        r.raise_for_status()
        return r.json()

    with ThreadPoolExecutor(16) as ex:
        outs = list(ex.map(generate, range(len(rows))))
    same_gen = 0
    for i, (o, r) in enumerate(zip(outs, refs)):
        if o["meta_info"]["prompt_tokens"] != r["prompt_tokens"]:
            failures.append(f"generate row {i}: prompt_tokens {o['meta_info']['prompt_tokens']} != {r['prompt_tokens']}")
        if o["text"] == r["output_text"]:
            same_gen += 1
        else:
            failures.append(f"generate row {i}: {o['text']!r} != reference {r['output_text']!r}")
    print(f"/generate with templated text: {same_gen}/{len(refs)} answers equal the reference")
finally:
    server.terminate()
    server.wait(timeout=30)

for f in failures[:20]:
    print("FAIL", f)
print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
