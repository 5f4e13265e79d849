"""`sala bench offline --json` on the bundled tiny model, CPU: one JSON row per table line.

Usage: bench_offline_json.py SALA_BIN MODEL_DIR OUT_DIR [--plain-model DIR] [BENCH_OPTION ...]
(e.g. --quantization w4a16: the same rows with int4 projections, whose decode floor, the bytes
a step reads, must then be below the unquantized run's, printed by a second run without them;
--plain-model: MODEL_DIR is a quantized checkpoint of DIR, and that second run reads DIR).
Where neither the options nor the checkpoint make the projections FP8, the prefill ceiling
(bf16 peak / 2 · parameters) must equal the plain run's: a quantized weight counts its dense
[out, in] parameters, whatever its codes' shape.

Runs decode at batch 1 and 2 (16-token prompts, 4 steps) and prefill at batch 1 (64-token
prompt), then checks that the JSON is an array of exactly those three rows, each with the
common keys (name, batch, context, unit, value, floor, ratio) consistent with its
kind-specific keys, and that every row's name and value appear on one printed table line.
scripts/gpu_check.sh and docs/PERF.md read these keys.
"""
import json
import math
import os
import subprocess
import sys

sala, model_dir, out_dir = sys.argv[1:4]
extra = sys.argv[4:]
plain_model = model_dir
if extra[:1] == ["--plain-model"]:
    plain_model, extra = extra[1], extra[2:]
os.makedirs(out_dir, exist_ok=True)
out_json = os.path.join(out_dir, "bench.json")
if os.path.exists(out_json):
    os.remove(out_json)
cmd = [sala, "bench", "offline", "--model-path", model_dir, "--decode-batches", "1,2",
       "--decode-input", "16", "--decode-output", "4", "--prefill-batches", "1",
       "--prefill-input", "64", "--json", out_json] + extra
print(" ".join(cmd), flush=True)
run = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=300)
print(run.stdout)
assert run.returncode == 0, f"exit status {run.returncode}"
rows = json.load(open(out_json))
assert isinstance(rows, list), type(rows)


def positive(row, key):
    v = row[key]
    assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"{row['name']}: {key} = {v}"


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9)


expected = [("decode B=1 C=16", "decode", 1, 16, "ms_per_step"),
            ("decode B=2 C=16", "decode", 2, 16, "ms_per_step"),
            ("prefill B=1 L=64", "prefill", 1, 64, "tok_s")]
assert [r.get("name") for r in rows] == [e[0] for e in expected], [r.get("name") for r in rows]
for row, (name, kind, batch, context, unit) in zip(rows, expected):
    assert (row["kind"], row["batch"], row["context"], row["unit"]) == (kind, batch, context, unit), row
    for key in ("value", "floor", "ratio", "tok_s"):
        positive(row, key)
    if kind == "decode":
        assert row["value"] == row["ms_per_step"] and row["floor"] == row["floor_ms"], row
        assert close(row["ratio"], row["floor"] / row["value"]), row
        assert close(row["tok_s"], batch * 1e3 / row["value"]), row
    else:
        assert row["value"] == row["tok_s"] and row["floor"] == row["ceiling_tok_s"], row
        assert close(row["ratio"], row["value"] / row["floor"]), row
# Both decode rows read the same weights: the same floor.
assert rows[0]["floor"] == rows[1]["floor"], rows

# The table printed last: one line per row, with the row's label and value as printed.
lines = run.stdout.splitlines()
for row in rows:
    kind = row["kind"]
    label = f"{kind:<7} B={row['batch']:<3}"
    shown = f"{row['value']:.3f} ms/step" if kind == "decode" else f"{row['value']:.1f} tok/s"
    hits = [l for l in lines if l.startswith(label) and shown in " ".join(l.split())]
    assert len(hits) == 1, (row["name"], shown, lines)
if extra or plain_model != model_dir:
    # the plain run's decode floor (every weight as loaded) must be above this one's
    plain_json = os.path.join(out_dir, "bench_plain.json")
    plain_cmd = cmd[:cmd.index("--json")] + ["--json", plain_json]
    plain_cmd[plain_cmd.index("--model-path") + 1] = plain_model
    plain = subprocess.run(plain_cmd, stdout=subprocess.PIPE, text=True, timeout=300)
    assert plain.returncode == 0, f"plain run: exit status {plain.returncode}"
    plain_rows = json.load(open(plain_json))
    assert rows[0]["floor"] < plain_rows[0]["floor"], (rows[0], plain_rows[0])
    groups = json.load(open(os.path.join(model_dir, "config.json"))).get(
        "quantization_config", {}).get("config_groups", {})
    fp8 = "fp8" in extra or any(g.get("weights", {}).get("type") == "float" for g in groups.values())
    if not fp8:
        assert close(rows[2]["ceiling_tok_s"], plain_rows[2]["ceiling_tok_s"]), (rows[2],
                                                                              plain_rows[2])
    print(f"decode floor {rows[0]['floor']:.4f} ms with {' '.join(extra) or model_dir}, "
          f"{plain_rows[0]['floor']:.4f} ms without")
print("OK")
