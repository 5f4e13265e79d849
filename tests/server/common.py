"""Shared helpers for the server tests: start `sala serve` on a free loopback port, wait for
/health, talk raw HTTP (stdlib only) and stop the server at the end.

The binary comes from $SALA_BIN (ctest sets it); the model from $SALA_TEST_MODEL, else the
bundled tiny model.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.abspath(os.path.join(HERE, "..", ".."))
MODEL_DIR = os.environ.get("SALA_TEST_MODEL", os.path.join(SOURCE_DIR, "models", "sala-tiny-chat"))
EVAL_DIR = os.environ.get("SALA_EVAL_DIR", os.path.join(SOURCE_DIR, "tests", "fixtures", "eval"))
# Upper bounds on how long the server may take are multiplied by this: sanitizer builds run
# several times slower (scripts/sanitize.sh sets it), and a bound meant for a plain build
# would fail them for being slow, not wrong. Lower bounds (a timeout that must not fire
# early) are never scaled.
TIME_SCALE = float(os.environ.get("SALA_TEST_TIME_SCALE", "1"))


def sala_bin():
    b = os.environ.get("SALA_BIN")
    if not b:
        for cand in ("build/src/cli/sala", "build-server/src/cli/sala"):
            p = os.path.join(SOURCE_DIR, cand)
            if os.path.exists(p):
                b = p
                break
    if not b or not os.path.exists(b):
        sys.exit("SALA_BIN is not set and no sala binary was found")
    return b


def log(*a):
    print(*a, flush=True)


class Server:
    """`with Server(["--stream-interval", "4"]) as s:` — s.url, s.model_id, s.get/post/stream."""

    def __init__(self, args=(), model=MODEL_DIR, ready_timeout=180, env=None, api_key=None):
        self.args = list(args)
        self.api_key = self.args[self.args.index("--api-key") + 1] if "--api-key" in self.args else api_key
        self.env = env
        self.model = model
        self.ready_timeout = ready_timeout
        self.proc = None
        self.url = None
        self.stderr_lines = []

    def __enter__(self):
        cmd = [sala_bin(), "serve", "--model-path", self.model, "--host", "127.0.0.1", "--port", "0",
               "--kv-memory-mb", "128"] + self.args
        log("starting:", " ".join(cmd))
        env = dict(os.environ, **self.env) if self.env else None
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        deadline = time.time() + self.ready_timeout
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self._fail("server exited before listening")
            m = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if m:
                self.url = m.group(1)
                break
            if time.time() > deadline:
                self._fail("server did not print its URL")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        u = urllib.parse.urlparse(self.url)
        self.host, self.port = u.hostname, u.port
        while time.time() < deadline:
            try:
                st, _ = self.get("/health")
                if st == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            self._fail("/health never answered 200")
        st, body = self.get("/v1/models")
        self.model_id = json.loads(body)["data"][0]["id"]
        log("server ready at", self.url)
        return self

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)
            if len(self.stderr_lines) > 2000:
                del self.stderr_lines[:1000]

    def _fail(self, msg):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
        raise SystemExit(f"{msg}\nstderr:\n{''.join(self.stderr_lines[-50:])}")

    def alive(self):
        return self.proc.poll() is None

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return False

    def raw(self, data, timeout=10, read_all=True):
        """Sends bytes on a fresh socket; returns everything the server sent until it closed
        (or until `timeout`). Raw, so nothing is normalised away by a client library."""
        sk = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            sk.sendall(data)
            out = b""
            while read_all:
                try:
                    chunk = sk.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                out += chunk
            return out
        finally:
            sk.close()

    def vm(self, key="VmHWM"):
        """The server's /proc/PID/status value in kB (VmHWM: peak resident set)."""
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return -1

    # ---- raw HTTP
    def conn(self, timeout=300):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=300):
        c = self.conn(timeout)
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        h.update(headers or {})
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, obj, **kw):
        return self.request("POST", path, obj, **kw)

    def post_json(self, path, obj, **kw):
        st, data = self.post(path, obj, **kw)
        assert st == 200, f"{path}: HTTP {st}: {data[:500]!r}"
        return json.loads(data)

    def stream(self, path, obj, on_event=None, timeout=300):
        """POST with stream=true; returns (status, content_type, [parsed events], saw_done)."""
        c = self.conn(timeout)
        c.request("POST", path, body=json.dumps(obj), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            data = r.read()
            c.close()
            return r.status, r.getheader("Content-Type"), [json.loads(data)], False
        events, done = [], False
        buf = b""
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            assert line.startswith(b"data: "), f"bad SSE line {line[:200]!r}"
            payload = line[len(b"data: "):]
            if payload == b"[DONE]":
                done = True
                continue
            assert not done, "event after [DONE]"
            ev = json.loads(payload)
            events.append(ev)
            if on_event:
                on_event(ev)
        c.close()
        return r.status, r.getheader("Content-Type"), events, done

    def metrics(self):
        st, body = self.get("/metrics")
        assert st == 200
        out = {}
        for line in body.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
        return out

    def wait_idle(self, timeout=30):
        """Waits until no request runs or waits and no KV page / state slot is in use."""
        deadline = time.time() + timeout
        m = {}
        while time.time() < deadline:
            m = self.metrics()
            if (m["sala_num_running_reqs"] == 0 and m["sala_num_queued_reqs"] == 0 and
                    m["sala_kv_pages_used"] == 0 and m["sala_state_slots_used"] == 0):
                return m
            time.sleep(0.1)
        raise AssertionError("server not idle: " + json.dumps(
            {k: v for k, v in m.items() if k.startswith(("sala_num", "sala_kv", "sala_state"))}))


def eval_rows(n=None):
    q = [json.loads(l) for l in open(os.path.join(EVAL_DIR, "tiny-chat.jsonl"))]
    ref = [json.loads(l) for l in open(os.path.join(EVAL_DIR, "tiny-chat.reference.jsonl"))]
    rows = list(zip(q, ref))
    return rows[:n] if n else rows


class Check:
    """Collects failures so one test reports them all, and exits non-zero at the end."""

    def __init__(self, name):
        self.name = name
        self.failures = []
        self.passed = 0

    def __call__(self, cond, msg):
        if cond:
            self.passed += 1
        else:
            self.failures.append(msg)
            log("FAIL:", msg)

    def done(self):
        log(f"{self.name}: {self.passed} checks passed, {len(self.failures)} failed")
        if self.failures:
            sys.exit(1)
