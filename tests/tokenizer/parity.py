#!/usr/bin/env python3
"""Parity of the SALA tokenizer with Hugging Face (transformers AutoTokenizer / tokenizers).

  parity.py --tool build/tests/tokenizer/tokenizer_tool --tokenizer NAME|DIR

NAME: sala-tiny-chat (models/sala-tiny-chat), spm-1200, hfbpe-3000, spm-only
(tests/tokenizer/assets/NAME), or a directory. Compares, on a corpus of English, Chinese,
Japanese, emoji, code, whitespace runs, control characters, invalid UTF-8, special-token
strings, random Unicode and 100K-character inputs:
  * encode ids (with / without special tokens) vs AutoTokenizer.encode
  * decode (skip_special_tokens true / false) vs AutoTokenizer.decode, on the encoded ids
    and on random id sequences (byte tokens, special tokens, anything in the vocabulary)
  * the streaming detokenizer (concatenated pieces, each valid UTF-8) vs one-shot decode
  * stop strings (SGLang semantics: cut before the first stop string found after a token)
  * chat template vs apply_chat_template (text and token ids)
For the sentencepiece-only tokenizer (no tokenizer.json) the reference is the
sentencepiece library itself and jinja2 for the chat template.
Exits 1 on any mismatch.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

SPECIAL_STRINGS = ["<|im_end|>", "<|im_start|>", "<|tool_call|>", "<|execute_start|>", "<|execute_end|>",
                   "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<s>", "</s>", "<unk>"]

BASE_TEXTS = [
    "", " ", "  ", "a", "Hello world", " Hello world", "Hello world ", "hello\nworld", "Hello, World! It's 3:45pm.",
    "The quick brown fox jumps over the lazy dog.", "I can't believe it's not butter; isn't it?",
    "今天天气很好，我们去公园散步吧。", "机器学习是人工智能的一个分支", "今日はいい天気ですね。東京タワー", "ｶﾀｶﾅ ﾃｽﾄ",
    "한국어 텍스트", "Привет, мир!", "مرحبا بالعالم", "שלום", "नमस्ते दुनिया", "ไทย",
    "I love it 😀👍🎉", "👨‍👩‍👧‍👦 family", "🏳️‍🌈", "e\u0301 combining", "ﬁ ligature", "Ⅻ ½ ² ① ０１２",
    "def main(argv):\n    for i in range(10):\n        print(i * 2)\n    return 0\n",
    "int add(int a, int b) {\n\treturn a + b;\n}\n", "x = {\"k\": [1, 2, 3]}  # comment",
    "    leading four", "trailing four    ", "a" + " " * 37 + "b", "\t\t\tTabs\t\t", "\n\n\n\n", "\r\n\r\n",
    " \n \n ", "mixed \t \n \u3000 \u00a0 spaces", "1234567890", "3.14159 2.71828 -42 +7 1e10",
    "\x00\x01\x02\x03\x1b[31mred\x1b[0m\x7f", "bell\x07 backspace\x08 formfeed\x0c vtab\x0b",
    "\u200b zero width \ufeff bom \u2028 line sep", "\ufffd replacement char", "▁ metaspace ▁▁ char",
    "<0x0A> looks like a byte token", "<s> at start", "ends with </s>", "<unk> in the middle <unk>",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|><|im_start|>", "x<|im_start|>y", "<|im_start|>   spaced", "<|im_", "<|im_start|",
    "<|im_start|>system\nYou are helpful.<|im_end|>", "<think>\n\n</think>\n\n answer",
    "<|tool_call|>{\"name\": \"f\"}<|execute_start|>code<|execute_end|>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "Mixed 中文 and English 混合 text 123 with emoji 🚀 and code `x = 1`.",
    "https://example.com/path?q=1&r=2#frag", "email@example.com", "C:\\Windows\\System32",
    "ALL CAPS TEXT", "snake_case_name camelCaseName", "...!!!???,,,;;;", "—–-‐ “quotes” ‘single’ …",
]


def random_texts(rnd, n):
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789", " ", "  \t\n", ".,;:!?'\"()[]{}<>|/\\-_+=*&^%$#@~`",
        "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从",
        "あいうえおかきくけこアイウエオカキクケコ日本語漢字", "😀😁😂🤣😃😄😅😆😉😊🚀🎉👍🔥💯", "éèêëàâäôöûüçñß", "▁",
    ]
    out = []
    for _ in range(n):
        k = rnd.randint(1, 60)
        s = "".join(rnd.choice(rnd.choice(pools)) for _ in range(k))
        if rnd.random() < 0.3:
            pos = rnd.randint(0, len(s))
            s = s[:pos] + rnd.choice(SPECIAL_STRINGS) + s[pos:]
        if rnd.random() < 0.1:
            s += chr(rnd.randint(0x20, 0xD7FF))
        out.append(s)
    return out


def long_texts(rnd):
    chunks = BASE_TEXTS[5:40]
    out = []
    for target, seed_pool in ((100_000, chunks), (100_000, ["中文文本测试。", "日本語のテキスト。", "English text. "])):
        parts, size = [], 0
        while size < target:
            c = rnd.choice(seed_pool)
            parts.append(c)
            size += len(c)
        out.append("".join(parts)[:target])
    out.append("x" * 100_000)
    out.append(" " * 5000 + "end")
    out.append("1" * 20000)
    return out


INVALID_UTF8 = [
    b"\xff", b"abc\x80def", b"\xc3", b"\xc3\x28", b"\xe4\xb8", b"\xe4\xb8\xad\xe4", b"\xf0\x9f\x98",
    b"\xed\xa0\x80 surrogate", b"\xc0\xaf overlong", b"\xf5\x80\x80\x80", b"ok \xe2\x82 trunc \xe2\x82\xac euro",
    b"\x80\x80\x80", b"<|im_start|>\xff<|im_end|>",
]

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Hi! How can I help?"}, {"role": "user", "content": "Tell me a joke."}],
    [{"role": "user", "content": "Call the tool"}, {"role": "assistant", "content": "<|tool_call|>get_weather(city='Paris')"},
     {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "assistant", "content": "It is 21 degrees."}],
    [{"role": "user", "content": "多行\n内容\n\n 带空格  "}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nOK 😀"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "  leading and trailing  "}],
    [{"role": "system", "content": "sys"}],
    [{"role": "user", "content": "Write code:\n```python\nprint('x')\n```"}, {"role": "assistant", "content": "Done."}],
]


def resolve_dir(name):
    if os.path.isdir(name):
        return name
    if name == "sala-tiny-chat":
        d = os.path.join(ROOT, "models", "sala-tiny-chat")
        if os.path.exists(os.path.join(d, "tokenizer.json")):
            return d
    d = os.path.join(HERE, "assets", name)
    if os.path.isdir(d):
        return d
    sys.exit(f"FAIL: tokenizer {name} not found")


class HfRef:
    def __init__(self, d):
        import transformers
        transformers.logging.set_verbosity_error()
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(d)
        self.vocab_size = len(self.tok)
        self.bos_id = self.tok.bos_token_id if self.tok.bos_token_id is not None else -1
        self.eos_ids = [self.tok.eos_token_id] if self.tok.eos_token_id is not None else []
        self.special = sorted(set(self.tok.all_special_ids))
        self.byte_ids = [i for i in range(self.vocab_size)
                         if (t := self.tok.convert_ids_to_tokens(i)) and len(t) == 6 and t.startswith("<0x")]

    def encode(self, text, add_special):
        return self.tok.encode(text, add_special_tokens=add_special)

    def decode(self, ids, skip):
        return self.tok.decode(ids, skip_special_tokens=skip)

    def chat(self, messages, add_gen, kwargs):
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_gen, **kwargs)

    def chat_ids(self, messages, add_gen, kwargs):
        r = self.tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_gen, **kwargs)
        if isinstance(r, dict) or hasattr(r, "keys"):
            r = r["input_ids"]
        return list(r)


class SpmRef:
    """sentencepiece library + jinja2 (what a slow LlamaTokenizer does with this model)."""

    def __init__(self, d):
        import sentencepiece as spm
        self.sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
        cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
        self.cfg = cfg
        self.vocab_size = self.sp.get_piece_size()
        self.bos_id = self.sp.bos_id()
        self.eos_ids = [self.sp.eos_id()]
        self.special = sorted(i for i in range(self.vocab_size) if self.sp.is_control(i) or self.sp.is_unknown(i))
        self.byte_ids = [i for i in range(self.vocab_size) if self.sp.is_byte(i)]
        import jinja2
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        self.template = env.from_string(cfg["chat_template"])

    def encode(self, text, add_special):
        ids = self.sp.encode(text)
        return ([self.bos_id] if add_special and self.cfg.get("add_bos_token", True) else []) + ids

    def decode(self, ids, skip):
        if not skip:
            return None  # control tokens: no reference semantics, not compared
        return self.sp.decode([i for i in ids if i not in self.special])

    def chat(self, messages, add_gen, kwargs):
        return self.template.render(messages=messages, add_generation_prompt=add_gen,
                                    bos_token=self.sp.id_to_piece(self.bos_id), **kwargs)

    def chat_ids(self, messages, add_gen, kwargs):
        return None


def expected_stop(ref, ids, skip, stops):
    """SGLang-style: after each token (byte-fallback runs complete), look for a stop string in
    the output so far; cut before the earliest (longest on ties) occurrence."""
    byte = set(ref.byte_ids)
    for i in range(1, len(ids) + 1):
        if i < len(ids) and ids[i - 1] in byte:
            continue
        t = ref.decode(ids[:i], skip)
        hits = [(t.find(s), -len(s), s) for s in stops if s in t]
        if hits:
            k, _, s = min(hits)
            return t[:k], True, s
    return ref.decode(ids, skip), False, ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--llama-class", action="store_true",
                    help="copy the tokenizer, declare tokenizer_class LlamaTokenizerFast and compare in "
                         "SALA_TOKENIZER_COMPAT=transformers5 mode (transformers >= 5 rebuilds the pipeline)")
    args = ap.parse_args()
    d = resolve_dir(args.tokenizer)
    env = dict(os.environ)
    tmp_copy = None
    if args.llama_class:
        import shutil
        import transformers
        if int(transformers.__version__.split(".")[0]) < 5:
            sys.exit("FAIL: --llama-class compares with transformers >= 5")
        tmp_copy = tempfile.mkdtemp()
        for f in os.listdir(d):
            if f.startswith("tokenizer") or f.endswith(".jinja"):
                shutil.copy(os.path.join(d, f), tmp_copy)
        cfgp = os.path.join(tmp_copy, "tokenizer_config.json")
        cfg = json.load(open(cfgp))
        cfg["tokenizer_class"] = "LlamaTokenizerFast"
        cfg["add_bos_token"] = True
        cfg["add_eos_token"] = False
        json.dump(cfg, open(cfgp, "w"))
        d = tmp_copy
        env["SALA_TOKENIZER_COMPAT"] = "transformers5"
    spm_only = not os.path.exists(os.path.join(d, "tokenizer.json"))
    ref = SpmRef(d) if spm_only else HfRef(d)
    rnd = random.Random(args.seed)

    cases, expect = [], []

    def add(case, exp):
        cases.append(case)
        expect.append(exp)

    add({"kind": "info"}, {"vocab_size": ref.vocab_size, "bos_id": ref.bos_id, "eos_ids": ref.eos_ids,
                           "special": ref.special})
    texts = BASE_TEXTS + random_texts(rnd, 400) + long_texts(rnd)
    encoded = []
    for t in texts:
        for add_sp in (True, False):
            ids = ref.encode(t, add_sp)
            encoded.append(ids)
            add({"kind": "encode", "text": t, "add_special": add_sp}, {"ids": ids})
    for b in INVALID_UTF8:
        for add_sp in (True, False):
            add({"kind": "encode", "bytes": list(b), "add_special": add_sp},
                {"ids": ref.encode(b.decode("utf-8", errors="replace"), add_sp)})

    id_seqs = [e for e in encoded if len(e) < 3000]
    n = ref.vocab_size
    specials = ref.special
    for _ in range(400):
        k = rnd.randint(1, 40)
        seq = []
        for _ in range(k):
            r = rnd.random()
            if r < 0.35 and ref.byte_ids:
                seq.append(rnd.choice(ref.byte_ids))
            elif r < 0.45:
                seq.append(rnd.choice(specials))
            else:
                seq.append(rnd.randrange(n))
        id_seqs.append(seq)
    # byte-fallback sequences: valid UTF-8 split into byte tokens, plus broken runs
    if ref.byte_ids:
        byte_of = {}
        for i in ref.byte_ids:
            tokstr = ref.tok.convert_ids_to_tokens(i) if not spm_only else ref.sp.id_to_piece(i)
            byte_of[int(tokstr[3:5], 16)] = i
        for s in ["中", "日本語", "😀🎉", "é", "a中b", "€"]:
            bs = list(s.encode())
            id_seqs.append([byte_of[x] for x in bs])
            id_seqs.append([byte_of[x] for x in bs[:-1]])
            id_seqs.append([byte_of[x] for x in bs] + [byte_of[0x80]])
            id_seqs.append([byte_of[x] for x in bs] + encoded[5][1:3] + [byte_of[x] for x in bs[:1]])
    for seq in id_seqs:
        for skip in (False, True):
            exp = ref.decode(seq, skip)
            if exp is None:
                continue
            add({"kind": "decode", "ids": seq, "skip": skip}, {"text": exp})
            add({"kind": "stream", "ids": seq, "skip": skip}, {"text": exp, "valid": True})

    # stop strings: substrings of the decoded text and strings that never occur
    for seq in id_seqs[:300]:
        skip = rnd.random() < 0.5
        full = ref.decode(seq, skip)
        if full is None:
            continue
        stops = []
        if len(full) >= 2:
            a = rnd.randrange(len(full) - 1)
            stops.append(full[a:a + rnd.randint(1, min(6, len(full) - a))])
        stops.append("\u0000never\u0000")
        if rnd.random() < 0.5 and len(full) > 4:
            stops.append(full[-3:])
        text, stopped, matched = expected_stop(ref, seq, skip, stops)
        add({"kind": "stream", "ids": seq, "skip": skip, "stops": stops},
            {"stop_text": text, "stopped": stopped, "matched": matched, "valid": True})

    for conv in CONVERSATIONS:
        for add_gen in (False, True):
            for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
                text = ref.chat(conv, add_gen, kwargs)
                add({"kind": "chat", "messages": conv, "add_generation_prompt": add_gen, "kwargs": kwargs},
                    {"text": text})
                ids = ref.chat_ids(conv, add_gen, kwargs)
                if ids is not None:
                    add({"kind": "encode", "text": text, "add_special": False}, {"ids": ids})

    with tempfile.TemporaryDirectory() as tmp:
        cin, cout = os.path.join(tmp, "cases.jsonl"), os.path.join(tmp, "out.jsonl")
        with open(cin, "w") as f:
            for c in cases:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        r = subprocess.run([args.tool, d, cin, cout], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            sys.exit(f"FAIL: tokenizer_tool exited with {r.returncode}")
        got = [json.loads(l) for l in open(cout)]
    if len(got) != len(cases):
        sys.exit(f"FAIL: {len(got)} results for {len(cases)} cases")

    mismatches = 0
    by_kind = {}
    for c, e, g in zip(cases, expect, got):
        kind = c["kind"]
        by_kind.setdefault(kind, [0, 0])
        by_kind[kind][0] += 1
        bad = [k for k in e if g.get(k) != e[k]]
        if bad:
            mismatches += 1
            by_kind[kind][1] += 1
            if mismatches <= 15:
                short = {k: (v[:200] if isinstance(v, (str, list)) else v) for k, v in c.items()}
                print(f"MISMATCH {kind} {json.dumps(short, ensure_ascii=False)}")
                for k in bad:
                    ev, gv = e[k], g.get(k)
                    print(f"   {k}: expected {json.dumps(ev, ensure_ascii=False)[:300]}")
                    print(f"   {k}:      got {json.dumps(gv, ensure_ascii=False)[:300]}")
    summary = ", ".join(f"{k} {v[0]} ({v[1]} bad)" for k, v in sorted(by_kind.items()))
    print(f"{args.tokenizer}: {len(cases)} cases: {summary}; mismatches = {mismatches}")
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
