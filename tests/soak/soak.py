#!/usr/bin/env python3
"""Soak / load test of `sala serve` on the CPU (issue 23 item 9). Loopback only: the server is
started here on 127.0.0.1 with --port 0 and every client connects to that address; every loop is
bounded and the whole run has a deadline (--max-seconds), so it stops by itself.

Per round (--rounds, default 2):
  * --streams concurrent streaming requests (/generate, /v1/chat/completions, /v1/completions
    mixed), all opened at once; --disconnect of them close the socket at a random point
    (before the answer, after a few events) with a hard close (RST);
  * at the same time a slow-client swarm (--slow): clients that trickle their request
    headers, or send full headers and then trickle a POST body, a few bytes per second;
  * the server must end every slow client itself (408 after --header-timeout / --body-timeout,
    both 8 s here) while the streams are served;
  * then the swarm is closed and the server must come back to idle: no request running or
    queued, no KV page or lightning-state slot in use, no HTTP request in flight, no
    connection open beyond our own, and as many threads as before the round.
RSS (VmRSS of the server) is sampled every 0.2 s: idle (after a warm-up request), the peak,
and after each round. "Flat" means the last round ends at most --rss-growth-mb above the
first round's end (malloc keeps the first round's peak arenas; a leak grows every round).

  .venv/bin/python tests/soak/soak.py                                    # the full run
  .venv/bin/python tests/soak/soak.py --streams 300 --slow 100 --max-seconds 120   # CI
SALA_BIN names the binary (default: build/src/cli/sala). Exits 1 if any check fails; the last
line is "N passed, N failed".
"""
import argparse
import asyncio
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from common import Check, Server, log  # noqa: E402

HOST = "127.0.0.1"  # the only address this test ever connects to
SLOW_TIMEOUT_S = 8  # the server's --header-timeout and --body-timeout here
PROMPTS = ["What is 426+750?", "Hello", "copper lantern " * 20, "Which number is the largest? A) 12 B) 95",
           "summit " * 60]


def proc_status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def request_bytes(i, rng, port):
    p = PROMPTS[i % len(PROMPTS)]
    n = rng.randint(2, 12)
    kind = i % 3
    if kind == 0:
        path, body = "/generate", {"text": p, "stream": True,
                                   "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.7}}
    elif kind == 1:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": p}], "stream": True,
                                              "max_tokens": n, "ignore_eos": True, "temperature": 0}
    else:
        path, body = "/v1/completions", {"prompt": p, "stream": True, "max_tokens": n, "ignore_eos": True}
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    return head + data


def hard_close(writer):
    # SO_LINGER 0: the close sends RST, the rudest disconnect a client can do.
    sock = writer.get_extra_info("socket")
    if sock is not None:
        import socket
        import struct
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def stream_client(i, rng, port, disconnect_at, results, deadline):
    """One streaming request. disconnect_at: None (read to the end), 0 (close right after
    sending), k > 0 (close after k data events)."""
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError as e:
        results["connect_error"] += 1
        log(f"stream {i}: connect failed: {e!r}")
        return
    try:
        writer.write(request_bytes(i, rng, port))
        await writer.drain()
        if disconnect_at == 0:
            hard_close(writer)
            results["disconnected"] += 1
            return
        status = await asyncio.wait_for(reader.readline(), max(1, deadline - time.time()))
        if b" 200 " not in status:
            results["bad_status"] += 1
            log(f"stream {i}: {status!r}")
            return
        events, done, finish = 0, False, False
        while True:
            line = await asyncio.wait_for(reader.readline(), max(1, deadline - time.time()))
            if not line:
                break
            if line.startswith(b"data: [DONE]"):
                done = True
                continue
            if line.startswith(b"data: "):
                ev = json.loads(line[6:])
                events += 1
                ch = ev.get("choices") or [{}]
                finish = finish or bool(ch[0].get("finish_reason")) or bool(
                    (ev.get("meta_info") or {}).get("finish_reason"))
                if disconnect_at is not None and events >= disconnect_at:
                    hard_close(writer)
                    results["disconnected"] += 1
                    return
        results["completed" if done and finish else "truncated"] += 1
    except (asyncio.TimeoutError, OSError, ValueError) as e:
        results["client_error"] += 1
        log(f"stream {i}: {e!r}")
    finally:
        if not writer.is_closing():
            writer.close()


