#!/usr/bin/env python3
"""Builds the small MiniCPM-format test tokenizers under tests/tokenizer/assets/.

Run with the repo venv:  .venv/bin/python scripts/make_test_tokenizers.py [OUT_DIR]

Each tokenizer is a Llama-style BPE with byte fallback and split digits, ids 0..2 =
<unk>, <s>, </s>, ids 3..258 = <0x00>..<0xFF>, and the eight MiniCPM special tokens
(<|im_end|>, <|im_start|>, <|tool_call|>, <|execute_start|>, <|execute_end|>,
<|fim_prefix|>, <|fim_middle|>, <|fim_suffix|>) added at the top of the vocabulary.
They are saved with transformers, so tokenizer.json, tokenizer_config.json and
chat_template.jinja exist, exactly as in a real checkpoint.

  spm-1200   trained with sentencepiece (BPE, byte_fallback, split_digits), converted with
             transformers' LlamaConverter (legacy: Prepend+Replace normalizer, no
             pre-tokenizer, exactly the MiniCPM layout); ChatML template with BOS.
             Also keeps tokenizer.model for the sentencepiece loading path.
  hfbpe-3000 trained with the `tokenizers` BpeTrainer, Metaspace(prepend_scheme=first,
             split) + Digits pre-tokenizer, another vocabulary size and merge list;
             Qwen3/MiniCPM-style ChatML template with enable_thinking.
  spm-only   sentencepiece model only (no tokenizer.json): the libsentencepiece path.
"""
import io
import json
import os
import random
import shutil
import sys

import sentencepiece as spm
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import generate_merges

SPECIALS = ["<|im_end|>", "<|im_start|>", "<|tool_call|>", "<|execute_start|>", "<|execute_end|>",
            "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]

CHATML_BOS = ("{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
              "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_THINK = ("{%- for message in messages %}\n"
                "    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
                "{%- endfor %}\n"
                "{%- if add_generation_prompt %}\n"
                "    {{- '<|im_start|>assistant\\n' }}\n"
                "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
                "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
                "    {%- endif %}\n"
                "{%- endif %}\n")

EN = ["The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
      "Tokenizers split text into pieces; models read the pieces as numbers.",
      "In 2024 the team trained 3 models on 1,024 GPUs for 17 days.",
      "She said: \"don't stop believing\" and left at 10:45 pm.",
      "Attention is all you need, but memory is what you pay for.",
      "The answer is 42. The question is unknown.", "Please summarise the following document."]
ZH = ["今天天气很好，我们去公园散步吧。", "机器学习是人工智能的一个分支。", "这个模型可以处理很长的上下文。",
      "请用中文回答下面的问题。"]
JA = ["今日はいい天気ですね。", "東京は日本の首都です。", "ありがとうございます、またね！"]
CODE = ["def main(argv):\n    for i in range(10):\n        print(i * 2)\n    return 0\n",
        "int add(int a, int b) { return a + b; }\n", "if (x != nullptr && y >= 3) {\n\tz = x->next;\n}\n",
        "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n", "{\"key\": [1, 2, 3], \"ok\": true}\n"]
EMOJI = ["I love it 😀👍🎉", "🚀 launch at 09:00 ✅", "café naïve résumé — “quotes” ‘single’ …"]


def corpus(seed, n):
    rnd = random.Random(seed)
    pools = [EN, ZH, JA, CODE, EMOJI]
    out = []
    for _ in range(n):
        k = rnd.randint(1, 4)
        out.append(" ".join(rnd.choice(rnd.choice(pools)) for _ in range(k)))
    return out


def save(tok_obj, out, chat_template, extra_config=None):
    os.makedirs(out, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok_obj, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": SPECIALS})
    fast.chat_template = chat_template
    fast.save_pretrained(out)
    cfg_path = os.path.join(out, "tokenizer_config.json")
    if extra_config:
        cfg = json.load(open(cfg_path))
        cfg.update(extra_config)
        json.dump(cfg, open(cfg_path, "w"), indent=2, ensure_ascii=False)
    for junk in ("special_tokens_map.json",):
        p = os.path.join(out, junk)
        if os.path.exists(p):
            os.remove(p)


def train_spm(vocab_size, seed):
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(seed, 4000)), model_writer=buf, model_type="bpe",
        vocab_size=vocab_size, byte_fallback=True, split_digits=True, character_coverage=0.9995,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True, remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, num_threads=1,
        normalization_rule_name="identity", minloglevel=2)
    return buf.getvalue()


def make_spm(out, vocab_size, seed):
    os.makedirs(out, exist_ok=True)
    model_path = os.path.join(out, "tokenizer.model")
    with open(model_path, "wb") as f:
        f.write(train_spm(vocab_size, seed))
    sp = spm.SentencePieceProcessor(model_file=model_path)
    # What transformers' LlamaConverter does (legacy=True), written out because its v5 code
    # path for BPE models is broken.
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=generate_merges(vocab), unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    save(tok, out, CHATML_BOS)


def make_hfbpe(out, vocab_size, seed):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True),
        pre_tokenizers.Digits(individual_digits=True)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 259, special_tokens=[], show_progress=False,
                                  min_frequency=2)
    tok.train_from_iterator(corpus(seed, 5000), trainer)
    j = json.loads(tok.to_str())
    learned = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in learned:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in j["model"]["merges"]]
    new = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    new.pre_tokenizer = tok.pre_tokenizer
    new.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    new.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    new.add_special_tokens(["<unk>", "<s>", "</s>"])
    save(new, out, CHATML_THINK)


def make_spm_only(out, vocab_size, seed):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.model"), "wb") as f:
        f.write(train_spm(vocab_size, seed))
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
           "add_eos_token": False, "tokenizer_class": "LlamaTokenizer", "chat_template": CHATML_BOS}
    json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "tokenizer", "assets")
    for name in ("spm-1200", "hfbpe-3000", "spm-only"):
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    make_spm(os.path.join(root, "spm-1200"), 1200, 1)
    make_hfbpe(os.path.join(root, "hfbpe-3000"), 3000, 2)
    make_spm_only(os.path.join(root, "spm-only"), 700, 3)
    print("wrote", os.path.abspath(root))


if __name__ == "__main__":
    main()
