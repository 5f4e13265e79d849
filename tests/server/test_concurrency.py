"""64 parallel streams (chat, completions and /generate mixed), a third of the clients
disconnecting at random points; then nothing may be left running and no KV page or state
slot may be in use. Then throughput at concurrency 1, 8 and 64 (tok/s, printed)."""
import json
import random
import threading
import time

from common import Check, Server, log

PROMPTS = ["What is 426+750?", "Hello", "copper lantern " * 30, "Tell me about the orbit of the prism.",
           "What is 1+2?", "summit " * 150]


def body_for(i, rng, n_tokens):
    p = PROMPTS[i % len(PROMPTS)]
    kind = i % 3
    if kind == 0:
        return "/generate", {"text": p, "stream": True, "sampling_params": {"max_new_tokens": n_tokens, "ignore_eos": True,
                                                                            "temperature": rng.choice([0, 0.8])}}
    if kind == 1:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": p}], "stream": True,
                                        "max_tokens": n_tokens, "ignore_eos": True, "temperature": 0.7}
    return "/v1/completions", {"prompt": p, "stream": True, "max_tokens": n_tokens, "ignore_eos": True}


def client(s, i, rng, disconnect_after, out):
    path, body = body_for(i, rng, 48)
    c = s.conn(600)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            out[i] = ("http", r.status, r.read()[:200])
            return
        events, done = 0, False
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            if line == b"data: [DONE]":
                done = True
                continue
            json.loads(line[6:])
            events += 1
            if disconnect_after is not None and events >= disconnect_after:
                c.sock.close()  # hard close mid-stream
                out[i] = ("disconnected", events)
                return
        out[i] = ("done" if done else "truncated", events)
    except Exception as e:  # noqa
        out[i] = ("error", repr(e))
    finally:
        c.close()


def run_throughput(s, concurrency, n_requests, n_tokens):
    toks = [0] * n_requests
    errors = []
    sem = threading.Semaphore(concurrency)

    def one(i):
        with sem:
            st, _, events, done = s.stream("/generate", {"text": PROMPTS[i % 3], "stream": True, "sampling_params": {
                "temperature": 0.0, "max_new_tokens": n_tokens, "ignore_eos": True}})
            if st != 200 or not done:
                errors.append((st, events[-1] if events else None))
            else:
                toks[i] = events[-1]["meta_info"]["completion_tokens"]

    t0 = time.time()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n_requests)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    dt = time.time() - t0
    return sum(toks), dt, errors


def main():
    ck = Check("concurrency")
    rng = random.Random(1234)
    with Server(["--max-running-requests", "64"]) as s:
        out = {}
        plan = [rng.randint(1, 20) if rng.random() < 0.33 else None for _ in range(64)]
        ts = [threading.Thread(target=client, args=(s, i, random.Random(i), plan[i], out)) for i in range(64)]
        t0 = time.time()
        [t.start() for t in ts]
        [t.join() for t in ts]
        log(f"64 streams in {time.time() - t0:.1f}s")
        kinds = {}
        for i in range(64):
            kinds[out[i][0]] = kinds.get(out[i][0], 0) + 1
            if plan[i] is None:
                ck(out[i][0] == "done", f"stream {i} did not complete: {out[i]}")
        log("outcomes:", kinds)
        ck(kinds.get("disconnected", 0) > 5, "some clients disconnected")
        m = s.wait_idle(30)
        log("after: running", m["sala_num_running_reqs"], "kv_pages_used", m["sala_kv_pages_used"],
            "state_slots_used", m["sala_state_slots_used"], "aborted", m["sala_requests_aborted_total"],
            "disconnects seen", m["sala_client_disconnects_total"])
        ck(m["sala_requests_aborted_total"] >= kinds.get("disconnected", 0) - 2,
           "disconnected clients' requests were aborted (not run to the end)")
        st, body = s.get("/get_server_info")
        es = json.loads(body)["engine_stats"]
        ck(es["kv_pages_used"] == 0 and es["state_slots_used"] == 0, f"/get_server_info engine_stats {es}")
        # Steps by kind (prompt chunks only / both / decode rows only) add up to all steps.
        kinds_of_steps = es["step_kinds"]
        ck(sum(k["steps"] for k in kinds_of_steps.values()) == es["steps"] and
           kinds_of_steps["decode"]["steps"] > 0 and kinds_of_steps["prefill"]["steps"] > 0 and
           all(k["seconds"] >= k["forward_seconds"] >= 0 for k in kinds_of_steps.values()),
           f"/get_server_info step_kinds {kinds_of_steps} vs steps {es['steps']}")
        st, text = s.get("/metrics")
        text = text.decode()
        ck(st == 200 and 'sala_engine_steps_by_kind_total{kind="mixed"}' in text and
           'sala_engine_forward_seconds_total{kind="decode"}' in text, "/metrics has the steps by kind")
        ck(s.alive(), "server alive")

        # throughput
        results = {}
        for conc, nreq in ((1, 4), (8, 16), (64, 64)):
            tokens, dt, errors = run_throughput(s, conc, nreq, 32)
            ck(not errors, f"concurrency {conc}: errors {errors[:3]}")
            results[conc] = tokens / dt
            log(f"throughput concurrency {conc}: {nreq} requests x 32 tokens: {tokens} tokens in {dt:.2f}s = {tokens / dt:.1f} tok/s")
        s.wait_idle(30)
    ck.done()


if __name__ == "__main__":
    main()
