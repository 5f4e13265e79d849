"""`sala bench offline --decode-grammar` on the bundled tiny model, CPU (issue 19's grammar cost
per decode step; the GPU numbers come from the same option on the H200).

Usage: bench_offline_grammar.py SALA_BIN MODEL_DIR OUT_DIR

Runs decode at batch 1 and 8, each again plain and with every sequence under
tests/model/bench_grammar_schema.json (greedy under the mask), then checks: one decode_grammar
row after each decode row, its ratio that of its two medians, and every output it completed parses as JSON and
validates against the schema (the mask was applied and the matcher advanced on every step;
outputs of distinct prompts differ). Then --decode-grammar json (any JSON object) at batch 2,
and the errors: a schema that does not compile, a missing file, a model without a tokenizer.
"""
import json
import math
import os
import subprocess
import sys

import jsonschema

sala, model_dir, out_dir = sys.argv[1:4]
schema_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_grammar_schema.json")
schema = json.load(open(schema_path))
os.makedirs(out_dir, exist_ok=True)


def bench(grammar, batches, steps, extra=()):
    out_json = os.path.join(out_dir, "bench.json")
    if os.path.exists(out_json):
        os.remove(out_json)
    cmd = [sala, "bench", "offline", "--model-path", model_dir, "--decode-batches", batches,
           "--decode-input", "16", "--decode-output", str(steps), "--prefill-batches", "1",
           "--prefill-input", "32", "--threads", "2", "--decode-grammar", grammar, "--json", out_json, *extra]
    print(" ".join(cmd), flush=True)
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    print(run.stdout, run.stderr[-2000:])
    return run, (json.load(open(out_json)) if run.returncode == 0 else None)


run, rows = bench(schema_path, "1,8", 192)
assert run.returncode == 0, f"exit status {run.returncode}"
kinds = [(r["kind"], r["batch"]) for r in rows]
assert kinds == [("decode", 1), ("decode_grammar", 1), ("decode", 8), ("decode_grammar", 8), ("prefill", 1)], kinds
outputs = []
for plain, g in ((rows[0], rows[1]), (rows[2], rows[3])):
    assert g["batch"] == plain["batch"] and g["context"] == plain["context"], (g, plain)
    # The baseline: the same steps without the grammar, measured again right before.
    assert all(math.isfinite(g[k]) and g[k] > 0 for k in ("ms_per_step", "decode_ms")), g
    assert math.isclose(g["ratio_to_decode"], g["ms_per_step"] / g["decode_ms"], rel_tol=1e-9), g
    assert g["name"] == f"decode_grammar B={g['batch']} C=16 schema bench_grammar_schema.json", g["name"]
    assert "sala-tiny-chat's 800 tokens" in g["vocabulary"], g["vocabulary"]
    assert any(line.startswith(f"grammar B={g['batch']}") and f"{g['ratio_to_decode']:.3f}x the plain step of {g['decode_ms']:.3f} ms" in line
               for line in run.stdout.splitlines()), "the table line"
    assert 0 < len(g["outputs"]) <= 8 and g["completed"] >= len(g["outputs"]), g
    outputs += g["outputs"]
for text in outputs:
    jsonschema.validate(json.loads(text), schema)  # parses, and is what the schema allows
assert rows[3]["completed"] >= 4, f"8 sequences x 192 steps completed only {rows[3]['completed']} objects"
assert len(set(rows[3]["outputs"])) > 1, f"the 8 sequences' outputs are all alike: {rows[3]['outputs']}"
print(f"{len(outputs)} constrained outputs valid; ratios {rows[1]['ratio_to_decode']:.3f} (B=1), "
      f"{rows[3]['ratio_to_decode']:.3f} (B=8)")

run, rows = bench("json", "2", 24)
assert run.returncode == 0 and [r["kind"] for r in rows] == ["decode", "decode_grammar", "prefill"], rows
for text in rows[1]["outputs"]:
    assert isinstance(json.loads(text), dict), text

bad = os.path.join(out_dir, "bad_schema.json")
open(bad, "w").write('{"type": "objec')
for grammar, extra, message in ((bad, (), "invalid JSON schema"),
                                (os.path.join(out_dir, "missing.json"), (), "neither 'json' nor a readable"),
                                ("json", ("--grammar-tokenizer", out_dir), "--decode-grammar needs a tokenizer")):
    run, _ = bench(grammar, "1", 4, extra)
    assert run.returncode != 0 and message in run.stderr, (run.returncode, run.stderr)
print("bench_offline_grammar: ok")
