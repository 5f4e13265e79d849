"""Malformed requests get a 4xx with an OpenAI error body naming the problem, and the server
keeps serving everyone else."""
import json
import threading

from common import Check, Server, log

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]

CASES = [
    # (label, path, raw body or object, expected status)
    ("bad JSON", CHAT, b'{"messages": [', 400),
    ("empty body", CHAT, b"", 400),
    ("JSON array body", CHAT, b"[1, 2]", 400),
    ("invalid UTF-8", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe bad"}]}', 400),
    ("invalid UTF-8 /generate", "/generate", b'{"text": "ab\xc3\x28"}', 400),
    ("messages missing", CHAT, {"max_tokens": 4}, 400),
    ("messages empty", CHAT, {"messages": []}, 400),
    ("messages not a list", CHAT, {"messages": "hi"}, 400),
    ("message without role", CHAT, {"messages": [{"content": "hi"}]}, 400),
    ("bad role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400),
    ("content wrong type", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400),
    ("image content", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
    ("temperature string", CHAT, {"messages": MSG, "temperature": "hot"}, 400),
    ("temperature negative", CHAT, {"messages": MSG, "temperature": -1}, 400),
    ("top_p > 1", CHAT, {"messages": MSG, "top_p": 1.5}, 400),
    ("max_tokens 0", CHAT, {"messages": MSG, "max_tokens": 0}, 400),
    ("max_tokens negative", CHAT, {"messages": MSG, "max_tokens": -5}, 400),
    ("max_tokens float", CHAT, {"messages": MSG, "max_tokens": 2.5}, 400),
    ("max_tokens string", CHAT, {"messages": MSG, "max_tokens": "10"}, 400),
    ("max_tokens beyond context", CHAT, {"messages": MSG, "max_tokens": 10_000_000}, 400),
    ("absurd n", CHAT, {"messages": MSG, "n": 1_000_000}, 400),
    ("n zero", CHAT, {"messages": MSG, "n": 0}, 400),
    ("stream not bool", CHAT, {"messages": MSG, "stream": "yes"}, 400),
    ("stop wrong type", CHAT, {"messages": MSG, "stop": 5}, 400),
    ("stop empty string", CHAT, {"messages": MSG, "stop": [""]}, 400),
    ("top_logprobs past 20", CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400),
    ("tools not a list", CHAT, {"messages": MSG, "tools": {"name": "f"}}, 400),
    ("tool without a name", CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {}}]}, 400),
    ("tool parameters not a schema", CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "no-such-type"}}}], "tool_choice": "required"}, 400),
    ("response_format schema not compilable", CHAT, {"messages": MSG, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "x"}}}}, 400),
    ("regex not compilable", "/generate", {"text": "a", "sampling_params": {"regex": "[z-a]"}}, 400),
    ("ebnf without root", "/generate", {"text": "a", "sampling_params": {"ebnf": "start ::= \"a\""}}, 400),
    ("unknown model", CHAT, {"model": "gpt-9", "messages": MSG}, 404),
    ("unknown model completions", "/v1/completions", {"model": "gpt-9", "prompt": "a"}, 404),
    ("seed string", CHAT, {"messages": MSG, "seed": "x"}, 400),
    ("completions no prompt", "/v1/completions", {"max_tokens": 3}, 400),
    ("completions bad prompt", "/v1/completions", {"prompt": {"a": 1}}, 400),
    ("completions token id out of vocab", "/v1/completions", {"prompt": [1, 999999]}, 400),
    ("completions mixed list", "/v1/completions", {"prompt": ["a", 5]}, 400),
    ("generate no text", "/generate", {"sampling_params": {}}, 400),
    ("generate text and ids", "/generate", {"text": "a", "input_ids": [1]}, 400),
    ("generate ids strings", "/generate", {"input_ids": ["a"]}, 400),
    ("generate empty ids", "/generate", {"input_ids": []}, 400),
    ("generate sampling_params wrong type", "/generate", {"text": "a", "sampling_params": 3}, 400),
    ("generate max_new_tokens -1", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, 400),
    ("generate top_logprobs_num past 20", "/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": 21}, 400),
    ("prompt beyond context", "/generate", {"text": "copper lantern " * 400, "sampling_params": {"max_new_tokens": 4}}, 400),
    ("prompt + max_tokens beyond context", "/generate", {"text": "copper lantern " * 100, "sampling_params": {"max_new_tokens": 1000}}, 400),
    ("unknown route", "/v1/nope", {"a": 1}, 404),
]


def main():
    ck = Check("bad_inputs")
    with Server(["--context-length", "512"]) as s:
        # a long stream keeps running while the bad requests come in
        bg = {}

        def background():
            bg["r"] = s.stream("/generate", {"text": "Hello", "stream": True,
                                             "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}})

        t = threading.Thread(target=background)
        t.start()
        for label, path, body, want in CASES:
            st, data = s.post(path, body)
            try:
                err = json.loads(data)["error"]
                shape = all(k in err for k in ("message", "type", "param", "code")) and isinstance(err["message"], str)
            except Exception:
                err, shape = data[:200], False
            ck(st == want, f"{label}: HTTP {st}, want {want}: {data[:200]!r}")
            ck(shape, f"{label}: OpenAI error body, got {data[:200]!r}")
            log(f"{label}: {st} {err.get('message') if isinstance(err, dict) else err!r}")
        st, data = s.get("/v1/models", headers={})
        ck(st == 200, "server still serves /v1/models")
        ok = s.post_json("/v1/chat/completions", {"messages": MSG, "max_tokens": 4})
        ck(ok["choices"][0]["message"]["content"] is not None, "server still serves chat")
        t.join()
        st, _, events, done = bg["r"]
        ck(st == 200 and done and events[-1]["meta_info"]["completion_tokens"] == 60,
           "a concurrent stream was not disturbed by the bad requests")
        s.wait_idle()
    # Queue full -> 429, and the server keeps serving
    with Server(["--max-running-requests", "1", "--max-queued-requests", "1"]) as s:
        res = []

        def one():
            res.append(s.post("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 30, "ignore_eos": True}}))

        ts = [threading.Thread(target=one) for _ in range(12)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        codes = sorted(st for st, _ in res)
        log("queue-full status codes:", codes)
        ck(set(codes) <= {200, 429} and 200 in codes, f"status codes {codes}")
        ck(429 in codes, f"some request got 429 with a queue of 1: {codes}")
        for st, data in res:
            if st == 429:
                ck(json.loads(data)["error"]["type"] == "rate_limit_error", "429 error body")
        ok = s.post_json("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 4}})
        ck("text" in ok, "serving after 429s")
        # more sequences than the queue can ever hold: 400 naming n, not a 429 that can never succeed
        for path, body in [(CHAT, {"messages": MSG, "max_tokens": 2, "n": 2}),
                           ("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2, "n": 2}})]:
            st, data = s.post(path, body)
            ck(st == 400 and json.loads(data)["error"]["param"] == "n", f"{path} n beyond the queue: {st} {data[:200]!r}")
        s.wait_idle()
    ck.done()


if __name__ == "__main__":
    main()
