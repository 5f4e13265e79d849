"""`sala bench offline` long-context rows (issue 7) on the bundled tiny model, CPU.

Usage: bench_offline_long.py SALA_BIN MODEL_DIR OUT_DIR

dense_len is 256 and blocks are 16 tokens there, so a 700-token prompt in 256-token chunks
goes dense, then sparse (SPEC §9.2), and a 400-token context decodes on the sparse path.
Checks that the JSON has one long_prefill row and one long_decode row per batch, with
positive timings and ratios, that the floors are the ones of SPEC §9 / PERF.md recomputed
here from config.json, and that the table prints one line per row; and the prefill again
with 2 sequences decoding beside it (--long-prefill-beside: one decode row each per chunk
step), timed against the plain one.
"""
import json
import math
import os
import subprocess
import sys

sala, model_dir, out_dir = sys.argv[1:4]
os.makedirs(out_dir, exist_ok=True)
out_json = os.path.join(out_dir, "bench_long.json")
cmd = [sala, "bench", "offline", "--model-path", model_dir, "--decode-batches", "1",
       "--prefill-batches", "1", "--decode-output", "8", "--prefill-input", "512",
       "--long-prefill", "700", "--chunk", "256", "--long-decode-contexts", "400",
       "--long-decode-batches", "1,2", "--long-decode-steps", "4", "--long-prefill-beside", "2",
       "--decode-input", "300", "--out-json", out_json]
print(" ".join(cmd), flush=True)
run = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=300)
print(run.stdout)
assert run.returncode == 0, f"exit status {run.returncode}"
rows = json.load(open(out_json))

cfg = json.load(open(os.path.join(model_dir, "config.json")))
sp = cfg["sparse_config"]
n_sparse = cfg["mixer_types"].count("minicpm4")
n_light = cfg["mixer_types"].count("lightning-attn")
nh, kvh, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
lnh, ld = cfg["lightning_nh"], cfg["lightning_head_dim"]
selected = (sp["topk"] + sp["window_size"] // sp["block_size"]) * sp["block_size"]


def entries(n, window, stride):
    return (n - window) // stride + 1 if n >= window else 0


def n12(n):
    return (entries(n, sp["kernel_size"], sp["kernel_stride"]) +
            entries(n, 4 * sp["kernel_size"], 4 * sp["kernel_stride"]))


def attention_flops(L, chunk):
    per_layer = 0
    for off in range(0, L, chunk):
        end = min(L, off + chunk)
        for t in range(off, end):
            if end < sp["dense_len"]:
                per_layer += 4 * nh * hd * (t + 1)
            else:
                per_layer += 2 * nh * hd * n12(t + 1) + 4 * nh * hd * min(t + 1, selected)
    return per_layer * n_sparse + 4 * lnh * ld * ld * L * n_light


def seq_bytes(C):
    L = C + 1
    row = kvh * hd * 2
    kv = 2 * row * L if L < sp["dense_len"] else row * n12(L) + 2 * row * min(L, selected)
    return kv * n_sparse + 2 * lnh * ld * ld * 4 * n_light


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9)


def positive(row, *keys):
    for k in keys:
        v = row[k]
        assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"{row['kind']}: {k} = {v}"


prefill = [r for r in rows if r["kind"] == "long_prefill"]
assert len(prefill) == 1, prefill
p = prefill[0]
assert p["batch"] == 1 and p["input_len"] == 700 and p["chunk"] == 256, p
positive(p, "seconds", "tok_s", "floor_seconds", "floor_linear_flops", "floor_attention_flops",
         "fraction_of_floor")
assert close(p["floor_attention_flops"], attention_flops(700, 256)), p
assert close(p["floor_seconds"], (p["floor_linear_flops"] + p["floor_attention_flops"]) / 790e12), p
assert close(p["fraction_of_floor"], p["floor_seconds"] / p["seconds"]), p

decode = sorted((r for r in rows if r["kind"] == "long_decode"), key=lambda r: r["batch"])
assert [r["batch"] for r in decode] == [1, 2], decode
for r in decode:
    assert r["context"] == 400 and r["steps"] == 4, r
    positive(r, "ms_per_step", "tok_s", "floor_ms", "floor_seq_bytes", "fraction_of_floor")
    assert close(r["floor_seq_bytes"], seq_bytes(400)), r
    assert close(r["fraction_of_floor"], r["floor_ms"] / r["ms_per_step"]), r
# B sequences add B times the per-sequence bytes to the same weights.
assert close((decode[1]["floor_ms"] - decode[0]["floor_ms"]) * 1e-3 * 4.30e12, decode[0]["floor_seq_bytes"])

# The common keys of every row (bench_offline_json.py checks the short rows').
assert (p["name"], p["context"], p["unit"]) == ("long_prefill B=1 L=700", 700, "seconds"), p
assert (p["value"], p["floor"], p["ratio"]) == (p["seconds"], p["floor_seconds"], p["fraction_of_floor"]), p
for r in decode:
    assert (r["name"], r["unit"]) == (f"long_decode B={r['batch']} C=400", "ms_per_step"), r
    assert (r["value"], r["floor"], r["ratio"]) == (r["ms_per_step"], r["floor_ms"], r["fraction_of_floor"]), r

beside = [r for r in rows if r["kind"] == "long_prefill_beside"]
assert len(beside) == 1, beside
m = beside[0]
assert (m["input_len"], m["chunk"], m["decoding"], m["decode_context"], m["steps"]) == (700, 256, 2, 300, 3), m
positive(m, "seconds", "plain_seconds", "ratio_to_plain")
assert close(m["plain_seconds"], p["seconds"]) and close(m["ratio_to_plain"], m["seconds"] / p["seconds"]), m
assert (m["name"], m["unit"], m["value"], m["floor"]) == (
    "long_prefill_beside B=1 L=700 beside 2", "seconds", m["seconds"], m["plain_seconds"]), m
assert sum("beside 2 decodes (C=300)" in l for l in run.stdout.splitlines()) == 1, run.stdout

table = [l for l in run.stdout.splitlines() if "of floor" in l]
assert sum("L=700" in l for l in table) == 1, table
assert sum("C=400" in l for l in table) == 2, table
print("OK")