async def slow_client(i, port, stop):
    """Trickles one byte every ~0.5 s: headers that never end, or a body that never ends."""
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        return "connect_error"
    if i % 2:
        msg = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10000
    else:
        writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n")
        msg = b'{"text": "' + b"b" * 100000
    pos, outcome = 0, "held"
    try:
        while not stop.is_set() and pos < len(msg):
            writer.write(msg[pos:pos + 1])
            await writer.drain()
            pos += 1
            try:  # the server may answer (408/400) or close: that ends this client
                data = await asyncio.wait_for(reader.read(4096), 0.5)
                if not data:
                    outcome = "closed_by_server"
                    break
                outcome = "answered"
                break
            except asyncio.TimeoutError:
                pass
    except OSError:
        outcome = "closed_by_server"
    writer.close()
    return outcome


async def run_round(port, n_streams, disconnect_frac, n_slow, slow_seconds, rng, deadline):
    results = {k: 0 for k in ("completed", "truncated", "disconnected", "bad_status", "client_error",
                              "connect_error")}
    stop = asyncio.Event()
    slow = [asyncio.ensure_future(slow_client(i, port, stop)) for i in range(n_slow)]
    await asyncio.sleep(0.5)
    tasks = []
    for i in range(n_streams):
        d = None
        if rng.random() < disconnect_frac:
            d = rng.choice([0, 1, 1, 2, 3, 5])
        tasks.append(stream_client(i, rng, port, d, results, deadline))
    t0 = time.time()
    await asyncio.gather(*tasks)
    # The swarm stays at least slow_seconds, past --header-timeout: the server must close
    # the trickling clients itself.
    await asyncio.sleep(max(0.0, min(slow_seconds - (time.time() - t0), deadline - time.time())))
    stop.set()
    outcomes = await asyncio.gather(*slow)
    slow_summary = {k: outcomes.count(k) for k in set(outcomes)}
    return results, slow_summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--disconnect", type=float, default=0.3, help="fraction of streams that disconnect")
    ap.add_argument("--slow", type=int, default=500, help="slow clients per round")
    ap.add_argument("--slow-seconds", type=float, default=15,
                    help=f"least time the swarm trickles per round (> {SLOW_TIMEOUT_S} + 2: all must be ended by the server)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=900, help="deadline of the whole run")
    ap.add_argument("--rss-growth-mb", type=float, default=32)
    ap.add_argument("--seed", type=int, default=23)
    a = ap.parse_args()
    t_start = time.time()
    deadline = t_start + a.max_seconds
    rng = random.Random(a.seed)
    ck = Check("soak")
    conns = a.streams + a.slow + 64
    # Every stream gets a worker thread and a queue place (the engine runs 64 at a time), so
    # nothing is refused for capacity: the point is that nothing leaks, not the 503 path.
    args = ["--http-threads", str(conns), "--max-connections", str(conns),
            "--max-queued-requests", str(a.streams + 64), "--max-running-requests", "64",
            "--header-timeout", str(SLOW_TIMEOUT_S), "--body-timeout", str(SLOW_TIMEOUT_S), "--cpu-threads", "1"]
    with Server(args, env={"OMP_WAIT_POLICY": "passive"}) as s:
        pid = s.proc.pid
        s.post_json("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 4}})
        idle = s.wait_idle()
        rss_idle = proc_status(pid, "VmRSS")
        threads_idle = idle["process_threads"]  # the server's own count (/metrics)
        ck(threads_idle == proc_status(pid, "Threads"), "/metrics process_threads matches /proc")
        peak = [rss_idle]
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                try:
                    peak[0] = max(peak[0], proc_status(pid, "VmRSS"))
                except OSError:
                    return
                time.sleep(0.2)

        threading.Thread(target=sample, daemon=True).start()
        log(f"idle: RSS {rss_idle / 1024:.1f} MB, {threads_idle:.0f} threads, "
            f"{idle['sala_kv_pages_total']:.0f} KV pages, {idle['sala_state_slots_total']:.0f} state slots")
        round_end_rss = []
        for r in range(a.rounds):
            if time.time() > deadline:
                ck(False, f"deadline reached before round {r + 1}")
                break
            t0 = time.time()
            res, slow = asyncio.run(run_round(s.port, a.streams, a.disconnect, a.slow, a.slow_seconds, rng, deadline))
            dt = time.time() - t0
            try:
                m = s.wait_idle(timeout=60)
            except AssertionError as e:
                ck(False, f"round {r + 1}: {e}")
                m = s.metrics()
            time.sleep(1.0)  # the connection threads finish their log line and close
            m = s.metrics()
            threads = m["process_threads"]
            rss = m["process_resident_memory_bytes"] / 1024
            round_end_rss.append(rss)
            log(f"round {r + 1}: {dt:.1f} s, streams {res}, slow clients {slow}")
            log(f"round {r + 1} end: RSS {rss / 1024:.1f} MB (peak so far {peak[0] / 1024:.1f} MB), "
                f"{threads:.0f} threads, KV pages used {m['sala_kv_pages_used']:.0f}, state slots used "
                f"{m['sala_state_slots_used']:.0f}, in flight {m['sala_http_in_flight']:.0f}, "
                f"connections open {m['sala_http_connections_open']:.0f}, "
                f"aborted {m['sala_requests_aborted_total']:.0f}, disconnects {m['sala_client_disconnects_total']:.0f}")
            ck(res["completed"] + res["disconnected"] == a.streams,
               f"round {r + 1}: every stream completed or was disconnected by us: {res}")
            if a.slow_seconds > SLOW_TIMEOUT_S + 2:
                ck(slow.get("held", 0) == 0, f"round {r + 1}: the server ended every slow client (408 or close): {slow}")
            ck(m["sala_kv_pages_used"] == 0, f"round {r + 1}: KV pages leaked: {m['sala_kv_pages_used']}")
            ck(m["sala_state_slots_used"] == 0, f"round {r + 1}: state slots leaked: {m['sala_state_slots_used']}")
            ck(m["sala_http_in_flight"] == 0, f"round {r + 1}: requests in flight: {m['sala_http_in_flight']}")
            ck(m["sala_num_running_reqs"] == 0 and m["sala_num_queued_reqs"] == 0, f"round {r + 1}: engine idle")
            # Our /metrics request is the only connection left.
            ck(m["sala_http_connections_open"] <= 1, f"round {r + 1}: connections open: {m['sala_http_connections_open']}")
            ck(threads == threads_idle, f"round {r + 1}: threads {threads} != idle {threads_idle}")
            st, _ = s.get("/health", timeout=10)
            ck(st == 200, f"round {r + 1}: /health answers 200 after the round, got {st}")
        sampling.set()
        ck(s.alive(), "server alive")
        if len(round_end_rss) >= 2:
            growth = (round_end_rss[-1] - round_end_rss[0]) / 1024
            ck(growth <= a.rss_growth_mb, f"RSS flat across rounds: grew {growth:.1f} MB (> {a.rss_growth_mb} MB)")
        log(f"SOAK streams={a.streams} x {a.rounds} rounds, slow={a.slow}, disconnect={a.disconnect}: "
            f"RSS idle {rss_idle / 1024:.1f} MB, peak {peak[0] / 1024:.1f} MB, final "
            f"{(round_end_rss[-1] if round_end_rss else -1) / 1024:.1f} MB; threads {threads_idle:.0f} idle; "
            f"{time.time() - t_start:.0f} s")
    print(f"{ck.passed} passed, {len(ck.failures)} failed", flush=True)
    sys.exit(1 if ck.failures else 0)


if __name__ == "__main__":
    main()
