#!/usr/bin/env python3
"""Batched == alone through the real server on any device (standard library only, so it runs
on the GPU machine): greedy /generate outputs of 8 prompts (short ones and ones past the tiny
model's dense_len, so both attention paths run) served one at a time, then all 8 at once, then
each again alongside 7 others that join mid-decode. Every text must be identical.
Usage: batch_equality_check.py SALA_BINARY MODEL_DIR DEVICE"""
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

sala, model, device = sys.argv[1:4]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
url = f"http://127.0.0.1:{port}"
server = subprocess.Popen([sala, "serve", "--device", device, "--port", str(port), "--model-path", model],
                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def generate(text, n):
    return post("/generate", {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": n,
                                                                  "ignore_eos": True}})["text"]


words = "velvet tide prism garden copper lantern orbit meadow signal harbor".split()
prompts = [" ".join(words[(i * 3 + j) % len(words)] for j in range(n))
           for i, n in enumerate([3, 12, 40, 90, 150, 220, 300, 420])]
try:
    for _ in range(2400):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.25)
    alone = [generate(p, 48) for p in prompts]
    together = [None] * len(prompts)

    def run(i, delay):
        time.sleep(delay)
        together[i] = generate(prompts[i], 48)

    failures = 0
    for label, delays in (("all at once", [0] * 8), ("joining mid-decode", [0.05 * i for i in range(8)])):
        threads = [threading.Thread(target=run, args=(i, d)) for i, d in enumerate(delays)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        same = sum(a == b for a, b in zip(alone, together))
        for i, (a, b) in enumerate(zip(alone, together)):
            if a != b:
                k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
                print(f"  prompt {i} ({len(prompts[i].split())} words) differs from char {k}: "
                      f"alone {a[k:k + 20]!r} vs batched {b[k:k + 20]!r}")
        failures += len(prompts) - same
        print(f"{device}: batch of 8 {label}: {same}/{len(prompts)} outputs equal to alone")
finally:
    server.terminate()
    server.wait(timeout=60)
sys.exit(1 if failures else 0)
