"""Tool calling on `sala serve` (tiny model, CPU) with the openai SDK, Hermes format
(`--tool-call-parser hermes`, the default):
  * tool_choice "required" and a named function are enforced by the grammar: every answer is
    tool calls whose arguments are JSON valid against the function's parameters (jsonschema),
    finish_reason "tool_calls"; parallel_tool_calls false gives exactly one call;
  * streamed answers give the same calls as OpenAI-shaped tool_calls deltas;
  * the round trip: the assistant's tool_calls and a role "tool" answer are accepted and
    rendered into the prompt (checked through /tokenize + /detokenize);
  * tool_choice "none" / "auto", bad tools and --tool-call-parser none: what OpenAI / vLLM do."""
import json

import jsonschema
import openai

from common import Check, Server, log

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 999}, "b": {"type": "integer", "minimum": 0, "maximum": 999}},
        "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
SCHEMA = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
Q = [{"role": "user", "content": "What is the weather in Paris?"}]


def valid_calls(calls, names=SCHEMA):
    for c in calls or []:
        if c.type != "function" or c.function.name not in names or not c.id:
            return False
        try:
            jsonschema.validate(json.loads(c.function.arguments), SCHEMA[c.function.name])
        except (ValueError, jsonschema.ValidationError):
            return False
    return bool(calls)


def check_required(ck, client, model):
    n_ok = n = 0
    for seed in (None, 1, 2, 3, 4):
        for parallel in (True, False):
            kw = dict(temperature=0) if seed is None else dict(temperature=1.0, seed=seed)
            r = client.chat.completions.create(model=model, messages=Q, tools=TOOLS, tool_choice="required",
                                               parallel_tool_calls=parallel, max_tokens=400, **kw)
            ch = r.choices[0]
            ok = valid_calls(ch.message.tool_calls) and ch.finish_reason == "tool_calls" and \
                (parallel or len(ch.message.tool_calls) == 1)
            n_ok += ok
            n += 1
            ck(ok, f"required seed {seed} parallel {parallel}: {ch.finish_reason} {ch.message}")
    log(f"tool_choice required: {n_ok}/{n} answers are valid tool calls")
    for name in ("add", "get_weather"):
        for seed in (5, 6):
            r = client.chat.completions.create(model=model, messages=Q, tools=TOOLS, max_tokens=400,
                                               tool_choice={"type": "function", "function": {"name": name}},
                                               temperature=1.0, seed=seed)
            calls = r.choices[0].message.tool_calls
            ck(valid_calls(calls, {name}) and len(calls) == 1 and r.choices[0].finish_reason == "tool_calls",
               f"named {name} seed {seed}: {r.choices[0].message}")


def check_stream(ck, client, model):
    kw = dict(model=model, messages=Q, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=400)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(stream=True, **kw))
    acc, finish = {}, None
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        for tc in d.tool_calls or []:
            e = acc.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            e["id"] += tc.id or ""
            e["name"] += (tc.function.name or "") if tc.function else ""
            e["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = c.choices[0].finish_reason or finish
    got = [(acc[i]["name"], json.loads(acc[i]["arguments"])) for i in sorted(acc)]
    want = [(t.function.name, json.loads(t.function.arguments)) for t in whole]
    ck(got == want and finish == "tool_calls" and all(acc[i]["id"] for i in acc),
       f"streamed tool_calls deltas {got} == {want}, finish {finish}")
    ck(not any(c.choices and c.choices[0].delta.content for c in chunks), "no content deltas beside the calls")


def check_round_trip(ck, s, client, model):
    r = client.chat.completions.create(model=model, messages=Q, tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=400)
    msg = r.choices[0].message
    call = msg.tool_calls[0]
    follow = Q + [msg.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": "{\"temp\": 21}"}]
    r2 = client.chat.completions.create(model=model, messages=follow, tools=TOOLS, temperature=0, max_tokens=20)
    ck(r2.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"follow-up answered: {r2.choices[0]}")
    ids = s.post_json("/tokenize", {"messages": follow, "tools": TOOLS})["tokens"]
    text = s.post_json("/detokenize", {"tokens": ids})["prompt"]
    ck("<tools>" in text and '"name": "get_weather"' in text, "the tools are in the prompt")
    ck(f'"name": "{call.function.name}"' in text and "<tool_call>" in text, "the assistant's call is in the prompt")
    ck("<tool_response>\n{\"temp\": 21}\n</tool_response>" in text, f"the tool's answer is in the prompt: {text[-300:]!r}")
    ck(text.rstrip().endswith("<|im_start|> assistant"), f"the generation prompt follows: {text[-40:]!r}")


def check_choices(ck, s, client, model):
    r = client.chat.completions.create(model=model, messages=Q, tools=TOOLS, tool_choice="none",
                                       temperature=0, max_tokens=30)
    ck(not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length"), "tool_choice none")
    r = client.chat.completions.create(model=model, messages=Q, tools=TOOLS, temperature=0, max_tokens=60)
    m = r.choices[0].message
    ck((m.tool_calls and valid_calls(m.tool_calls)) or "<tool_call>" not in (m.content or ""),
       f"tool_choice auto: calls parsed or plain content: {m}")
    bad = [({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
           ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
           ({"tool_choice": "required"}, "tool_choice"),
           ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
           ({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]},
            "messages[0].tool_calls")]
    for extra, param in bad:
        body = {"messages": Q, **extra}
        st, data = s.post("/v1/chat/completions", body)
        ck(st == 400 and json.loads(data)["error"]["param"] == param, f"bad {param}: {st} {data[:200]!r}")


def main():
    ck = Check("tool_calls")
    with Server() as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        check_required(ck, client, s.model_id)
        check_stream(ck, client, s.model_id)
        check_round_trip(ck, s, client, s.model_id)
        check_choices(ck, s, client, s.model_id)
        s.wait_idle()
    with Server(["--tool-call-parser", "none"]) as s:
        st, data = s.post("/v1/chat/completions", {"messages": Q, "tools": TOOLS})
        ck(st == 400 and json.loads(data)["error"]["param"] == "tools", f"--tool-call-parser none: {st}")
    ck.done()


if __name__ == "__main__":
    main()
