"""The official `openai` Python SDK against `sala serve`: models, chat and completions,
streaming and not, usage, stop strings, n, seed, errors, API key."""
import openai

from common import Check, Server, log

QUESTION = "What is 426+750?"


def main():
    ck = Check("openai_sdk")
    with Server() as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        models = client.models.list()
        ck(len(models.data) == 1 and models.data[0].id == s.model_id, f"models.list: {models}")
        model = models.data[0].id

        # chat, non-streaming, greedy
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                           temperature=0, max_tokens=32)
        text = r.choices[0].message.content
        log("chat:", repr(text), r.choices[0].finish_reason, r.usage)
        ck(isinstance(text, str) and len(text) > 0, "chat content is a non-empty string")
        ck(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason {r.choices[0].finish_reason}")
        ck(r.choices[0].message.role == "assistant", "role assistant")
        ck(r.usage.prompt_tokens == 24, f"ChatML prompt of the tiny model is 24 tokens, got {r.usage.prompt_tokens}")
        ck(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "usage total")
        ck(r.object == "chat.completion" and r.model == model, "object / model")

        # chat, streaming: the deltas add up to the same text; usage chunk at the end
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=32,
            stream=True, stream_options={"include_usage": True}))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        ck(streamed == text, f"streamed chat {streamed!r} == non-streamed {text!r}")
        ck(finishes == [r.choices[0].finish_reason], f"one finish_reason at the end: {finishes}")
        ck(chunks[-1].usage is not None and chunks[-1].choices == [], "include_usage: final usage chunk")
        ck(chunks[-1].usage.completion_tokens == r.usage.completion_tokens, "stream usage == non-stream usage")
        ck(chunks[0].choices[0].delta.role == "assistant", "first delta carries the role")

        # completions, non-streaming and streaming
        c1 = client.completions.create(model=model, prompt="The capital of", max_tokens=20, temperature=0,
                                       extra_body={"ignore_eos": True})
        ck(c1.choices[0].finish_reason == "length" and c1.usage.completion_tokens == 20,
           f"ignore_eos: exactly 20 tokens, got {c1.usage.completion_tokens} ({c1.choices[0].finish_reason})")
        parts = list(client.completions.create(model=model, prompt="The capital of", max_tokens=20,
                                               temperature=0, stream=True, extra_body={"ignore_eos": True}))
        ck("".join(p.choices[0].text for p in parts) == c1.choices[0].text, "streamed completion == non-streamed")
        log("completion:", repr(c1.choices[0].text))

        # stop string: cut before it, finish_reason stop, streaming and not
        full = c1.choices[0].text
        stop = full[len(full) // 2: len(full) // 2 + 2] if len(full) >= 4 else None
        if stop and stop.strip():
            c2 = client.completions.create(model=model, prompt="The capital of", max_tokens=20, temperature=0,
                                           stop=[stop], extra_body={"ignore_eos": True})
            want = full[:full.find(stop)]
            ck(c2.choices[0].text == want, f"stop {stop!r}: {c2.choices[0].text!r} == {want!r}")
            ck(c2.choices[0].finish_reason == "stop", f"stop finish_reason {c2.choices[0].finish_reason}")
            parts = list(client.completions.create(model=model, prompt="The capital of", max_tokens=20, temperature=0,
                                                   stop=stop, stream=True, extra_body={"ignore_eos": True}))
            ck("".join(p.choices[0].text for p in parts) == want, "streamed stop string")

        # n and seed
        cn = client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=1.0, n=3, seed=7)
        ck(sorted(c.index for c in cn.choices) == [0, 1, 2], f"n=3 gives 3 choices: {[c.index for c in cn.choices]}")
        cn2 = client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=1.0, n=3, seed=7)
        ck([c.text for c in cn.choices] == [c.text for c in cn2.choices], "same seed -> same outputs")
        chn = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                             temperature=0, max_tokens=8, n=2)
        ck(len(chn.choices) == 2 and chn.choices[0].message.content == chn.choices[1].message.content,
           "chat n=2 greedy: identical choices")
        ck(chn.usage.prompt_tokens == 24, f"n=2: prompt counted once ({chn.usage.prompt_tokens})")

        # refused features / bad requests raise the SDK's typed errors
        for kw, what in [({"logprobs": True, "top_logprobs": 21}, "top_logprobs 21"), ({"max_tokens": 0}, "max_tokens 0"),
                         ({"messages": []}, "empty messages")]:
            args = dict(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            args.update(kw)
            try:
                client.chat.completions.create(**args)
                ck(False, f"{what}: expected BadRequestError")
            except openai.BadRequestError as e:
                ck(isinstance(e.body, dict) and "message" in e.body, f"{what}: error body {e.body}")
                log(f"{what}: 400 {e.body.get('message')!r}")

        # an unknown model is a 404 (OpenAI, vLLM): the SDK's NotFoundError
        try:
            client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            ck(False, "unknown model: expected NotFoundError")
        except openai.NotFoundError as e:
            ck(e.body.get("code") == "model_not_found" and e.body.get("param") == "model", f"unknown model: {e.body}")

    # API key
    with Server(["--api-key", "sekrit"]) as s:
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        try:
            bad.models.list()
            ck(False, "wrong API key accepted")
        except openai.AuthenticationError:
            ck(True, "")
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekrit", max_retries=0)
        r = good.chat.completions.create(model=good.models.list().data[0].id,
                                         messages=[{"role": "user", "content": QUESTION}], max_tokens=4)
        ck(r.choices[0].message.content is not None, "right API key works")
    ck.done()


if __name__ == "__main__":
    main()
