"""Runs `sala eval` on tests/fixtures/eval's tiny-chat.jsonl against a `sala serve` started with
given flags, on a free loopback port: the shared part of the e2e gates (tiny_chat_fp8_gate.py,
tiny_chat_speculative.py)."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def evaluate(sala, data, work, name, flags, concurrency=16):
    """(accuracy, {index: prediction}, /get_server_info after the run)."""
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
                        "--summary", summary, "--quiet", "--concurrency", str(concurrency)],
                       check=True)
        answers = {json.loads(l)["index"]: json.loads(l)["prediction"] for l in open(preds)}
        with urllib.request.urlopen(url + "/get_server_info", timeout=10) as r:
            info = json.load(r)
        return json.load(open(summary))["ori_accuracy"], answers, info
    finally:
        server.terminate()
        server.wait(timeout=30)
