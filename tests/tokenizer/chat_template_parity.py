#!/usr/bin/env python3
"""Chat-template parity: SALA's Jinja-subset interpreter (src/tokenizer/jinja.cpp, through
chat_template_tool) vs jinja2 as transformers' apply_chat_template runs it
(ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols) + tojson +
raise_exception, taken from transformers itself).

For each template in assets/chat_templates/*.jinja and each conversation x
add_generation_prompt x enable_thinking (absent/true/false) x tools (none / a list):
  * kind "jinja": the interpreter with the full context (tool calls, reasoning_content, ...)
    vs transformers' compiled template rendered with the same globals;
  * kind "chat": sala::ChatTemplate (the server path, bos/eos from the model's tokenizer) vs
    tokenizer.apply_chat_template(chat_template=...): role/content conversations, and for
    templates that render tools themselves also the tool conversations with and without tools
    (OpenAI's shapes on our side: tool_calls' arguments as JSON text, which the server hands to
    the template as objects, as vLLM does; so transformers gets them as objects).
A case where jinja2 raises must fail in SALA too (error vs error). Templates named
unsupported-*.jinja must be refused at parse time; edge-*.jinja are small synthetic
templates for whitespace control / literals / filters corner cases. Zero mismatches are
required.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather for a city — 天气",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                                                       "b": {"type": "number"}}}}},
]

PLAIN = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Hi! How can I help?"}, {"role": "user", "content": "Tell me a joke."}],
    [{"role": "user", "content": "多行\n内容\n\n 带空格  "}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nOK 😀"},
     {"role": "user", "content": "again?"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "  leading and trailing  "}],
    [{"role": "user", "content": "Quote ' and \" and \\ and {{ braces }} {% tags %}"},
     {"role": "assistant", "content": "<think>\nreasoning here\n</think>\n\nanswer"}],
    [{"role": "user", "content": "Call the tool"}, {"role": "assistant", "content": "calling"},
     {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "assistant", "content": "It is 21 degrees."}],
]

RICH = [
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
     {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "{\"rain\": false}"},
     {"role": "assistant", "content": "21 degrees, no rain."}],
    [{"role": "user", "content": "Add 1 and 2"},
     {"role": "assistant", "content": "Let me add.", "reasoning_content": "\nuse the add tool\n",
      "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}},
                     {"type": "function", "function": {"name": "add", "arguments": {"a": 1.5, "b": -2}}}]},
     {"role": "tool", "content": "3"}],
    [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
     {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>\nr2\n</think>\n\na2"}],
    [{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}, {"role": "assistant", "content": "ok"}],
]


def openai_messages(conv):
    """As a client sends them: tool_calls' arguments as JSON text."""
    out = []
    for m in conv:
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": c["function"]["arguments"]
                                if isinstance(c["function"]["arguments"], str)
                                else json.dumps(c["function"]["arguments"])}} for c in m["tool_calls"]]
        out.append(m)
    return out


