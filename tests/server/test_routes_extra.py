"""The routes beside generation: /tokenize, /detokenize (vLLM's and SGLang's shapes),
/tokenizer_info (what lm-evaluation-harness's RemoteTokenizer reads), /version,
GET /v1/models/{id} (404 for an unknown id), and the text-only /v1/responses through the
official openai SDK (create, stream)."""
import json
import urllib.parse

import openai

from common import Check, Server, log

QUESTION = "What is 426+750?"


def tokenizer_routes(ck, s):
    with_bos = s.post_json("/tokenize", {"model": s.model_id, "prompt": "copper lantern"})
    plain = s.post_json("/tokenize", {"prompt": "copper lantern", "add_special_tokens": False})
    ck(with_bos["count"] == len(with_bos["tokens"]) and with_bos["max_model_len"] > 0, f"tokenize shape {with_bos}")
    ck(with_bos["tokens"][1:] == plain["tokens"], "add_special_tokens adds the BOS only")
    strs = s.post_json("/tokenize", {"prompt": "copper lantern", "return_token_strs": True})
    ck(len(strs["token_strs"]) == strs["count"], f"return_token_strs {strs}")
    batch = s.post_json("/tokenize", {"prompt": ["copper lantern", "hi"], "add_special_tokens": False})
    ck(batch["tokens"][0] == plain["tokens"] and batch["count"][0] == plain["count"], f"SGLang batch {batch}")
    d = s.post_json("/detokenize", {"model": s.model_id, "tokens": plain["tokens"]})
    ck(d["prompt"] == "copper lantern" and d["text"] == d["prompt"], f"detokenize {d}")
    chat = s.post_json("/tokenize", {"messages": [{"role": "user", "content": QUESTION}]})
    ck(chat["count"] == 24, f"chat tokenize is the chat prompt (24 tokens), got {chat['count']}")
    for path, body, param in [("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": 5}, "prompt"),
                              ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens"),
                              ("/tokenize", {"model": "nope", "prompt": "a"}, "model")]:
        st, data = s.post(path, body)
        want = 404 if param == "model" else 400
        ck(st == want and param in data.decode(), f"{path} {body}: {st} {data[:200]!r}")
    info = s.get("/tokenizer_info")
    info = json.loads(info[1])
    for k in ("eos_token", "bos_token", "pad_token", "chat_template"):
        ck(k in info, f"/tokenizer_info has {k}")
    ck(isinstance(info["eos_token"], str) and "im_start" in (info["chat_template"] or ""),
       f"/tokenizer_info eos {info.get('eos_token')!r}, template")
    # lm-eval's RemoteTokenizer: eos_token_id = encode(eos_token)[0]
    eos = s.post_json("/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})["tokens"]
    ck(len(eos) == 1, f"the eos token encodes to one id: {eos}")
    st, data = s.get("/version")
    ck(st == 200 and "version" in json.loads(data), f"/version {data!r}")


def models(ck, s, client):
    m = client.models.retrieve(s.model_id)
    ck(m.id == s.model_id and m.object == "model", f"models.retrieve {m}")
    st, data = s.get("/v1/models/" + urllib.parse.quote(s.model_id, safe=""))
    ck(st == 200, f"percent-encoded id: {st}")
    try:
        client.models.retrieve("no-such-model")
        ck(False, "unknown model id: expected NotFoundError")
    except openai.NotFoundError as e:
        ck(e.body.get("code") == "model_not_found", f"unknown model id: {e.body}")


def responses(ck, s, client):
    chat = client.chat.completions.create(model=s.model_id, messages=[{"role": "user", "content": QUESTION}],
                                          temperature=0, max_tokens=24)
    r = client.responses.create(model=s.model_id, input=QUESTION, temperature=0, max_output_tokens=24)
    log("responses:", repr(r.output_text), r.status, r.usage)
    ck(r.object == "response" and r.output_text == chat.choices[0].message.content,
       f"responses text {r.output_text!r} == chat {chat.choices[0].message.content!r}")
    ck(r.status == ("completed" if chat.choices[0].finish_reason == "stop" else "incomplete"), f"status {r.status}")
    ck(r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens,
       f"usage {r.usage}")
    short = client.responses.create(model=s.model_id, input=[{"role": "user", "content": [
        {"type": "input_text", "text": QUESTION}]}], temperature=0, max_output_tokens=2)
    ck(short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens",
       f"max_output_tokens: {short.status} {short.incomplete_details}")
    events = list(client.responses.create(model=s.model_id, input=QUESTION, temperature=0,
                                          max_output_tokens=24, stream=True))
    types = [e.type for e in events]
    log("stream events:", types[:6], "...", types[-4:])
    ck(types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"], f"stream opening {types[:4]}")
    ck(types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
       and types[-1] in ("response.completed", "response.incomplete"), f"stream end {types[-4:]}")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    ck(deltas == r.output_text and events[-1].response.output_text == r.output_text, f"stream text {deltas!r}")
    ck([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers")
    for kw, param in [({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
                      ({"previous_response_id": "resp_x"}, "previous_response_id"), ({"store": True}, "store"),
                      ({"text": {"format": {"type": "json_object"}}}, "text"), ({"max_output_tokens": 0}, "max_output_tokens")]:
        try:
            client.responses.create(model=s.model_id, input="hi", **kw)
            ck(False, f"responses {param}: expected 400")
        except openai.BadRequestError as e:
            ck(e.body.get("param") == param, f"responses {param}: {e.body}")
    try:
        client.responses.create(model="nope", input="hi")
        ck(False, "responses unknown model: expected 404")
    except openai.NotFoundError:
        ck(True, "")


def main():
    ck = Check("routes_extra")
    with Server() as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        tokenizer_routes(ck, s)
        models(ck, s, client)
        responses(ck, s, client)
        s.wait_idle()
    ck.done()


if __name__ == "__main__":
    main()
