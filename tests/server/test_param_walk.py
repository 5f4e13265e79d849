"""No silently ignored parameter: walks the parameter lists of the OpenAI API reference (chat
completions, completions; the lists of the openai SDK's typed params), vLLM's extensions and
SGLang's SamplingParams / GenerateReqInput, sends each with a non-default value and checks it is
implemented (200, and its effect where cheap to see) or refused (400 naming it). The tables
below are the server's contract; a parameter added to a list must get a row.

Kinds: I implemented; N accepted with no effect by definition (ids, caching hints, metadata, a
value that asks for what the server does anyway); R refused; L log probabilities (implemented
elsewhere: 200, or 400 naming it).
"""
import json

import openai

from common import Check, Server, log

I, N, R, L = "implemented", "no effect", "refused", "logprobs"

CONSTRAINTS = [  # structured output (xgrammar; effects: test_structured_output.py)
    ("regex", "a+", I), ("ebnf", "root ::= \"a\"", I), ("json_schema", "{\"type\": \"object\"}", I),
    ("structural_tag", "{}", R), ("guided_json", {"type": "object"}, I), ("guided_regex", "a+", I),
    ("guided_choice", ["a", "b"], I), ("guided_grammar", "root ::= \"a\"", I),
    ("guided_decoding_backend", "xgrammar", N), ("guided_decoding_backend", "outlines", R),
    ("guided_whitespace_pattern", " ", R),
    ("structured_outputs", {"regex": "a"}, I), ("structured_outputs", {"structural_tag": "{}"}, R),
    ("stop_regex", "a+", R), ("bad_words", ["x"], R), ("allowed_token_ids", [1, 2], R),
]

# Shared by chat and completions: OpenAI's sampling fields and the vLLM / SGLang extensions.
COMMON = [
    ("model", None, I), ("frequency_penalty", 0.5, I), ("presence_penalty", 0.5, I),
    ("logit_bias", {"5": 1.0}, I), ("logprobs", None, L), ("max_tokens", 3, I), ("n", 2, I),
    ("seed", 5, I), ("stop", ["\n"], I), ("stream", True, I), ("stream_options", {"include_usage": True}, I),
    ("temperature", 0.7, I), ("top_p", 0.9, I), ("user", "u1", N),
    ("top_k", 5, I), ("min_p", 0.1, I), ("repetition_penalty", 1.1, I), ("min_tokens", 2, I),
    ("stop_token_ids", [5], I), ("ignore_eos", True, I), ("skip_special_tokens", False, I),
    ("include_stop_str_in_output", True, I), ("no_stop_trim", True, I),
    ("spaces_between_special_tokens", False, I), ("request_id", "req-1", N),
    ("response_format", {"type": "text"}, I), ("response_format", {"type": "json_object"}, I),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}, I),
    ("response_format", {"type": "structural_tag"}, R),
    ("service_tier", "auto", N), ("service_tier", "priority", R), ("store", False, N), ("store", True, R),
    ("metadata", {"a": "b"}, N), ("safety_identifier", "s", N), ("prompt_cache_key", "k", N),
    ("prompt_cache_retention", "24h", N),
    ("prompt_logprobs", 1, L), ("return_tokens_as_token_ids", True, L),
    ("use_beam_search", True, R), ("length_penalty", 1.5, R), ("truncate_prompt_tokens", 5, R),
    ("custom_logit_processor", "x", R), ("custom_params", {"a": 1}, R), ("logits_processors", ["x"], R),
    ("lora_path", "adapter", R), ("return_hidden_states", True, R), ("session_params", {"id": "x"}, R),
    ("priority", 1, R), ("mm_processor_kwargs", {"a": 1}, R), ("image_data", "x", R),
] + CONSTRAINTS

CHAT = COMMON + [
    ("messages", None, I), ("max_completion_tokens", 3, I), ("top_logprobs", 2, L),
    ("audio", {"voice": "alloy", "format": "wav"}, R), ("function_call", {"name": "f"}, R),
    ("function_call", "none", N), ("functions", [{"name": "f", "parameters": {}}], R),
    ("modalities", ["text"], I), ("modalities", ["text", "audio"], R), ("parallel_tool_calls", True, I),
    ("prediction", {"type": "content", "content": "x"}, R), ("reasoning_effort", "low", I),
    ("tool_choice", "none", I), ("tool_choice", "required", R),  # required without tools: 400
    ("tools", [{"type": "function", "function": {"name": "f"}}], I), ("verbosity", "low", R),
    ("web_search_options", {}, R), ("moderation", {"enabled": True}, R), ("prompt_cache_options", {"a": 1}, N),
    ("add_generation_prompt", False, I), ("continue_final_message", True, I), ("echo", True, I),
    ("add_special_tokens", True, I), ("chat_template_kwargs", {"enable_thinking": False}, I),
    ("chat_template", "{{ messages }}", R), ("documents", [{"text": "x"}], R),
]

