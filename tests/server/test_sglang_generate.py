"""SGLang /generate exactly as `sglang.bench_serving --backend sglang` drives it (API.md §1),
plus the non-streaming, input_ids, batch and --stream-interval forms."""
import json
import time

from transformers import AutoTokenizer

from common import Check, Server, log


def bench_payload(text, n):
    return {"text": text, "sampling_params": {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True},
            "stream": True, "lora_path": None, "return_logprob": False, "return_routed_experts": False,
            "logprob_start_len": -1}


def check_stream(ck, s, text, n, label, want_text=True):
    st, ctype, events, done = s.stream("/generate", bench_payload(text, n))
    ck(st == 200, f"{label}: HTTP {st} {events[:1]}")
    ck(ctype is not None and ctype.startswith("text/event-stream"), f"{label}: content type {ctype}")
    ck(done, f"{label}: ends with data: [DONE]")
    prev_text, prev_tokens = "", 0
    for ev in events:
        ck(ev["text"].startswith(prev_text), f"{label}: text is cumulative")
        mi = ev["meta_info"]
        ck(all(k in mi for k in ("id", "prompt_tokens", "completion_tokens", "finish_reason")), f"{label}: meta_info keys {mi}")
        ck(mi["completion_tokens"] >= prev_tokens, f"{label}: completion_tokens cumulative")
        prev_text, prev_tokens = ev["text"], mi["completion_tokens"]
    last = events[-1]["meta_info"]
    ck(all(e["meta_info"]["finish_reason"] is None for e in events[:-1]), f"{label}: finish_reason null until the end")
    ck(last["finish_reason"] == {"type": "length", "length": n}, f"{label}: finish_reason {last['finish_reason']}")
    ck(last["completion_tokens"] == n, f"{label}: ignore_eos gives exactly {n} tokens, got {last['completion_tokens']}")
    ck("e2e_latency" in last, f"{label}: e2e_latency in the last chunk")
    if want_text:
        ck(any(e["text"] for e in events), f"{label}: some chunk has text (TTFT)")
    return events


def main():
    ck = Check("sglang_generate")
    with Server() as s:
        # 1. /v1/models: the id is the tokenizer path
        st, body = s.get("/v1/models")
        data = json.loads(body)
        ck(data["object"] == "list" and data["data"][0]["object"] == "model", f"/v1/models shape {data}")
        tok = AutoTokenizer.from_pretrained(data["data"][0]["id"])
        q, r = "What is 426+750?", "The answer is 1176, as one can check by adding the digits."
        output_len = len(tok.encode(r))
        # 3. warm-up
        check_stream(ck, s, q, min(output_len, 32), "warm-up")
        # 4. flush_cache
        st, _ = s.post("/flush_cache", None)
        ck(st == 200, f"/flush_cache HTTP {st}")
        time.sleep(1)
        # 5./6. requests
        events = check_stream(ck, s, q, output_len, "request")
        ck(events[-1]["meta_info"]["prompt_tokens"] == len(tok.encode(q)),
           f"prompt_tokens {events[-1]['meta_info']['prompt_tokens']} == HF encode (BOS) {len(tok.encode(q))}")
        check_stream(ck, s, "copper lantern " * 200, 40, "long prompt (sparse path)", want_text=False)
        # 8. get_server_info answers fast
        t0 = time.time()
        st, body = s.get("/get_server_info")
        dt = time.time() - t0
        info = json.loads(body)
        ck(st == 200 and isinstance(info.get("internal_states"), list) and isinstance(info["internal_states"][0], dict),
           f"/get_server_info internal_states {info.get('internal_states')}")
        ck(dt < 1.0, f"/get_server_info took {dt:.3f}s")

        # 7. non-streaming, input_ids, batch
        one = s.post_json("/generate", {"text": q, "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}})
        ck(one["meta_info"]["completion_tokens"] == 12 and one["meta_info"]["finish_reason"]["type"] == "length",
           f"non-streaming meta_info {one['meta_info']}")
        ids = tok.encode(q)
        by_ids = s.post_json("/generate", {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}})
        ck(by_ids["text"] == one["text"], f"input_ids == text: {by_ids['text']!r} vs {one['text']!r}")
        batch = s.post_json("/generate", {"text": [q, "Hello"], "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}})
        ck(isinstance(batch, list) and len(batch) == 2 and batch[0]["text"] == one["text"], "text list -> list of results")
        batch_ids = s.post_json("/generate", {"input_ids": [ids, ids], "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}})
        ck(isinstance(batch_ids, list) and all(b["text"] == one["text"] for b in batch_ids), "input_ids list of lists")
        # stop on EOS without ignore_eos: finish_reason {"type":"stop","matched": <eos id>}
        chat_prompt = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        ids_chat = tok.encode(chat_prompt, add_special_tokens=False)
        e = s.post_json("/generate", {"input_ids": ids_chat, "sampling_params": {"temperature": 0, "max_new_tokens": 64}})
        log("chat via /generate:", e)
        ck(e["meta_info"]["finish_reason"] == {"type": "stop", "matched": 792}, f"EOS finish {e['meta_info']['finish_reason']}")
        # stop string
        e2 = s.post_json("/generate", {"input_ids": ids_chat, "sampling_params": {"temperature": 0, "max_new_tokens": 64, "stop": ["7"]}})
        ck(e2["meta_info"]["finish_reason"] == {"type": "stop", "matched": "7"} and "7" not in e2["text"],
           f"stop string: {e2}")
        # unknown fields ignored
        e3 = s.post_json("/generate", {"text": q, "sampling_params": {"max_new_tokens": 3, "weird": 1}, "foo": {"bar": 1}})
        ck(e3["meta_info"]["completion_tokens"] <= 3, "unknown fields ignored")

    with Server(["--stream-interval", "4"]) as s:
        st, _, events, done = s.stream("/generate", bench_payload("Hello", 40))
        counts = [e["meta_info"]["completion_tokens"] for e in events]
        log("stream-interval 4 chunk counts:", counts)
        ck(done and counts[-1] == 40, "stream-interval: complete")
        ck(len(events) <= 40 // 4 + 2, f"stream-interval 4: {len(events)} chunks for 40 tokens")
    ck.done()


if __name__ == "__main__":
    main()
