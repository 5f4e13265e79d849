"""Hostile HTTP (issue 23): raw-socket requests a client library would normalise away.
Each check failed on the server before the connection guard (src/server/http_guard.cpp) and
the request policy (http_policy.cpp)."""
import json
import os
import re
import subprocess
import time
import zlib

from common import TIME_SCALE, Check, Server, log, sala_bin, MODEL_DIR

GEN = b'{"text": "Hello", "sampling_params": {"max_new_tokens": 3}}'


def status_of(resp):
    m = re.match(rb"HTTP/1\.1 (\d+)", resp)
    return int(m.group(1)) if m else None


def post(path, body, ctype=b"application/json", extra=b""):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: " + ctype +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n" + extra + b"\r\n" + body)


def gzip_bomb(inflated):
    """A gzip JSON body that inflates to `inflated` bytes (compressed ~1/1000 of it)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(b'{"text": "')]
    block = b"a" * (1 << 20)
    for _ in range(inflated >> 20):
        out.append(z.compress(block))
    out.append(z.compress(b'"}'))
    out.append(z.flush())
    return b"".join(out)


def main():
    ck = Check("http_guard")
    args = ["--context-length", "512", "--max-queued-requests", "4", "--allowed-origins", "http://good.example",
            "--header-timeout", "2", "--max-body-mb", "64"]
    with Server(args) as s:
        # 1. gzip bomb: refused before a byte is inflated; peak RSS stays put.
        idle = s.vm("VmRSS")
        body = gzip_bomb(300 << 20)
        t0 = time.time()
        r = s.raw(post(b"/generate", body, extra=b"Content-Encoding: gzip\r\n"))
        dt = time.time() - t0
        hwm = s.vm("VmHWM")
        log(f"gzip bomb: {len(body)} bytes -> HTTP {status_of(r)} in {dt:.2f} s; RSS idle {idle} kB, peak {hwm} kB")
        ck(status_of(r) == 415, f"gzip body: 415, got {r[:120]!r}")
        ck(hwm < 2 * idle, f"peak RSS {hwm} kB < 2x idle {idle} kB")
        ck(dt < 5 * TIME_SCALE, f"gzip bomb answered in {dt:.1f} s")

        # 2. framing: refused at once, never a held thread
        for label, raw in [
            ("Content-Length -1", b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: -1\r\n\r\n"),
            ("duplicate differing Content-Length", b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 5\r\nContent-Length: 60\r\n\r\n" + GEN),
            ("Content-Length and chunked", b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ]:
            t0 = time.time()
            r = s.raw(raw, timeout=5)
            dt = time.time() - t0
            ck(status_of(r) == 400 and dt < 2 * TIME_SCALE, f"{label}: 400 at once, got {r[:80]!r} after {dt:.1f} s")
        r = s.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n")
        ck(status_of(r) == 431, f"100 KB of headers: 431, got {r[:80]!r}")
        r = s.raw(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(65 << 20).encode() + b"\r\n\r\n")
        ck(status_of(r) == 413, f"body over --max-body-mb: 413, got {r[:80]!r}")

        # 3. header deadline: a client that stops mid-headers gets 408 after --header-timeout
        t0 = time.time()
        r = s.raw(b"GET /health HTTP/1.1\r\nHost: x\r\n", timeout=10)
        dt = time.time() - t0
        ck(status_of(r) == 408 and 1.5 < dt < 5 * TIME_SCALE, f"slow headers: 408 after ~2 s, got {r[:60]!r} after {dt:.1f} s")

        # 4. pipelining: every request answered, in order
        reqs = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
                b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(GEN)).encode() + b"\r\n\r\n" + GEN +
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        r = s.raw(reqs, timeout=30)
        codes = [int(c) for c in re.findall(rb"HTTP/1\.1 (\d+)", r)]
        ck(codes == [200, 200, 200], f"3 pipelined requests: 3 answers, got {codes}")
        ck(r.find(b'"meta_info"') < r.find(b'"object":"list"'), "pipelined answers in order")

        # 5. bodies and methods
        r = s.raw(b"POST /flush_cache HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        ck(status_of(r) == 200, f"POST /flush_cache without a body or length: 200, got {r[:80]!r}")
        st, _ = s.request("POST", "/flush_cache", headers={"Content-Type": ""})
        ck(st == 200, f"POST /flush_cache (Content-Length: 0): 200, got {st}")
        for path in ("/flush_cache", "/generate", "/v1/chat/completions"):
            st, data = s.get(path)
            ck(st == 405, f"GET {path}: 405, got {st} {data[:80]!r}")
        for ctype in (b"text/plain", b"application/x-www-form-urlencoded", b""):
            r = s.raw(post(b"/generate", GEN, ctype=ctype))
            ck(status_of(r) == 415, f"POST /generate as {ctype!r}: 415, got {r[:80]!r}")
        r = s.raw(post(b"/generate", GEN, ctype=b"application/json; charset=utf-8"))
        ck(status_of(r) == 200, f"application/json; charset=utf-8 accepted, got {r[:80]!r}")

        # 6. CORS
        r = s.raw(post(b"/generate", GEN, extra=b"Origin: http://evil.example\r\n"))
        ck(status_of(r) == 403, f"Origin not allowed: 403, got {r[:80]!r}")
        r = s.raw(post(b"/generate", GEN, extra=b"Origin: http://good.example\r\n"))
        ck(status_of(r) == 200 and b"Access-Control-Allow-Origin: http://good.example" in r,
           f"allowed Origin: 200 with Access-Control-Allow-Origin, got {r[:300]!r}")
        pre = (b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://good.example\r\n"
               b"Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\nConnection: close\r\n\r\n")
        r = s.raw(pre)
        ck(status_of(r) == 204 and b"Access-Control-Allow-Methods: POST" in r and b"Access-Control-Allow-Headers" in r,
           f"preflight: 204 with Access-Control-Allow-*, got {r[:400]!r}")
        r = s.raw(pre.replace(b"good", b"evil"))
        ck(status_of(r) == 403, f"preflight from another origin: 403, got {r[:80]!r}")

        # 7. requests that can never succeed are 400s, without internals
        st, data = s.post("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e309}')
        ck(st == 400 and b"json.exception" not in data, f"temperature 1e309: 400 without internals, got {st} {data[:200]!r}")
        st, data = s.post("/v1/completions", {"prompt": "hi", "n": 5, "max_tokens": 2})
        ck(st == 400, f"n above the queue capacity: 400 (not 429), got {st} {data[:200]!r}")
        t0 = time.time()
        st, data = s.post("/generate", {"text": "copper lantern " * (1 << 20), "sampling_params": {"max_new_tokens": 2}})
        dt = time.time() - t0
        ck(st == 400 and b"bytes" in data and dt < 3 * TIME_SCALE,
           f"15 MB prompt refused from its byte length: got {st} {data[:200]!r} in {dt:.1f} s")

        # 8. one JSON log line per request
        s.post_json("/generate", {"text": "Hello", "rid": "log-probe-1",
                                  "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
        time.sleep(0.3)
        lines = [json.loads(l) for l in s.stderr_lines if l.startswith("{")]
        mine = [l for l in lines if l.get("id") == "log-probe-1"]
        ck(len(mine) == 1 and mine[0]["status"] == 200 and mine[0]["path"] == "/generate" and
           mine[0]["completion_tokens"] == 3 and mine[0]["prompt_tokens"] > 0 and "duration_s" in mine[0],
           f"request log line: {mine}")
        errs = [l for l in lines if l.get("status") == 415 and "error" in l]
        ck(len(errs) >= 3, f"error log lines carry the error: {errs[:2]}")
        ck(s.alive(), "server alive after all of it")
        port = s.port

        # 9. a second server on the same port fails with a clear message
        p = subprocess.run([sala_bin(), "serve", "--model-path", MODEL_DIR, "--host", "127.0.0.1", "--port", str(port),
                            "--kv-memory-mb", "64"], capture_output=True, text=True, timeout=120)
        ck(p.returncode != 0 and "already in use" in p.stderr, f"second server on port {port}: rc {p.returncode} {p.stderr[-300:]!r}")
    p = subprocess.run([sala_bin(), "serve", "--port", "70000"], capture_output=True, text=True, timeout=60)
    ck(p.returncode != 0 and "70000" in (p.stderr + p.stdout), f"--port 70000: CLI error, got rc {p.returncode} {p.stderr[-200:]!r}")
    ck.done()


if __name__ == "__main__":
    main()