COMPLETIONS = COMMON + [
    ("prompt", None, I), ("best_of", 1, I), ("best_of", 2, R), ("echo", True, I), ("suffix", "x", R),
]

GENERATE_SAMPLING = [  # SGLang SamplingParams (python/sglang/srt/sampling/sampling_params.py)
    ("max_new_tokens", 3, I), ("stop", ["\n"], I), ("stop_token_ids", [5], I), ("temperature", 0.7, I),
    ("top_p", 0.9, I), ("top_k", 5, I), ("min_p", 0.1, I), ("frequency_penalty", 0.5, I),
    ("presence_penalty", 0.5, I), ("repetition_penalty", 1.1, I), ("min_new_tokens", 2, I), ("n", 2, I),
    ("ignore_eos", True, I), ("skip_special_tokens", False, I), ("spaces_between_special_tokens", False, I),
    ("no_stop_trim", True, I), ("custom_params", {"a": 1}, R), ("stream_interval", 2, I),
    ("logit_bias", {"5": 1.0}, I), ("sampling_seed", 5, I),
    ("json_schema", "{}", I), ("regex", "a+", I), ("ebnf", "root ::= \"a\"", I), ("structural_tag", "{}", R),
    ("stop_regex", "a+", R),
]

GENERATE_TOP = [  # SGLang GenerateReqInput fields beside text / input_ids / sampling_params
    ("stream", True, I), ("rid", "r1", N), ("return_logprob", True, L), ("top_logprobs_num", 2, L),
    ("logprob_start_len", 0, L), ("return_text_in_logprobs", True, L), ("lora_path", "adapter", R),
    ("image_data", "x", R), ("audio_data", "x", R), ("video_data", "x", R),
    ("custom_logit_processor", "x", R), ("return_hidden_states", True, R), ("session_params", {"id": "x"}, R),
    ("return_routed_experts", True, R),
]


def send(s, path, body):
    if body.get("stream"):
        st, _, events, done = s.stream(path, body)
        return st, (events[0] if st != 200 else {"events": events, "done": done})
    st, data = s.post(path, body)
    return st, json.loads(data)


def judge(ck, where, name, kind, st, resp):
    err = resp.get("error", {}) if isinstance(resp, dict) else {}
    named = name in (err.get("param") or "") or name in (err.get("message") or "")
    if kind in (I, N):
        ck(st == 200, f"{where} {name}: want 200, got {st} {str(resp)[:300]}")
    elif kind == R:
        ck(st == 400 and named, f"{where} {name}: want 400 naming it, got {st} {str(resp)[:300]}")
    else:
        ck(st == 200 or (st == 400 and named), f"{where} {name}: want 200 or 400 naming it, got {st}")
    log(f"{where:>10} {name:32} {kind:12} -> {st} {err.get('message', '') if st != 200 else ''}")


