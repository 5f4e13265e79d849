#!/usr/bin/env python3
"""Head-of-line probe (issue 23, fairness): starts `sala serve` with a schedule policy, sends
one long /generate prompt and, 1 s later, a 100-token request (max_new_tokens 1 each), and
prints how long each took. Under fcfs the short request waits for the whole long prefill;
under fair it is served in the step it arrives in.

    scripts/fair_probe.py SALA_BINARY MODEL_DIR POLICY LONG_TOKENS
    e.g. .venv/bin/python scripts/fair_probe.py build/src/cli/sala models/sala-tiny-chat fair 40000
"""
import json
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request

sala, model, policy, long_len = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
server = subprocess.Popen([sala, "serve", "--model-path", model, "--port", "0", "--schedule-policy", policy,
                           "--no-request-log", "--kv-memory-mb", "1024"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
url = None
for line in server.stdout:
    m = re.search(r"listening on (http://[\d.]+:\d+)", line)
    if m:
        url = m.group(1)
        break
if url is None:
    sys.exit("the server did not start")
threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()


def generate(ids):
    t0 = time.time()
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    req = urllib.request.Request(url + "/generate", body.encode(), {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=3600).read()
    return time.time() - t0


random.seed(1)
took = {}
long_thread = threading.Thread(
    target=lambda: took.__setitem__("long", generate([1] + [random.randrange(3, 700) for _ in range(long_len)])))
long_thread.start()
time.sleep(1.0)
took["short"] = generate([1] + [random.randrange(3, 700) for _ in range(100)])
long_thread.join()
print(f"{policy}: long prompt {long_len} tokens {took['long']:.2f} s; "
      f"100-token request sent 1 s later answered in {took['short']:.2f} s")
server.terminate()
server.wait()