def hf_messages(conv):
    """As the server hands them to the template: arguments as objects (vLLM does the same)."""
    out = []
    for m in openai_messages(conv):
        if "tool_calls" in m:
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--model", required=True, help="model dir whose tokenizer provides bos/eos")
    args = ap.parse_args()
    model = args.model
    if not os.path.exists(os.path.join(model, "tokenizer.json")):
        sys.exit(f"FAIL: no tokenizer in {args.model}")

    import transformers
    transformers.logging.set_verbosity_error()
    from transformers import AutoTokenizer
    from transformers.utils.chat_template_utils import _compile_jinja_template
    tok = AutoTokenizer.from_pretrained(model)
    specials = {"bos_token": tok.bos_token, "eos_token": tok.eos_token}

    templates = sorted(glob.glob(os.path.join(HERE, "assets", "chat_templates", "*.jinja")))
    total = mismatches = refused_ok = 0
    per_template = {}
    for path in templates:
        name = os.path.basename(path)[:-len(".jinja")]
        text = open(path, encoding="utf-8").read()
        cases, expect = [], []
        try:
            compiled = _compile_jinja_template(text)
        except Exception as e:  # jinja2 itself cannot parse it: not a useful test asset
            sys.exit(f"FAIL: jinja2 cannot compile {name}: {e}")
        for conv in PLAIN + RICH:
            for add_gen in (False, True):
                for kwargs in ({}, {"enable_thinking": True}, {"enable_thinking": False}):
                    for tools in (None, TOOLS):
                        ctx = dict(specials)
                        ctx.update(kwargs)
                        ctx.update(messages=conv, tools=tools, documents=None, add_generation_prompt=add_gen)
                        try:
                            exp = {"text": compiled.render(**ctx)}
                        except Exception as e:
                            exp = {"error": f"{type(e).__name__}: {e}"}
                        cases.append({"kind": "jinja", "context": ctx})
                        expect.append(exp)
                    renders_tools = "tools" in text or "tool_calls" in text
                    if conv in PLAIN or (renders_tools and not any("reasoning_content" in m for m in conv)):
                        for tools in ((None, TOOLS) if renders_tools else (None,)):
                            try:
                                exp = {"text": tok.apply_chat_template(
                                    hf_messages(conv), chat_template=text, tokenize=False,
                                    add_generation_prompt=add_gen, tools=tools, **kwargs)}
                            except Exception as e:
                                exp = {"error": f"{type(e).__name__}: {e}"}
                            case = {"kind": "chat", "messages": openai_messages(conv),
                                    "add_generation_prompt": add_gen, "kwargs": kwargs}
                            if tools:
                                case["tools"] = tools
                            cases.append(case)
                            expect.append(exp)
        with tempfile.TemporaryDirectory() as tmp:
            cin, cout = os.path.join(tmp, "cases.jsonl"), os.path.join(tmp, "out.jsonl")
            with open(cin, "w", encoding="utf-8") as f:
                for c in cases:
                    f.write(json.dumps(c, ensure_ascii=False) + "\n")
            r = subprocess.run([args.tool, path, model, cin, cout], capture_output=True, text=True)
            if r.returncode != 0:
                print(r.stdout, r.stderr)
                sys.exit(f"FAIL: chat_template_tool exited with {r.returncode} on {name}")
            got = [json.loads(l) for l in open(cout, encoding="utf-8")]
        if len(got) != len(cases):
            sys.exit(f"FAIL: {len(got)} results for {len(cases)} cases ({name})")

        if name.startswith("unsupported"):
            bad = [g for g in got if "error" not in g or "unsupported" not in g["error"]]
            total += len(cases)
            if bad:
                mismatches += len(bad)
                print(f"MISMATCH {name}: expected a clean refusal, got {json.dumps(bad[0])[:300]}")
            else:
                refused_ok += 1
                print(f"{name}: refused as expected: {got[0]['error']} | {got[-1]['error']}")
            per_template[name] = (len(cases), len(bad))
            continue

        bad_n = 0
        for c, e, g in zip(cases, expect, got):
            total += 1
            if "error" in e:
                ok = "error" in g
                # raise_exception(msg): the message must come through
                if ok and e["error"].startswith("TemplateError: "):
                    ok = e["error"][len("TemplateError: "):] in g["error"]
            else:
                ok = g.get("text") == e["text"]
            if not ok:
                bad_n += 1
                mismatches += 1
                if mismatches <= 12:
                    ctx = c.get("context", c)
                    print(f"MISMATCH {name} kind={c['kind']} add_gen={ctx.get('add_generation_prompt')} "
                          f"kwargs={ {k: v for k, v in ctx.items() if k == 'enable_thinking'} or c.get('kwargs')} "
                          f"tools={'yes' if ctx.get('tools') else 'no'} "
                          f"messages={json.dumps(ctx.get('messages'), ensure_ascii=False)[:200]}")
                    print(f"   expected {json.dumps(e, ensure_ascii=False)[:600]}")
                    print(f"        got {json.dumps(g, ensure_ascii=False)[:600]}")
        n_err = sum(1 for e in expect if "error" in e)
        per_template[name] = (len(cases), bad_n)
        print(f"{name}: {len(cases)} cases ({n_err} where jinja2 raises), {bad_n} mismatches")
    print(f"chat templates: {len(templates)} templates, {total} cases, mismatches = {mismatches}")
    if not any(n.startswith("unsupported") for n in per_template) or refused_ok == 0:
        sys.exit("FAIL: no unsupported-template refusal was checked")
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
