"""lm-evaluation-harness (PyPI lm_eval, unchanged, its own CLI) against `sala serve` on the
bundled tiny model (CPU, fp32): a local multiple-choice task (loglikelihood) and two local
generate-until tasks, one ending at a plain-text stop sequence (tests/server/lm_eval_tasks/, data from tests/fixtures/eval/tiny-chat.jsonl),
each through the `local-completions` model (/v1/completions: echo + logprobs, and the server's
/tokenize + /tokenizer_info as lm-eval's remote tokenizer) and the `sglang-generate` model
(/generate: return_logprob with logprob_start_len 0, token-id prompts, the HF tokenizer).

The reference is computed here without the server: the same requests tokenized with the
model's tokenizer.json (lm-eval's context/continuation split), scored by `sala score` (log_softmax
of the model's own fp32 logits, greedy argmax continuations), then scored as the task says
(acc: the choice of largest loglikelihood; exact_match: the text up to the stop string equals
gold). Every per-document loglikelihood, every generated text and the aggregate scores must
equal the reference."""
import glob
import json
import os
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer

from common import EVAL_DIR, HERE, MODEL_DIR, Check, Server, log, sala_bin

TASKS_DIR = os.path.join(HERE, "lm_eval_tasks")
TASKS = ("sala_mc", "sala_gen", "sala_stop")
MC_DOCS = 12               # "mcq" rows: 48 loglikelihood requests per model type
GEN_COPY, GEN_ARITH = 4, 4  # generate-until rows
MC_PROMPT = "<s><|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\nANSWER:"
GEN_PROMPT = "<s><|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
LETTERS = "ABCD"
MAX_GEN = 24
STOP = ["<|im_end|>", "</s>"]  # the task's until + the EOS text lm-eval adds
LL_TOL = 2e-4               # fp32 sums of a few logprobs: the engine's GEMM vs this forward's


def build_data(tmp):
    rows = [json.loads(line) for line in open(os.path.join(EVAL_DIR, "tiny-chat.jsonl"))]
    mc = [{"question": r["question"], "label": LETTERS.index(r["gold"][-1])}
          for r in rows if r["kind"] == "mcq"][:MC_DOCS]
    gen = ([{"question": r["question"], "gold": r["gold"]} for r in rows if r["kind"] == "copy"][:GEN_COPY] +
           [{"question": r["question"], "gold": r["gold"]} for r in rows if r["kind"] == "arith"][:GEN_ARITH])
    # sala_stop: the copy rows again, until the first space: the first word of the answer.
    stop = [{"question": d["question"], "gold": d["gold"].split(" ")[0]} for d in gen[:GEN_COPY]]
    for name, docs in (("sala_mc", mc), ("sala_gen", gen), ("sala_stop", stop)):
        with open(os.path.join(tmp, name + ".jsonl"), "w") as f:
            f.writelines(json.dumps(d) + "\n" for d in docs)
    return mc, {"sala_gen": gen, "sala_stop": stop}


