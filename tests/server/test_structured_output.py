"""Structured output on `sala serve` (tiny model, CPU): the model's free outputs are not JSON,
so every valid output below is the grammar engine's doing (xgrammar through the token mask).
  * a set of JSON schemas (required fields, enums, arrays, nesting, numbers, patterns) through
    chat response_format json_schema, sampled at temperature 1 with several seeds and greedy:
    every output must parse and validate (jsonschema), finish "stop" — a 100 % valid rate;
  * json_object, vLLM's guided_json / guided_choice / structured_outputs, streaming;
  * SGLang /generate regex (fullmatch), ebnf (parsed), json_schema;
  * the openai SDK's chat.completions.parse with a Pydantic model;
  * bad schemas / regexes / grammars: 400 naming the parameter, OpenAI error shape."""
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, List, Literal

import jsonschema
import openai
import pydantic

from common import Check, Server, log

SCHEMAS = {
    "required_fields": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "active": {"type": "boolean"}}, "required": ["name", "age", "active"]},
    "enums": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]}},
        "required": ["color", "size"]},
    "arrays": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 4},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "maxItems": 3}},
        "required": ["tags", "scores"]},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 9999},
            "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"]}}, "required": ["id", "address"]}},
        "required": ["user"]},
    "numbers": {"type": "object", "properties": {
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "count": {"type": "integer", "minimum": 10, "maximum": 20}}, "required": ["ratio", "count"]},
    "patterns": {"type": "object", "properties": {
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}}, "required": ["date", "code"]},
    "array_of_objects": {"type": "array", "items": {"type": "object", "properties": {
        "k": {"type": "string", "maxLength": 4}, "v": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["k", "v"]}, "minItems": 1, "maxItems": 3},
    "optional_and_anyof": {"type": "object", "properties": {
        "id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "null"}]},
        "note": {"type": "string", "maxLength": 8}}, "required": ["id"]},
}
SEEDS = [None, 1, 2, 3, 4, 5]  # None: greedy
MAX_TOKENS = 300


def chat_json(client, model, schema, seed):
    kw = dict(model=model, messages=[{"role": "user", "content": "Reply in JSON."}], max_tokens=MAX_TOKENS,
              response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}})
    kw.update(temperature=0) if seed is None else kw.update(temperature=1.0, seed=seed)
    r = client.chat.completions.create(**kw)
    return r.choices[0].message.content, r.choices[0].finish_reason


def check_schemas(ck, client, model):
    jobs = [(name, schema, seed) for name, schema in SCHEMAS.items() for seed in SEEDS]
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda j: chat_json(client, model, j[1], j[2]), jobs))
    valid = 0
    for (name, schema, seed), (text, finish) in zip(jobs, outs):
        try:
            jsonschema.validate(json.loads(text), schema)
            ok = finish == "stop"
        except (ValueError, jsonschema.ValidationError) as e:
            ok = False
            log(f"  {name} seed {seed}: {e}")
        valid += ok
        ck(ok, f"schema {name} seed {seed}: {finish} {text!r}")
    log(f"json_schema: {valid}/{len(jobs)} outputs schema-valid ({100.0 * valid / len(jobs):.1f} %)")
    log("  e.g. " + "; ".join(t for t, _ in outs[::len(SEEDS)]))


