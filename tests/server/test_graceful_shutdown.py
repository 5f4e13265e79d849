"""SIGTERM (issue 23): admission stops (503), a request already running finishes, a stream
that outlives --shutdown-timeout ends with an error event and [DONE] (before: cut mid-way,
no final chunk), and the process exits 0."""
import json
import signal
import threading
import time

from common import Check, Server, log


def main():
    ck = Check("graceful_shutdown")
    s = Server(["--shutdown-timeout", "2", "--context-length", "4096"])
    s.__enter__()
    res = {}
    started = {"short": threading.Event(), "long": threading.Event()}

    def run(name, n):
        res[name] = s.stream("/generate", {"text": "Hello", "stream": True,
                                           "sampling_params": {"max_new_tokens": n, "ignore_eos": True}},
                             on_event=lambda ev: started[name].set())

    threads = [threading.Thread(target=run, args=("short", 24)), threading.Thread(target=run, args=("long", 4000))]
    [t.start() for t in threads]
    for e in started.values():
        e.wait(30)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        st, data = s.post("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}, timeout=5)
    except OSError as e:
        st, data = repr(e), b""
    ck(st == 503, f"a new request while draining: 503, got {st} {data[:120]!r}")
    [t.join(60) for t in threads]
    rc = s.proc.wait(30)
    dt = time.time() - t0
    log(f"exit {rc} after {dt:.1f} s")
    ck(rc == 0, f"exit status 0 after SIGTERM, got {rc}")
    ck(dt < 10, f"exited within the shutdown timeout + grace: {dt:.1f} s")
    st, _, ev, done = res["short"]
    ck(done and ev[-1]["meta_info"]["finish_reason"]["type"] == "length" and ev[-1]["meta_info"]["completion_tokens"] == 24,
       f"the short stream finished normally: {ev[-1] if ev else None}")
    st, _, ev, done = res["long"]
    ck(done and ev and "error" in ev[-1] and ev[-1]["error"]["code"] == "shutting_down",
       f"the long stream ended with an error event and [DONE]: done={done} last={json.dumps(ev[-1])[:200] if ev else None}")
    ck.done()


if __name__ == "__main__":
    main()
