"""Slow-header clients (issue 23): more clients trickling their headers than the server has
worker threads. Before: each held a worker for 60 s per read with no header deadline, so a
probe waited behind them. Now the oldest header-phase connection makes room for a new one
(and each has --header-timeout in all), so the probe answers at once. A body trickled a
byte at a time gets 408 after --body-timeout (found by tests/soak)."""
import re
import select
import socket
import time

from common import TIME_SCALE, Check, Server, log


def complete(answer):
    """True once `answer` holds a whole response: its headers and Content-Length bytes of body
    (the server may send them in separate segments: under TSan the body came apart)."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    return bool(sep) and (m is None or len(body) >= int(m.group(1)))


def main():
    ck = Check("slow_clients")
    # 66 worker threads (--http-threads is raised to 2 x running + 64), a cap of 50 connections
    with Server(["--http-threads", "32", "--max-running-requests", "1", "--header-timeout", "30"]) as s:
        swarm = []
        for _ in range(150):
            sk = socket.create_connection((s.host, s.port), timeout=5)
            sk.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
            swarm.append(sk)
        time.sleep(1.0)
        times = []
        for _ in range(5):
            t0 = time.time()
            try:
                st, _ = s.get("/health", timeout=10)
            except OSError as e:
                st = repr(e)
            times.append(time.time() - t0)
            ck(st == 200, f"probe under a slow-client swarm: 200, got {st}")
        log("probe latencies under 150 slow clients:", ", ".join(f"{t * 1000:.0f} ms" for t in times))
        ck(max(times) < 1.0 * TIME_SCALE, f"probe answers < {TIME_SCALE:g} s: {times}")
        m = s.metrics()
        ck(m.get("sala_http_connections_evicted_total", 0) > 0, "evictions counted in /metrics")
        for sk in swarm:
            sk.close()
        ck(s.alive(), "server alive")
    # A body trickled a byte at a time: before, every byte restarted the 60 s read timeout, so
    # the client held its worker as long as it liked (never evicted: it is in a request).
    # Now the whole body must arrive within --body-timeout: 408, connection closed.
    with Server(["--body-timeout", "2"]) as s:
        sk = socket.create_connection((s.host, s.port), timeout=10)
        sk.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 1000\r\n\r\n")
        t0, answer = time.time(), b""
        # Read whatever the server sent before trickling the next byte: a byte sent after the
        # server closed gets a reset that can discard its unread 408 (a race under load).
        while time.time() - t0 < 8 and not complete(answer):
            readable, _, _ = select.select([sk], [], [], 0.3)
            if readable:
                try:
                    data = sk.recv(4096)
                except OSError:
                    break
                if not data:
                    break
                answer += data
                continue
            if answer:  # answered: the rest of the answer is on its way, trickle no more
                continue
            try:
                sk.sendall(b"a")
            except OSError:
                pass  # closed by the server: keep reading its answer
        sk.close()
        took = time.time() - t0
        log(f"slow body: answered after {took:.1f} s: {answer[:120]!r}")
        ck(answer.startswith(b"HTTP/1.1 408"), f"slow body gets 408, got {answer[:60]!r}")
        ck(b"body not received within 2 s" in answer, "the 408 names the body timeout")
        ck(1.5 < took < 5 * TIME_SCALE, f"408 after about --body-timeout (2 s): {took:.1f} s")
        st, _ = s.post("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2}})
        ck(st == 200, f"a normal POST still works: {st}")
    ck.done()


if __name__ == "__main__":
    main()
