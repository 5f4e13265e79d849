"""Runs `sala eval` on tests/fixtures/eval's tiny-chat.jsonl against a `sala serve` started with
given flags, on a free loopback port: the shared part of the e2e gates (tiny_chat_fp8_gate.py,
tiny_chat_speculative.py, tiny_chat_standalone.py) and of scripts/spec_accept_lengths.py."""
import contextlib
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


@contextlib.contextmanager
def running_server(sala, name, flags):
    """A `sala serve` with the flags on a free loopback port, healthy; yields its URL."""
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
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def server_info(url):
    with urllib.request.urlopen(url + "/get_server_info", timeout=10) as r:
        return json.load(r)


def run_eval(sala, url, data, work, name, concurrency=16):
    """`sala eval` of data against url: (accuracy, {index: prediction})."""
    preds, summary = (os.path.join(work, f"{name}.{x}") for x in ("preds.jsonl", "summary.json"))
    subprocess.run([sala, "eval", "--url", url, "--data", data, "--out", preds,
                    "--summary", summary, "--quiet", "--concurrency", str(concurrency)],
                   check=True)
    answers = {json.loads(l)["index"]: json.loads(l)["prediction"] for l in open(preds)}
    return json.load(open(summary))["ori_accuracy"], answers


def evaluate(sala, data, work, name, flags, concurrency=16):
    """(accuracy, {index: prediction}, /get_server_info after the run)."""
    with running_server(sala, name, flags) as url:
        acc, answers = run_eval(sala, url, data, work, name, concurrency)
        return acc, answers, server_info(url)
