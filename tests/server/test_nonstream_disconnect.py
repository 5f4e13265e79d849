"""A non-streaming client that goes away (as eval_model.py's requests do on timeout) must
abort its request: long non-streaming answers arrive with chunked encoding and keep-alive
spaces, whose failing write tells the server. Also: a long non-streaming answer that the
client waits for is valid JSON (leading spaces) with the right content."""
import json
import socket
import time

from common import Check, Server, log


def main():
    ck = Check("nonstream_disconnect")
    with Server() as s:
        body = json.dumps({"text": "velvet tide prism garden " * 20,
                           "sampling_params": {"temperature": 0, "max_new_tokens": 100000,
                                               "ignore_eos": True}}).encode()
        # A raw client that sends the request and hangs up after 1.5 s.
        for _ in range(3):
            c = socket.create_connection((s.host, s.port))
            c.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            time.sleep(1.5)
            c.close()
        t0 = time.time()
        m = s.wait_idle(timeout=30)
        log(f"3 abandoned non-streaming requests freed in {time.time() - t0:.1f} s")
        ck(m["sala_kv_pages_used"] == 0 and m["sala_state_slots_used"] == 0, "pages and slots freed")

        # A patient client gets the whole answer as JSON (spaces first, then the object).
        st, raw = s.post("/generate", {"text": "garden", "sampling_params": {
            "temperature": 0, "max_new_tokens": 600, "ignore_eos": True}}, timeout=300)
        ck(st == 200, f"status {st}")
        r = json.loads(raw)
        ck(r["meta_info"]["completion_tokens"] == 600, f"completion_tokens {r['meta_info']['completion_tokens']}")
        log(f"long non-streaming answer: {len(raw)} bytes, {len(raw) - len(raw.lstrip())} leading spaces")
        s.wait_idle()
    ck.done()


if __name__ == "__main__":
    main()
