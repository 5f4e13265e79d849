#!/usr/bin/env python3
"""Tokenizes an eval set with Hugging Face's tokenizer and chat template, as the reference
did (BOS + ChatML prompt), so the model can be checked against reference outputs without our
own tokenizer in the loop. Usage: pretokenize_eval.py MODEL_DIR EVAL.jsonl REFERENCE.jsonl OUT.jsonl"""
import json
import sys

from transformers import AutoTokenizer

model_dir, eval_path, ref_path, out_path = sys.argv[1:5]
tok = AutoTokenizer.from_pretrained(model_dir)
rows = [json.loads(l) for l in open(eval_path)]
refs = [json.loads(l) for l in open(ref_path)]
assert len(rows) == len(refs), "eval and reference differ in length"
with open(out_path, "w") as f:
    for row, ref in zip(rows, refs):
        enc = tok.apply_chat_template([{"role": "user", "content": row["question"]}],
                                      add_generation_prompt=True, tokenize=True)
        ids = enc["input_ids"] if hasattr(enc, "keys") else enc
        assert len(ids) == ref["prompt_tokens"], (len(ids), ref["prompt_tokens"])
        f.write(json.dumps({"prompt_ids": ids, "output_ids": ref["output_ids"],
                            "task": row["task"], "correct": ref["correct"]}) + "\n")