def walk(ck, s):
    msgs = [{"role": "user", "content": "hi"}]
    for name, value, kind in CHAT:
        body = {"model": s.model_id, "messages": msgs, "max_tokens": 4, "temperature": 0}
        if name == "continue_final_message":
            body.update(messages=msgs + [{"role": "assistant", "content": "Hello"}], add_generation_prompt=False)
        if name == "stream_options":
            body["stream"] = True
        if value is not None:
            body[name] = value
        st, resp = send(s, "/v1/chat/completions", body)
        judge(ck, "chat", name, kind, st, resp)
    for name, value, kind in COMPLETIONS:
        body = {"model": s.model_id, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        if name == "stream_options":
            body["stream"] = True
        if value is not None:
            body[name] = value
        st, resp = send(s, "/v1/completions", body)
        judge(ck, "completion", name, kind, st, resp)
    for name, value, kind in GENERATE_SAMPLING:
        sp = {"max_new_tokens": 4, "temperature": 0, name: value}
        st, resp = send(s, "/generate", {"text": "Hello", "sampling_params": sp})
        judge(ck, "generate", name, kind, st, resp)
    for name, value, kind in GENERATE_TOP:
        st, resp = send(s, "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 4}, name: value})
        judge(ck, "generate", name, kind, st, resp)


def effects(ck, s, client):
    """The documented effect of the implemented parameters, where it is cheap to see."""
    model = s.model_id
    q = [{"role": "user", "content": "What is 426+750?"}]
    # logit_bias +100 on one token makes greedy decoding repeat it
    tok = s.post_json("/tokenize", {"prompt": " copper", "add_special_tokens": False})["tokens"][-1]
    r = client.completions.create(model=model, prompt="Hello", max_tokens=5, temperature=0,
                                  logit_bias={str(tok): 100})
    want = s.post_json("/detokenize", {"tokens": [tok] * 5})["prompt"]
    ck(r.choices[0].text == want, f"logit_bias: {r.choices[0].text!r} == {want!r}")
    r = s.post_json("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 5, "temperature": 0,
                                                                      "logit_bias": {str(tok): 100}}})
    ck(r["text"] == want, f"/generate logit_bias: {r['text']!r}")
    # min_tokens: EOS cannot end the reply before it
    base = client.chat.completions.create(model=model, messages=q, temperature=0, max_tokens=64)
    k = base.usage.completion_tokens
    ck(base.choices[0].finish_reason == "stop" and k < 40, f"the base reply ends by EOS early ({k} tokens)")
    r = client.chat.completions.create(model=model, messages=q, temperature=0, max_tokens=64,
                                       extra_body={"min_tokens": k + 8})
    ck(r.usage.completion_tokens >= k + 8, f"min_tokens {k + 8}: {r.usage.completion_tokens} tokens")
    ck(r.choices[0].message.content.startswith(base.choices[0].message.content),
       "min_tokens: same greedy prefix")
    g = s.post_json("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 30, "temperature": 0,
                                                                      "min_new_tokens": 30}})
    ck(g["meta_info"]["completion_tokens"] == 30, f"min_new_tokens 30: {g['meta_info']}")
    st, data = s.post("/v1/chat/completions", {"messages": q, "max_tokens": 4, "min_tokens": 5})
    ck(st == 400 and json.loads(data)["error"]["param"] == "min_tokens", f"min_tokens > max_tokens: {st}")
    # include_stop_str_in_output / no_stop_trim keep the matched stop string
    full = client.completions.create(model=model, prompt="Hello", max_tokens=16, temperature=0).choices[0].text
    stop = full[4:7]
    cut = client.completions.create(model=model, prompt="Hello", max_tokens=16, temperature=0, stop=[stop])
    kept = client.completions.create(model=model, prompt="Hello", max_tokens=16, temperature=0, stop=[stop],
                                     extra_body={"include_stop_str_in_output": True})
    ck(kept.choices[0].text == cut.choices[0].text + stop and full.startswith(kept.choices[0].text),
       f"include_stop_str_in_output: {kept.choices[0].text!r} == {cut.choices[0].text!r} + {stop!r}")
    g = s.post_json("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 16, "temperature": 0,
                                                                      "stop": [stop], "no_stop_trim": True}})
    ck(g["text"].endswith(stop), f"no_stop_trim: {g['text']!r} ends with {stop!r}")
    # add_generation_prompt / continue_final_message / echo shape the prompt and the reply
    conv = q + [{"role": "assistant", "content": "The answer is"}]
    t = s.post_json("/tokenize", {"messages": conv, "add_generation_prompt": False, "continue_final_message": True})
    text = s.post_json("/detokenize", {"tokens": t["tokens"]})["prompt"]
    ck(text.endswith("The answer is"), f"continue_final_message: the prompt ends inside the message: {text!r}")
    without = s.post_json("/tokenize", {"messages": q, "add_generation_prompt": False})["tokens"]
    with_header = s.post_json("/tokenize", {"messages": q})["tokens"]
    ck(len(without) < len(with_header) and with_header[:len(without)] == without,
       f"add_generation_prompt false: the prompt without the assistant header ({len(without)} < {len(with_header)})")
    r = client.chat.completions.create(model=model, messages=conv, temperature=0, max_tokens=8,
                                       extra_body={"add_generation_prompt": False, "continue_final_message": True,
                                                   "echo": True})
    ck(r.choices[0].message.content.startswith("The answer is"), f"chat echo: {r.choices[0].message.content!r}")
    st, data = s.post("/v1/chat/completions", {"messages": conv, "continue_final_message": True})
    ck(st == 400 and json.loads(data)["error"]["param"] == "continue_final_message",
       f"continue_final_message with add_generation_prompt (default true): 400, got {st}")
    # completions echo; stream_interval on /generate
    r = client.completions.create(model=model, prompt="Hello", max_tokens=3, temperature=0, echo=True)
    ck(r.choices[0].text.startswith("Hello"), f"completions echo: {r.choices[0].text!r}")
    st, _, events, done = s.stream("/generate", {"text": "Hello", "stream": True, "sampling_params": {
        "max_new_tokens": 12, "ignore_eos": True, "stream_interval": 4}})
    ck(st == 200 and done and len(events) <= 4, f"stream_interval 4: {len(events)} chunks for 12 tokens")


def main():
    ck = Check("param_walk")
    with Server() as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        walk(ck, s)
        effects(ck, s, client)
        s.wait_idle()
    ck.done()


if __name__ == "__main__":
    main()
