"""A client in the style of the SOAR toolkit's eval_model.py: GET /v1/models, then
non-streaming /v1/chat/completions, up to 32 in parallel, temperature 0, max_tokens 65536,
stop ["</s>", "<|im_end|>"]. Answers are compared with the reference implementation's greedy
outputs (tests/fixtures/eval/tiny-chat.reference.jsonl)."""
from concurrent.futures import ThreadPoolExecutor

import requests

from common import Check, Server, eval_rows, log


def main():
    ck = Check("eval_client")
    rows = eval_rows()
    with Server() as s:
        model = requests.get(s.url + "/v1/models", timeout=30).json()["data"][0]["id"]

        def ask(row):
            q = row[0]["question"]
            r = requests.post(s.url + "/v1/chat/completions", timeout=3000, json={
                "model": model, "messages": [{"role": "user", "content": q}], "temperature": 0,
                "max_tokens": 65536, "stop": ["</s>", "<|im_end|>"]})
            return r.status_code, r.json()

        with ThreadPoolExecutor(32) as ex:
            results = list(ex.map(ask, rows))
        match = 0
        for (q, ref), (st, body) in zip(rows, results):
            ck(st == 200, f"HTTP {st}: {body}")
            if st != 200:
                continue
            c = body["choices"][0]
            ck(isinstance(c["message"]["content"], str), "content is a string")
            ck(c["finish_reason"] in ("stop", "length"), f"finish_reason {c['finish_reason']}")
            u = body["usage"]
            ck(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], "usage adds up")
            ck("<|im_end|>" not in c["message"]["content"] and "</s>" not in c["message"]["content"], "stop text not in content")
            ck(u["prompt_tokens"] == ref["prompt_tokens"], f"prompt_tokens {u['prompt_tokens']} == reference {ref['prompt_tokens']}")
            if c["message"]["content"] == ref["output_text"]:
                match += 1
            else:
                log(f"differs: {q['question'][:60]!r}: {c['message']['content']!r} vs reference {ref['output_text']!r}")
        log(f"greedy answers equal to the reference: {match}/{len(rows)}")
        ck(match >= len(rows) - 4, f"only {match}/{len(rows)} answers equal the reference (fp32, rare ties aside)")
        s.wait_idle()
    ck.done()


if __name__ == "__main__":
    main()
