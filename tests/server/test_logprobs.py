"""Log probabilities on every route against `sala serve` (tiny model, CPU, fp32):
the openai SDK (chat logprobs + top_logprobs, streaming; completions echo + logprobs,
max_tokens 0), SGLang /generate's return_logprob shapes, and the exact loglikelihood requests
of lm-evaluation-harness' `local-completions` model on a small multiple-choice task (the
requests it sends and its parse_logprobs, reproduced here; lm-eval itself, unchanged, runs in
test_lm_eval.py).
The engine test (tests/engine/logprobs_test.cpp) checks the values against the model's logits."""
import math

import openai

from common import Check, Server, log

Q = "What is 426+750?"


def close(a, b, tol=2e-5):
    return a is not None and b is not None and abs(a - b) <= tol


def check_chat(ck, client, model):
    kw = dict(model=model, messages=[{"role": "user", "content": Q}], temperature=0, max_tokens=12,
              logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    ck(len(content) == r.usage.completion_tokens == 12, f"chat: one entry per token ({len(content)})")
    for e in content:
        ck(e.logprob <= 0 and isinstance(e.token, str) and isinstance(e.bytes, list), f"chat entry {e}")
        ck(len(e.top_logprobs) == 3, f"chat: 3 alternatives, got {len(e.top_logprobs)}")
        tops = [t.logprob for t in e.top_logprobs]
        ck(tops == sorted(tops, reverse=True), f"chat: top_logprobs descending {tops}")
        ck(close(e.logprob, tops[0]), f"chat: greedy token is the top-1 ({e.logprob} vs {tops[0]})")
        ck(bytes(e.bytes).decode("utf-8", "replace") == e.token or not e.token.isprintable(),
           f"chat: bytes of {e.token!r}: {e.bytes}")
    ck("".join(e.token for e in content) != "", "chat: token texts")
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    ck([(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content],
       "chat: streamed logprobs == non-streamed")
    plain = client.chat.completions.create(model=model, messages=[{"role": "user", "content": Q}],
                                           temperature=0, max_tokens=4)
    ck(plain.choices[0].logprobs is None, "chat: no logprobs unless asked")


def check_completions(ck, client, model):
    prompt = "The capital of France is"
    c = client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0, echo=True,
                                  logprobs=2, extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    n = c.usage.prompt_tokens + 5
    ck(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n,
       f"completions echo: prompt + 5 entries, got {len(lp.tokens)}")
    ck(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "echo: the first token has no logprob")
    ck(all(x <= 0 for x in lp.token_logprobs[1:]), "echo: logprobs <= 0")
    ck(all(2 <= len(d) <= 3 for d in lp.top_logprobs[1:]), "top_logprobs: 2 alternatives + the chosen token")
    ck(lp.text_offset == sorted(lp.text_offset), "text_offset ascending")
    ck(c.choices[0].text.startswith(prompt), "echo: text starts with the prompt")
    parts = list(client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0, echo=True,
                                           logprobs=2, stream=True, extra_body={"ignore_eos": True}))
    st = [x for p in parts if p.choices[0].logprobs for x in p.choices[0].logprobs.token_logprobs]
    ck(st == lp.token_logprobs, "completions: streamed token_logprobs == non-streamed")
    z = client.completions.create(model=model, prompt=prompt, max_tokens=0, temperature=0, echo=True, logprobs=1)
    zl = z.choices[0].logprobs
    ck(z.usage.completion_tokens == 0 and z.choices[0].text == prompt, f"max_tokens 0: prompt only ({z.usage})")
    ck(zl.token_logprobs == lp.token_logprobs[:z.usage.prompt_tokens], "max_tokens 0: the same prompt logprobs")
    return lp


def lm_eval_loglikelihood(s, model, requests):
    """lm-eval's local-completions loglikelihood: token-id prompts (context + continuation),
    batched, {temperature 0, max_tokens 1, logprobs 1, seed 1234, echo true}, then
    parse_logprobs: sum(token_logprobs[ctxlen:-1]) and is_greedy from top_logprobs."""
    body = {"model": model, "prompt": [ctx + cont for ctx, cont in requests], "temperature": 0,
            "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    out = s.post_json("/v1/completions", body)
    res = []
    for choice, (ctx, _) in zip(sorted(out["choices"], key=lambda c: c["index"]), requests):
        ctxlen = len(ctx)
        toks = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        res.append((sum(toks), all(t == max(top.values()) for t, top in zip(toks, tops))))
    return res


def check_lm_eval(ck, s, model):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(s.model)
    # A tiny multiple-choice task: context, choices; lm-eval scores " choice" continuations.
    task = [("The capital of France is", ["Paris", "London", "Rome"]),
            ("2 + 2 =", ["4", "5", "22"]),
            ("The sky is", ["blue", "green", "made of cheese"])]
    for ctx, choices in task:
        ctx_ids = tok.encode(ctx)
        reqs = [(ctx_ids, tok.encode(" " + c, add_special_tokens=False)) for c in choices]
        got = lm_eval_loglikelihood(s, model, reqs)
        # The same numbers from /generate (input_ids, return_logprob from position 0) and
        # from the scoring form max_tokens 0 (the brief's form): one engine, three routes.
        for (ll, greedy), (c_ids, cont) in zip(got, reqs):
            g = s.post_json("/generate", {"input_ids": c_ids + cont, "return_logprob": True,
                                          "logprob_start_len": 0, "top_logprobs_num": 1,
                                          "sampling_params": {"max_new_tokens": 0}})
            inp = g["meta_info"]["input_token_logprobs"][len(c_ids):]
            want = sum(t[0] for t in inp)
            ck(close(ll, want, 1e-4), f"lm-eval loglikelihood {ll} == /generate {want}")
            want_greedy = all(close(t[0], top[0][0], 0) for t, top in
                              zip(inp, g["meta_info"]["input_top_logprobs"][len(c_ids):]))
            ck(greedy == want_greedy, f"is_greedy {greedy} == {want_greedy}")
            z = s.post_json("/v1/completions", {"model": model, "prompt": c_ids + cont, "echo": True,
                                                "max_tokens": 0, "logprobs": 1, "temperature": 0})
            zl = z["choices"][0]["logprobs"]["token_logprobs"][len(c_ids):]
            ck(close(sum(zl), ll, 1e-4), f"max_tokens 0 score {sum(zl)} == {ll}")
        pick = max(range(len(choices)), key=lambda i: got[i][0])
        log(f"lm-eval style: {ctx!r} -> {choices[pick]!r} {[round(g[0], 3) for g in got]}")
        ck(all(math.isfinite(g[0]) and g[0] < 0 for g in got), "loglikelihoods are finite and negative")


def check_generate(ck, s):
    body = {"text": Q, "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": 0,
            "return_text_in_logprobs": True}
    r = s.post_json("/generate", body)
    mi = r["meta_info"]
    inp, out = mi["input_token_logprobs"], mi["output_token_logprobs"]
    ck(len(inp) == mi["prompt_tokens"] and len(out) == mi["completion_tokens"] == 6,
       f"/generate: {len(inp)} input, {len(out)} output entries")
    ck(inp[0][0] is None and isinstance(inp[0][1], int) and isinstance(inp[0][2], str), f"input[0] {inp[0]}")
    ck(all(len(t) == 3 and t[0] <= 0 and isinstance(t[2], str) for t in inp[1:] + out), "[logprob, id, text]")
    ck(mi["input_top_logprobs"][0] is None and all(len(x) == 2 for x in mi["input_top_logprobs"][1:]),
       "input_top_logprobs: null, then 2 per position")
    ck(all(len(x) == 2 and x[0][1] == t[1] for x, t in zip(mi["output_top_logprobs"], out)),
       "output_top_logprobs: greedy token first")
    body.update(logprob_start_len=-1, return_text_in_logprobs=False, top_logprobs_num=0)
    d = s.post_json("/generate", body)["meta_info"]
    ck(len(d["input_token_logprobs"]) == 1 and d["input_token_logprobs"][0][2] is None,
       f"logprob_start_len -1: the last prompt token only, no text ({d['input_token_logprobs']})")
    ck("output_top_logprobs" not in d, "top_logprobs_num 0: no top lists")
    ck(close(d["input_token_logprobs"][0][0], inp[-1][0]), "the last prompt token's logprob agrees")
    st, _, events, done = s.stream("/generate", dict(body, stream=True))
    last = events[-1]["meta_info"]
    ck(st == 200 and done and [t[0] for t in last["output_token_logprobs"]] == [t[0] for t in out],
       "streamed /generate: cumulative output_token_logprobs == non-streamed")


def check_errors(ck, s):
    chat = {"messages": [{"role": "user", "content": Q}], "max_tokens": 2}
    for body, param in [(dict(chat, logprobs=True, top_logprobs=21), "top_logprobs"),
                        (dict(chat, top_logprobs=2), "top_logprobs"),
                        (dict(chat, logprobs=3), "logprobs"),
                        (dict(chat, max_tokens=0), "max_tokens")]:
        st, data = s.post("/v1/chat/completions", body)
        ck(st == 400 and f'"param":"{param}"' in data.decode().replace(" ", ""), f"chat {body}: {st} {data[:200]!r}")
    comp = {"prompt": "Hi", "max_tokens": 2}
    for body, param in [(dict(comp, logprobs=21), "logprobs"), (dict(comp, logprobs=True), "logprobs"),
                        (dict(comp, max_tokens=0), "max_tokens")]:
        st, data = s.post("/v1/completions", body)
        ck(st == 400 and f'"param":"{param}"' in data.decode().replace(" ", ""), f"completions {body}: {st} {data[:200]!r}")
    st, data = s.post("/generate", {"input_ids": [1, 5, 6], "return_logprob": True, "logprob_start_len": 3})
    ck(st == 400 and b"logprob_start_len" in data, f"/generate logprob_start_len past the prompt: {st}")
    st, data = s.post("/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": 50})
    ck(st == 400 and b"top_logprobs_num" in data, f"/generate top_logprobs_num 50: {st}")


def main():
    ck = Check("logprobs")
    with Server() as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        check_chat(ck, client, model)
        check_completions(ck, client, model)
        check_generate(ck, s)
        check_lm_eval(ck, s, model)
        check_errors(ck, s)
        s.wait_idle()
    ck.done()


if __name__ == "__main__":
    main()
