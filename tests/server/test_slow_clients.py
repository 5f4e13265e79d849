"""Slow-header clients (issue 23): more clients trickling their headers than the server has
worker threads. Before: each held a worker for 60 s per read with no header deadline, so a
probe waited behind them. Now the oldest header-phase connection makes room for a new one
(and each has --header-timeout in all), so the probe answers at once."""
import socket
import time

from common import Check, Server, log


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
        ck(max(times) < 1.0, f"probe answers < 1 s: {times}")
        m = s.metrics()
        ck(m.get("sala_http_connections_evicted_total", 0) > 0, "evictions counted in /metrics")
        for sk in swarm:
            sk.close()
        ck(s.alive(), "server alive")
    ck.done()


if __name__ == "__main__":
    main()
