#!/usr/bin/env python3
"""Accept lengths of speculative decoding per task kind on tiny-chat (issue 21): for NGRAM and
for STANDALONE with each draft model, one `sala serve` (CPU, fp32, greedy via `sala eval`, one
request at a time) answers the rows of each `kind` of the eval set in turn; the engine's
counters before and after each kind give its accept length (tokens per verify call, the bonus
token included: 1 + accepted / verify calls, SGLang's avg_spec_accept_length), the share of
drafted tokens accepted, and the engine steps per generated token. Prints a table.

Draft models (default: made in WORK from the bundled model): `self` (the model itself: every
draft is its argmax, the upper bound), `w4a16-rtn` (`sala quantize --scheme w4a16 --method rtn
--group-size 32`), `noise0.3` and `noise1.0` (scripts/perturb_checkpoint.py).
Usage: spec_accept_lengths.py SALA_BINARY [--data JSONL] [--work DIR] [--drafts 4]
                              [--draft NAME=DIR ...]"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from eval_server import run_eval, running_server, server_info  # noqa: E402

MODEL = os.path.join(ROOT, "models", "sala-tiny-chat")


def default_drafts(sala, work):
    drafts = {"self": MODEL}
    q = os.path.join(work, "w4a16-rtn")
    if not os.path.exists(os.path.join(q, "model.safetensors")):
        subprocess.run([sala, "quantize", "--model-path", MODEL, "--out", q, "--scheme", "w4a16",
                        "--method", "rtn", "--group-size", "32"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    drafts["w4a16-rtn"] = q
    for noise in ("0.3", "1.0"):
        d = os.path.join(work, "noise" + noise)
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "perturb_checkpoint.py"),
                        MODEL, d, "--noise", noise], check=True, stdout=subprocess.DEVNULL)
        drafts["noise" + noise] = d
    return drafts


def per_kind(sala, flags, name, kinds, work):
    """{kind: (accept length, accepted share, steps per generated token)}."""
    out = {}
    with running_server(sala, name, flags) as url:
        for kind, path in kinds.items():
            a = server_info(url)["engine_stats"]
            run_eval(sala, url, path, work, f"{name}-{kind}", concurrency=1)
            b = server_info(url)["engine_stats"]
            d = {k: b[k] - a[k] for k in ("spec_verify_calls", "spec_drafted_tokens",
                                          "spec_accepted_tokens", "steps",
                                          "generated_tokens_total")}
            calls = d["spec_verify_calls"]
            out[kind] = (1 + d["spec_accepted_tokens"] / calls if calls else 1.0,
                         d["spec_accepted_tokens"] / max(1, d["spec_drafted_tokens"]),
                         d["steps"] / max(1, d["generated_tokens_total"]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sala")
    ap.add_argument("--data", default=os.path.join(ROOT, "tests", "fixtures", "eval",
                                                   "tiny-chat.jsonl"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--drafts", type=int, default=4, help="--speculative-num-draft-tokens")
    ap.add_argument("--draft", action="append", default=[], help="NAME=DIR (repeatable)")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="sala-accept-")
    os.makedirs(work, exist_ok=True)
    rows = collections.defaultdict(list)
    for line in open(a.data):
        rows[json.loads(line)["kind"]].append(line)
    kinds = {}
    for kind, lines in sorted(rows.items()):
        kinds[kind] = os.path.join(work, f"{kind}.jsonl")
        open(kinds[kind], "w").writelines(lines)
    drafts = dict(d.split("=", 1) for d in a.draft) or default_drafts(a.sala, work)
    k = ["--speculative-num-draft-tokens", str(a.drafts)]
    configs = {"NGRAM": ["--speculative-algorithm", "NGRAM", *k]}
    for name, path in drafts.items():
        configs[f"STANDALONE {name}"] = ["--speculative-algorithm", "STANDALONE", *k,
                                         "--speculative-draft-model-path", path]
    results = {name: per_kind(a.sala, flags, name.replace(" ", "-"), kinds, work)
               for name, flags in configs.items()}
    print(f"\naccept length (tokens per verify call) per task kind, k = {a.drafts}, "
          f"greedy, one request at a time; in brackets: share of drafts accepted, steps per "
          f"generated token")
    w = max(len(n) for n in results) + 2
    print("".join([f"{'':{w}}"] + [f"{kind} ({len(rows[kind])})".ljust(24) for kind in kinds]))
    for name, r in results.items():
        cells = [f"{r[kind][0]:.2f} ({r[kind][1]:.0%}, {r[kind][2]:.2f})".ljust(24) for kind in kinds]
        print(f"{name:{w}}" + "".join(cells))


if __name__ == "__main__":
    main()