def reference(tmp, mc, gen):
    """Per mc doc: the four continuation loglikelihoods; per generate-until task and doc: the
    greedy text cut at the task's first stop string (sala_stop's docs are sala_gen's first)."""
    tok = Tokenizer.from_file(os.path.join(MODEL_DIR, "tokenizer.json"))
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    eos = json.load(open(os.path.join(MODEL_DIR, "generation_config.json")))["eos_token_id"]
    lines = []
    for d in mc:
        ctx = MC_PROMPT.format(q=d["question"])
        for letter in LETTERS:
            # lm-eval's _encode_pair: encode context + " " + choice, split at len(enc(context)).
            lines.append({"ids": enc(ctx + " " + letter), "start": len(enc(ctx))})
    for d in gen["sala_gen"]:
        lines.append({"ids": enc(GEN_PROMPT.format(q=d["question"])), "generate": MAX_GEN, "stop_ids": eos})
    path = os.path.join(tmp, "score_in.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)
    out = subprocess.run([sala_bin(), "score", "--model-path", MODEL_DIR, "--input", path],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    res = [json.loads(x) for x in out]
    assert len(res) == len(lines), f"sala score answered {len(res)} of {len(lines)} lines"
    ll = [[res[4 * i + k]["logprob"] for k in range(4)] for i in range(len(mc))]
    raw = [tok.decode([t for t in r["output_ids"] if t not in eos], skip_special_tokens=True)
           for r in res[4 * len(mc):]]

    def cut(text, stops):
        for s in stops:
            text = text.split(s)[0]
        return text
    return ll, {"sala_gen": [cut(t, STOP) for t in raw], "sala_stop": [cut(t, [" ", "</s>"]) for t in raw[:GEN_COPY]]}


def run_lm_eval(tmp, model, model_args, batch_size):
    out = os.path.join(tmp, "out-" + model)
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args,
           "--tasks", ",".join(TASKS), "--include_path", TASKS_DIR, "--batch_size", str(batch_size),
           "--output_path", out, "--log_samples"]
    log("running:", " ".join(cmd))
    env = dict(os.environ, HF_DATASETS_CACHE=os.path.join(tmp, "hf-datasets"), HF_DATASETS_OFFLINE="1",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        log(p.stdout[-4000:], p.stderr[-8000:])
        raise SystemExit(f"lm_eval --model {model} exited {p.returncode}")
    results = json.load(open(glob.glob(os.path.join(out, "*", "results_*.json"))[0]))["results"]
    samples = {}
    for task in TASKS:
        f = glob.glob(os.path.join(out, "*", f"samples_{task}_*.jsonl"))[0]
        samples[task] = sorted((json.loads(x) for x in open(f)), key=lambda s: s["doc_id"])
    return results, samples


def check_model(ck, name, results, samples, mc, gen, ref_ll, ref_text):
    mc_s = samples["sala_mc"]
    ck(len(mc_s) == len(mc), f"{name}: {len(mc_s)} mc samples")
    ref_acc = []
    for s, d, ref in zip(mc_s, mc, ref_ll):
        got = [r[0][0] if isinstance(r[0], list) else r[0] for r in s["resps"]]
        ck(all(abs(float(g) - r) <= LL_TOL * max(1.0, abs(r)) for g, r in zip(got, ref)),
           f"{name} mc doc {s['doc_id']}: loglikelihoods {got} vs sala's logits {ref}")
        best = max(range(4), key=lambda k: ref[k])
        ordered = sorted(ref, reverse=True)
        if s["doc_id"] == 0:
            log(f"{name} mc doc 0: lm-eval {got}, sala's logits {ref}")
        # A near tie may fall either way between the engine's and this forward's last bits.
        if ordered[0] - ordered[1] > 2 * LL_TOL:
            ck(s["acc"] == float(best == d["label"]), f"{name} mc doc {s['doc_id']}: acc {s['acc']}, reference picks {best}")
        ref_acc.append(float(best == d["label"]))
    acc = results["sala_mc"]["acc,none"]
    ck(abs(acc - sum(ref_acc) / len(ref_acc)) < 1e-9, f"{name}: acc {acc} == reference {sum(ref_acc) / len(ref_acc)}")
    scores = [f"acc {acc:.4f}"]
    for task, docs in gen.items():
        ck(len(samples[task]) == len(docs), f"{name}: {len(samples[task])} {task} samples")
        ref_em = []
        for s, d, ref in zip(samples[task], docs, ref_text[task]):
            got = s["filtered_resps"][0]
            ck(got == ref, f"{name} {task} doc {s['doc_id']}: {got!r} vs sala's greedy {ref!r}")
            ref_em.append(float(ref == d["gold"]))
            ck(s["exact_match"] == ref_em[-1], f"{name} {task} doc {s['doc_id']}: exact_match {s['exact_match']}")
        em = results[task]["exact_match,none"]
        ck(abs(em - sum(ref_em) / len(ref_em)) < 1e-9, f"{name} {task}: exact_match {em} == reference {sum(ref_em) / len(ref_em)}")
        scores.append(f"{task} exact_match {em:.4f}")
    log(f"{name}: {', '.join(scores)} (each equal to the reference)")


def main():
    ck = Check("lm_eval")
    with tempfile.TemporaryDirectory(prefix="sala-lm-eval-") as tmp:
        mc, gen = build_data(tmp)
        ref_ll, ref_text = reference(tmp, mc, gen)
        ck(len(set(ref_text["sala_gen"])) > 1 and all(ref_text["sala_stop"]), f"the reference generates text: {ref_text}")
        with Server() as s:
            common = f"model={s.model_id},num_concurrent=2,max_retries=1,max_gen_toks={MAX_GEN}"
            # tokenizer_backend auto: lm-eval finds /tokenizer_info and /tokenize and uses them.
            res, smp = run_lm_eval(tmp, "local-completions", f"base_url={s.url}/v1/completions,{common}", 4)
            check_model(ck, "local-completions", res, smp, mc, gen, ref_ll, ref_text)
            res, smp = run_lm_eval(tmp, "sglang-generate",
                                   f"base_url={s.url}/generate,tokenizer={MODEL_DIR},{common}", 4)
            check_model(ck, "sglang-generate", res, smp, mc, gen, ref_ll, ref_text)
            ck(s.alive(), "server alive")
    ck.done()


if __name__ == "__main__":
    main()