def check_openai_variants(ck, s, client, model):
    q = [{"role": "user", "content": "Hi"}]
    # json_object bounds no string: sampled, the tiny model writes keys until the budget ends.
    # Greedy, these prompts close the object (their free replies are plain text).
    for prompt in ("Hi", "What is 2+2?"):
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=MAX_TOKENS, temperature=0, response_format={"type": "json_object"})
        text = r.choices[0].message.content
        try:
            ok = isinstance(json.loads(text), dict)
        except ValueError:
            ok = False
        ck(ok and r.choices[0].finish_reason == "stop", f"json_object {prompt!r}: {text!r}")
    schema = SCHEMAS["enums"]
    r = client.chat.completions.create(model=model, messages=q, max_tokens=MAX_TOKENS, temperature=0,
                                       extra_body={"guided_json": schema})
    ck(_valid(r.choices[0].message.content, schema), f"guided_json: {r.choices[0].message.content!r}")
    r = client.completions.create(model=model, prompt="Pick:", max_tokens=20, temperature=1.0, seed=3,
                                  extra_body={"guided_choice": ["alpha", "beta (b)", "c.d"]})
    ck(r.choices[0].text in ("alpha", "beta (b)", "c.d"), f"guided_choice: {r.choices[0].text!r}")
    r = client.completions.create(model=model, prompt="Pick:", max_tokens=40, temperature=1.0, seed=4,
                                  extra_body={"structured_outputs": {"regex": "[a-c]{2,4}-[0-9]+"}})
    ck(re.fullmatch("[a-c]{2,4}-[0-9]+", r.choices[0].text) is not None or r.choices[0].finish_reason == "length",
       f"structured_outputs regex: {r.choices[0].text!r}")
    r = client.chat.completions.create(model=model, messages=q, max_tokens=MAX_TOKENS, temperature=0,
                                       extra_body={"structured_outputs": {"json": SCHEMAS["numbers"]}})
    ck(_valid(r.choices[0].message.content, SCHEMAS["numbers"]), f"structured_outputs json: {r.choices[0].message.content!r}")
    # Streaming: the deltas add up to a valid document.
    schema = SCHEMAS["nested"]
    chunks = list(client.chat.completions.create(
        model=model, messages=q, max_tokens=MAX_TOKENS, temperature=1.0, seed=7, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ck(_valid(text, schema) and chunks[-1].choices[0].finish_reason == "stop", f"streamed json_schema: {text!r}")


class Person(pydantic.BaseModel):  # bounded strings: the tiny model would not end a free one
    name: str = pydantic.Field(max_length=10)
    age: int = pydantic.Field(ge=0, le=99)
    kind: Literal["a", "b"]
    friends: List[Annotated[str, pydantic.Field(max_length=8)]] = pydantic.Field(max_length=2)


def check_sdk_parse(ck, client, model):
    for seed in (11, 12):
        r = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": "A person"}],
                                          response_format=Person, temperature=1.0, seed=seed, max_tokens=MAX_TOKENS)
        p = r.choices[0].message.parsed
        ck(isinstance(p, Person), f"chat.completions.parse seed {seed}: {r.choices[0].message.content!r}")


def _valid(text, schema):
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def parse_arith(t):
    """expr ::= term ("+" term)*; term ::= num | "(" expr ")"; num ::= [1-9][0-9]? — True if t is one."""
    pos = 0

    def term():
        nonlocal pos
        if t.startswith("(", pos):
            pos += 1
            if not expr() or not t.startswith(")", pos):
                return False
            pos += 1
            return True
        m = re.match(r"[1-9][0-9]?", t[pos:])
        if not m:
            return False
        pos += m.end()
        return True

    def expr():
        nonlocal pos
        if not term():
            return False
        while t.startswith("+", pos):
            pos += 1
            if not term():
                return False
        return True

    return expr() and pos == len(t)


def check_generate(ck, s):
    regexes = [r"(yes|no)", r"[0-9]{3}-[0-9]{4}", r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)", r"(\+|-)?[0-9]{1,3}(\.[0-9]{1,2})?"]
    for rx in regexes:
        for seed in (1, 2, 3):
            g = s.post_json("/generate", {"text": "Answer:", "sampling_params": {
                "regex": rx, "temperature": 1.0, "sampling_seed": seed, "max_new_tokens": 64}})
            ck(re.fullmatch(rx, g["text"]) is not None and g["meta_info"]["finish_reason"]["type"] == "stop",
               f"/generate regex {rx} seed {seed}: {g['text']!r} {g['meta_info']['finish_reason']}")
    ebnf = 'root ::= expr\nexpr ::= term ("+" term)*\nterm ::= num | "(" expr ")"\nnum ::= [1-9] [0-9]?'
    for seed in (1, 2, 3, 4):
        g = s.post_json("/generate", {"text": "Sum:", "sampling_params": {
            "ebnf": ebnf, "temperature": 1.0, "sampling_seed": seed, "max_new_tokens": 48}})
        fin = g["meta_info"]["finish_reason"]["type"]
        # A sampled expression may still be open at the token budget; a finished one must parse.
        ck(parse_arith(g["text"]) if fin == "stop" else fin == "length", f"/generate ebnf seed {seed}: {g['text']!r} {fin}")
    schema = SCHEMAS["arrays"]
    g = s.post_json("/generate", {"text": "JSON:", "sampling_params": {
        "json_schema": json.dumps(schema), "temperature": 0, "max_new_tokens": MAX_TOKENS}})
    ck(_valid(g["text"], schema), f"/generate json_schema: {g['text']!r}")


def check_errors(ck, s, model):
    msgs = [{"role": "user", "content": "x"}]
    cases = [
        ("/v1/chat/completions", {"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "no-such-type"}}}}, "response_format"),
        ("/v1/chat/completions", {"messages": msgs, "response_format": {"type": "json_schema"}}, "response_format"),
        ("/v1/chat/completions", {"messages": msgs, "response_format": {"type": "xml"}}, "response_format"),
        ("/v1/chat/completions", {"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": "{not json"}}}, "response_format.json_schema.schema"),
        ("/v1/chat/completions", {"messages": msgs, "guided_regex": "(unclosed"}, "guided_regex"),
        ("/v1/chat/completions", {"messages": msgs, "guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex"),
        ("/v1/completions", {"prompt": "x", "guided_grammar": "root ::= undefined"}, "guided_grammar"),
        ("/v1/completions", {"prompt": "x", "guided_choice": []}, "guided_choice"),
        ("/v1/completions", {"prompt": "x", "structured_outputs": {"json": 5}}, "structured_outputs.json"),
        ("/generate", {"text": "x", "sampling_params": {"regex": "a{2,1}"}}, "regex"),
        ("/generate", {"text": "x", "sampling_params": {"ebnf": "root ::= "}}, "ebnf"),
        ("/generate", {"text": "x", "sampling_params": {"json_schema": "[1, 2"}}, "json_schema"),
    ]
    for path, body, param in cases:
        st, data = s.post(path, body)
        err = json.loads(data).get("error", {}) if data.startswith(b"{") else {}
        ck(st == 400 and err.get("param") == param and err.get("type") == "invalid_request_error"
           and err.get("message"), f"{path} {param}: want 400 naming it, got {st} {data[:300]!r}")
    ck(s.alive(), "the server survived every bad grammar")


def main():
    ck = Check("structured_output")
    with Server() as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        check_schemas(ck, client, s.model_id)
        check_openai_variants(ck, s, client, s.model_id)
        check_sdk_parse(ck, client, s.model_id)
        check_generate(ck, s)
        check_errors(ck, s, s.model_id)
        s.wait_idle()
    ck.done()


if __name__ == "__main__":
    main()
