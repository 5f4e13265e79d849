#!/usr/bin/env python3
"""Speculative decoding vs plain decoding, token for token, on any device (issue 21).

Runs a question set (tests/fixtures/eval/tiny-chat.jsonl shape: question, kind) greedy through
two `sala serve` processes with the same flags, without and with `--speculative-algorithm
NGRAM` (or STANDALONE with the draft model SPEC_DRAFT names), one request at a time, and compares every completion's text. The plain run asks for
the top-2 log probabilities of each token (speculation is off for such requests, and they do
not change greedy output), so a completion that differs is traced to its first differing
token and the plain run's margin there: the gap between the chosen token's log probability
and the runner-up's. A verify row computes the bits of a decode row on the CPU (fp32, one
GEMV per row) and on the GPU (tests/ops/test_cuda_verify.cpp), so one request at a time
nothing should differ; at concurrency > 1 batching changes GEMM shapes, not tested here.

Also reports, per task kind, tokens per verify call (from the speculating server's counters
around each request) and the wall time of the whole set at concurrency 1 and 8, with and
without speculation, and where each kind's decode phase goes, one streamed request at a time:
the client's view, the server's (its request log: duration_s - ttft_s), and the engine's
decode steps in it (count, time, forward time; /get_server_info's step_kinds).

Usage: spec_equality_check.py SALA_BINARY QUESTIONS_JSONL OUT_JSON [sala serve flags...]
Exit 1 if a completion differs where the plain run's margin is >= --tie (default 0.1 nats,
set by SPEC_TIE env)."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

STOP = ["</s>", "<|im_end|>"]
MAX_TOKENS = int(os.environ.get("SPEC_MAX_TOKENS", "96"))
TIE = float(os.environ.get("SPEC_TIE", "0.1"))
# NGRAM, or with SPEC_DRAFT=DIR a draft model (STANDALONE).
SPEC = (["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path",
         os.environ["SPEC_DRAFT"]] if os.environ.get("SPEC_DRAFT")
        else ["--speculative-algorithm", "NGRAM"]) + [
    "--speculative-num-draft-tokens", os.environ.get("SPEC_K", "4")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=30) as r:
        return json.load(r)


class Server:
    def __init__(self, sala, flags):
        self.url = f"http://127.0.0.1:{free_port()}"
        port = self.url.rsplit(":", 1)[1]
        # The server's output (its request log: one JSON line per request) goes to a file
        # that nothing has to drain.
        self.log = tempfile.NamedTemporaryFile("w+", prefix="sala-serve-", suffix=".log")
        self.p = subprocess.Popen([sala, "serve", "--port", port, *flags],
                                  stdout=self.log, stderr=subprocess.STDOUT, text=True)
        for _ in range(1200):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        self.model = get(self.url, "/v1/models")["data"][0]["id"]
                        return
            except OSError:
                pass
            if self.p.poll() is not None:
                self.log.seek(0)
                sys.exit("sala serve exited: " + self.log.read())
            time.sleep(0.1)
        sys.exit("sala serve did not become healthy")

    def chat(self, q, logprobs):
        body = {"model": self.model, "messages": [{"role": "user", "content": q}], "temperature": 0,
                "max_tokens": MAX_TOKENS, "stop": STOP}
        if logprobs:
            body.update(logprobs=True, top_logprobs=2)
        return post(self.url, "/v1/chat/completions", body)["choices"][0]

    def stats(self):
        return get(self.url, "/get_server_info")["engine_stats"]

    def timed(self, questions, concurrency):
        """(seconds, completion tokens) of the whole set at this concurrency, and
        (seconds, tokens) of each request."""
        def one(q):
            body = {"model": self.model, "messages": [{"role": "user", "content": q}],
                    "temperature": 0, "max_tokens": MAX_TOKENS, "stop": STOP}
            t = time.time()
            n = post(self.url, "/v1/chat/completions", body)["usage"]["completion_tokens"]
            return time.time() - t, n
        t0 = time.time()
        with ThreadPoolExecutor(concurrency) as ex:
            each = list(ex.map(one, questions))
        return (time.time() - t0, sum(n for _, n in each)), each

    def decode_time(self, q):
        """Seconds from the first streamed content to the end of the stream (the decode phase:
        no prompt, prefill or first token), one request alone."""
        body = {"model": self.model, "messages": [{"role": "user", "content": q}],
                "temperature": 0, "max_tokens": MAX_TOKENS, "stop": STOP, "stream": True}
        req = urllib.request.Request(self.url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        first = None
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0].get("delta", {})
                if first is None and delta.get("content"):
                    first = time.time()
        return time.time() - first if first is not None else 0.0

    def request_log(self):
        """The request log's entries so far, in the order the requests ended."""
        self.log.flush()
        with open(self.log.name) as f:
            return [e for e in (json.loads(l) for l in f if l.startswith('{"')) if e.get("event") == "request"]

    def close(self):
        self.p.terminate()
        self.p.wait(timeout=60)
        self.log.close()


def first_difference(plain_choice, spec_text):
    """(token index, plain token, margin in nats) where spec_text leaves the plain tokens."""
    text = ""
    for i, t in enumerate(plain_choice["logprobs"]["content"]):
        nxt = text + t["token"]
        if not spec_text.startswith(nxt):
            top = t["top_logprobs"]
            margin = top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else float("inf")
            return i, t["token"], margin
        text = nxt
    return len(plain_choice["logprobs"]["content"]), "<end>", 0.0


def decode_phase(server, q):
    """One streamed request alone: (client decode-phase seconds, server decode-phase seconds
    (its request log's duration_s - ttft_s), the engine's decode steps for it, their seconds,
    their forward seconds)."""
    k0 = server.stats()["step_kinds"]["decode"]
    n0 = len(server.request_log())
    client = server.decode_time(q)
    for _ in range(100):  # the log line is written as the request ends, maybe after the client
        log = server.request_log()
        if len(log) > n0:
            break
        time.sleep(0.01)
    k1 = server.stats()["step_kinds"]["decode"]
    e = log[-1]
    return (client, e["duration_s"] - e.get("ttft_s", 0.0), k1["steps"] - k0["steps"],
            k1["seconds"] - k0["seconds"], k1["forward_seconds"] - k0["forward_seconds"])


def speeds(server, rows):
    """{concurrency: (seconds, tokens)} at 1 and 8, and each request's (seconds, tokens,
    decode_phase(...)) at 1."""
    qs = [r["question"] for r in rows]
    one, each = server.timed(qs, 1)
    eight, _ = server.timed(qs, 8)
    each = [(s, n, decode_phase(server, q)) for (s, n), q in zip(each, qs)]
    return {1: one, 8: eight}, each


def main():
    sala, data, out = sys.argv[1:4]
    flags = sys.argv[4:]
    rows = [json.loads(l) for l in open(data)]
    plain = Server(sala, flags)
    base = [plain.chat(r["question"], True) for r in rows]
    plain_speed, plain_each = speeds(plain, rows)
    plain.close()

    spec = Server(sala, flags + SPEC)
    per_kind, texts = {}, []
    for r in rows:
        s0 = spec.stats()
        texts.append(spec.chat(r["question"], False)["message"]["content"])
        s1 = spec.stats()
        k = per_kind.setdefault(r.get("kind", r.get("task", "?")), [0, 0, 0])
        k[0] += s1["spec_verify_calls"] - s0["spec_verify_calls"]
        k[1] += s1["spec_drafted_tokens"] - s0["spec_drafted_tokens"]
        k[2] += s1["spec_accepted_tokens"] - s0["spec_accepted_tokens"]
    spec_speed, spec_each = speeds(spec, rows)
    spec.close()

    diffs, bad = [], 0
    for i, (b, t) in enumerate(zip(base, texts)):
        if b["message"]["content"] == t:
            continue
        pos, tok, margin = first_difference(b, t)
        diffs.append({"index": i, "token": pos, "plain_token": tok, "margin": margin})
        bad += margin >= TIE
    print(f"{len(rows)} completions, {len(diffs)} differ ({bad} at a margin >= {TIE} nats)")
    for d in diffs:
        print(f"  #{d['index']}: token {d['token']} ({d['plain_token']!r}), plain margin "
              f"{d['margin']:.4f} nats")
    print("kind      verify calls  drafted  accepted  tokens/verify call")
    for kind, (calls, drafted, acc) in sorted(per_kind.items()):
        print(f"{kind:<9} {calls:>12} {drafted:>8} {acc:>9} {(calls + acc) / max(calls, 1):>19.3f}")
    for c in (1, 8):
        (ps, pt), (ss, st) = plain_speed[c], spec_speed[c]
        print(f"concurrency {c}: plain {pt / ps:8.1f} tok/s, NGRAM {st / ss:8.1f} tok/s "
              f"({ps / ss:.2f}x)")
    print("concurrency 1 by kind: plain tok/s, NGRAM tok/s, speed-up; decode phase only (tokens "
          "after the first, streamed): plain tok/s, NGRAM tok/s, speed-up")
    by_kind, phases = {}, {}
    for r, (p_s, p_n, p_ph), (s_s, s_n, s_ph) in zip(rows, plain_each, spec_each):
        kind = r.get("kind", r.get("task", "?"))
        k = by_kind.setdefault(kind, [0.0, 0, 0.0, 0, 0.0, 0.0, 0])
        k[0] += p_s; k[1] += p_n; k[2] += s_s; k[3] += s_n
        k[4] += p_ph[0]; k[5] += s_ph[0]; k[6] += max(p_n - 1, 0)
        ph = phases.setdefault(kind, [[0.0] * 5, [0.0] * 5, 0])
        for i in range(5):
            ph[0][i] += p_ph[i]; ph[1][i] += s_ph[i]
        ph[2] += 1
    for kind, (p_s, p_n, s_s, s_n, p_d, s_d, dn) in sorted(by_kind.items()):
        print(f"  {kind:<9} {p_n / p_s:9.1f} {s_n / s_s:9.1f} {p_s / s_s * s_n / max(p_n, 1):6.2f}x"
              f"   {dn / max(p_d, 1e-9):9.1f} {dn / max(s_d, 1e-9):9.1f} {p_d / max(s_d, 1e-9):6.2f}x")
    # Where a request's decode phase goes, per request: the client's view (first streamed
    # content to the end of the stream), the server's (request log: duration - ttft), the
    # engine's decode steps in it, their time and their forward passes' time.
    print("decode phase by kind, ms per request (plain / spec, speed-up): client, server, "
          "engine steps (count), step time, forward time")
    for kind, (p, sp, n) in sorted(phases.items()):
        cols = [f"{p[i] / n * 1e3:6.3f}/{sp[i] / n * 1e3:6.3f} ({p[i] / max(sp[i], 1e-9):4.2f}x)"
                for i in (0, 1)]
        cols.append(f"{p[2] / n:5.2f}/{sp[2] / n:5.2f}")
        cols += [f"{p[i] / n * 1e3:6.3f}/{sp[i] / n * 1e3:6.3f}" for i in (3, 4)]
        print(f"  {kind:<9} " + "  ".join(cols))
    json.dump({"flags": flags, "differ": diffs, "per_kind": per_kind,
               "speed": {"plain": plain_speed, "ngram": spec_speed},
               "by_kind": by_kind}, open(out, "w"), indent=1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
