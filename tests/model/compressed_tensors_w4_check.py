#!/usr/bin/env python3
"""`sala quantize --scheme w4a16` against the compressed-tensors library itself (ctest
compressed_tensors_w4a16, run with .venv-torch: tests/requirements-torch.txt).

Usage: compressed_tensors_w4_check.py SALA MODEL_DIR WORK_DIR CALIBRATION_TXT

1. `sala quantize --scheme w4a16 --method rtn` of MODEL_DIR (bf16). Its quantization_config
   parses as the library's QuantizationConfig, format pack-quantized, and the group's weights
   args equal the library's W4A16 preset's.
2. The library's model-free dequantizer decompresses it (no orphan parameter left); every weight
   equals, bit for bit, bf16(q * scale) with q unpacked by us (nibble k % 8 of int32 k / 8, minus
   8) and scale the stored bf16 (the library multiplies in the scale's dtype; our CPU oracle keeps
   the exact fp32 product), and lies within half a step of the bf16 original (|w' - w| <=
   scale / 2 + bf16 rounding, or the clamp at -8 / +7).
3. Every code equals the library's quantize() of the original (in fp32) with the scales of its
   own calculate_qparams() per group of 128, rounded to bf16, and those scales equal ours.
4. The library compresses MODEL_DIR itself (PackedQuantizationCompressor, W4A16 preset, its own
   QuantizationConfig dump) from the fp32-widened weights: every tensor holds our bytes, and
   `sala generate` (no flag) gives on it our checkpoint's greedy ids. Compressed from the bf16
   weights as llm-compressor does (x / scale in bf16), some codes differ (counted, printed); sala
   loads that checkpoint and gives the ids of the codes it holds: the library's dequantization
   of it, written back as a bf16 checkpoint, gives the same greedy ids.
5. `sala quantize --scheme w4a16` with GPTQ (calibration text): the library decompresses it and
   agrees with our unpacking as in 2.
6. A checkpoint the library builds mixing schemes by regex targets (mlp W4A16 pack-quantized,
   self_attn FP8 float-quantized, format mixed-precision, lm_head ignored) loads in sala with
   no flag; its greedy ids equal those of the library's own dequantization of it (bf16).
Exits 1 on any difference.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.config import CompressionFormat
from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
    CompressedTensorsDequantizer)
from compressed_tensors.quantization import (QuantizationConfig, QuantizationScheme,
                                             QuantizationStatus, preset_name_to_scheme)
from compressed_tensors.quantization.lifecycle.forward import quantize
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import load_file, save_file

sala, model, work, calibration = sys.argv[1:5]
N_PROMPTS, NEW_TOKENS, GROUP = 6, 16, 128
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def round_to_bf16(x):
    """float32 -> the nearest bf16 (ties to even), as float32 (no NaN here)."""
    u = x.view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def unpack(packed):
    """int32 [N, K / 8] -> int [N, K]: nibble i of word j is column 8 j + i, value - 8."""
    words = packed.numpy().view(np.uint32)
    nib = (words[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15
    return nib.reshape(words.shape[0], -1).astype(np.int32) - 8


def ours_dequantized(tensors, module):
    q = unpack(tensors[module + ".weight_packed"])
    s = tensors[module + ".weight_scale"].float().numpy()
    return q.astype(np.float32) * np.repeat(s, q.shape[1] // s.shape[1], axis=1), q, s


def quantize_cli(out, *extra):
    subprocess.run([sala, "quantize", "--model-path", model, "--out", out, "--scheme", "w4a16",
                    *extra], check=True, stderr=subprocess.DEVNULL)


def lib_dequantize(directory, tensors):
    return CompressedTensorsDequantizer(directory, ignore=["model.embed_tokens"],
                                        dtype=torch.float32).validate(dict(tensors))


def copy_side_files(dst):
    for f in os.listdir(model):
        if f not in ("config.json", "model.safetensors") and os.path.isfile(f"{model}/{f}"):
            shutil.copy(f"{model}/{f}", dst)


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
orig = load_file(f"{model}/model.safetensors")
preset = preset_name_to_scheme("W4A16", ["Linear"])

# 1. The config.
rtn_dir = f"{work}/sala-rtn"
quantize_cli(rtn_dir, "--method", "rtn")
qcfg = QuantizationConfig.model_validate(json.load(open(f"{rtn_dir}/config.json"))["quantization_config"])
group = qcfg.config_groups["group_0"]
check(qcfg.format == CompressionFormat.pack_quantized.value and qcfg.ignore == ["lm_head"]
      and group.targets == ["Linear"], f"quantization_config: format {qcfg.format}, ignore "
      f"{qcfg.ignore}, targets {group.targets}")
check(group.weights == preset.weights and group.input_activations is None,
      f"weights args = W4A16 preset ({group.weights.model_dump()} vs {preset.weights.model_dump()})")

# 2. The library's dequantization of our checkpoint.
ours = load_file(f"{rtn_dir}/model.safetensors")
modules = sorted(k[:-len(".weight_packed")] for k in ours if k.endswith(".weight_packed"))
lib = lib_dequantize(rtn_dir, ours)
n = unequal = far = 0
for m in modules:
    own, q, s = ours_dequantized(ours, m)
    unequal += int((lib[m + ".weight"].numpy().view(np.uint32) != round_to_bf16(own).view(np.uint32)).sum())
    w = orig[m + ".weight"].float().numpy()
    half = np.repeat(s, q.shape[1] // s.shape[1], axis=1) / 2
    clamped = (q == -8) | (q == 7)
    far += int(((np.abs(own - w) > half * 1.0001) & ~clamped).sum())
    n += q.size
check(len(modules) > 0, f"{len(modules)} W4A16 modules, {n} codes")
check(sorted(lib) == sorted(orig), "the library's dequantization: the original's tensor names")
check(unequal == 0, f"library dequantize() = bf16(q * scale) unpacked by us: {unequal} of {n} differ")
check(far == 0, f"|dequantized - original| <= scale / 2 outside the clamp: {far} of {n} outside")

# 3. Codes and scales vs the library's quantize() / calculate_qparams().
code_diff = scale_diff = 0
lib_codes = {}
for m in modules:
    w = orig[m + ".weight"].float()
    g = w.reshape(w.shape[0], -1, GROUP)
    scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), group.weights)
    scale = scale.to(torch.bfloat16)
    codes = quantize(x=w, scale=scale, zero_point=zp, args=group.weights, dtype=torch.int8)
    lib_codes[m] = (scale, zp)
    code_diff += int((codes.numpy() != unpack(ours[m + ".weight_packed"])).sum())
    scale_diff += int((scale.float() != ours[m + ".weight_scale"].float()).sum())
check(code_diff == 0 and scale_diff == 0,
      f"library quantize(): {code_diff} codes and {scale_diff} scales differ from ours")


# 4. Checkpoints the library compressed, loaded by sala.
def library_compress(dst, weight_dtype):
    os.makedirs(dst)
    out = {}
    for name, w in orig.items():
        m = name[:-len(".weight")]
        if m in lib_codes:
            scale, zp = lib_codes[m]
            c = PackedQuantizationCompressor.compress(
                {"weight": w.to(weight_dtype), "weight_scale": scale, "weight_zero_point": zp}, preset)
            for k, v in c.items():
                out[f"{m}.{k}"] = v.contiguous()
        else:
            out[name] = w
    save_file(out, f"{dst}/model.safetensors", metadata={"format": "pt"})
    c = json.load(open(f"{model}/config.json"))
    c["quantization_config"] = QuantizationConfig(
        config_groups={"group_0": preset}, format=CompressionFormat.pack_quantized.value,
        ignore=["lm_head"], quantization_status=QuantizationStatus.COMPRESSED).model_dump()
    json.dump(c, open(f"{dst}/config.json", "w"), indent=2)
    copy_side_files(dst)
    return out


questions = [json.loads(line)["question"] for line in open(
    os.path.join(os.path.dirname(__file__), "..", "fixtures", "eval", "tiny-chat.jsonl"))]
questions = questions[::len(questions) // N_PROMPTS][:N_PROMPTS]  # every kind of task


def generate(model_dir, question):
    r = subprocess.run([sala, "generate", "--model-path", model_dir, "--chat", "--prompt", question,
                        "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos", "--dtype", "float32",
                        "--show-ids"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sala generate --model-path {model_dir} failed:\n{r.stderr}")
    return [line for line in r.stderr.splitlines() if line.startswith("[output ids:")][0]


def dense_copy(src, tensors, dst):
    """The library's dequantization of checkpoint `src` as a plain bf16 checkpoint."""
    os.makedirs(dst)
    deq = lib_dequantize(src, tensors)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in deq.items()},
              f"{dst}/model.safetensors", metadata={"format": "pt"})
    c = json.load(open(f"{src}/config.json"))
    c.pop("quantization_config")
    json.dump(c, open(f"{dst}/config.json", "w"), indent=2)
    copy_side_files(dst)


lib32 = library_compress(f"{work}/ct-from-f32", torch.float32)
check(sorted(lib32) == sorted(k for k in ours) and all(
    lib32[k].dtype == ours[k].dtype and torch.equal(lib32[k].view(torch.uint8), ours[k].view(torch.uint8))
    for k in ours if not k.endswith(".weight_shape")),
      "library-compressed from fp32 weights: every tensor holds our bytes (weight_shape aside: I64)")
lib16 = library_compress(f"{work}/ct-from-bf16", torch.bfloat16)
differ16 = sum(int((unpack(lib16[m + ".weight_packed"]) != unpack(ours[m + ".weight_packed"])).sum())
               for m in modules)
print(f"      library-compressed from bf16 weights (x / scale in bf16): {differ16} of {n} codes "
      f"differ from ours")
dense_copy(f"{work}/ct-from-bf16", lib16, f"{work}/ct-from-bf16-dequantized")
same32 = same16 = 0
for q in questions:
    ref = generate(rtn_dir, q)
    same32 += generate(f"{work}/ct-from-f32", q) == ref
    same16 += generate(f"{work}/ct-from-bf16", q) == generate(f"{work}/ct-from-bf16-dequantized", q)
check(same32 == len(questions), f"sala generate, library-compressed from fp32: {same32}/"
      f"{len(questions)} prompts give our checkpoint's {NEW_TOKENS} greedy ids")
check(same16 == len(questions), f"sala generate, library-compressed from bf16: {same16}/"
      f"{len(questions)} prompts give the ids of the library's dequantization of it")

# 5. GPTQ checkpoint.
gptq_dir = f"{work}/sala-gptq"
quantize_cli(gptq_dir, "--method", "gptq", "--calibration", calibration)
gptq = load_file(f"{gptq_dir}/model.safetensors")
libg = lib_dequantize(gptq_dir, gptq)
unequal_g = sum(int((libg[m + ".weight"].numpy().view(np.uint32) != round_to_bf16(
    ours_dequantized(gptq, m)[0]).view(np.uint32)).sum()) for m in modules)
check(unequal_g == 0, f"GPTQ checkpoint: library dequantize() = bf16(q * scale): {unequal_g} differ")
changed = sum(int((unpack(gptq[m + ".weight_packed"]) != unpack(ours[m + ".weight_packed"])).sum())
              for m in modules)
check(changed > 0, f"GPTQ codes differ from RTN's in {changed} of {n} places")

# 6. A mixed checkpoint built by the library: mlp W4A16, attention FP8, lm_head dense.
w4 = QuantizationScheme(targets=["re:.*mlp\\..*_proj$"], weights=preset.weights,
                        format=CompressionFormat.pack_quantized.value)
fp8_preset = preset_name_to_scheme("FP8_DYNAMIC", ["re:.*self_attn\\..*"])
fp8 = QuantizationScheme(targets=fp8_preset.targets, weights=fp8_preset.weights,
                         input_activations=fp8_preset.input_activations,
                         format=CompressionFormat.float_quantized.value)
mixed_dir = f"{work}/ct-mixed"
os.makedirs(mixed_dir)
mixed = {}
for name, w in orig.items():
    m = name[:-len(".weight")]
    if m in lib_codes and ".mlp." in m:
        scale, zp = lib_codes[m]
        c = PackedQuantizationCompressor.compress(
            {"weight": w.float(), "weight_scale": scale, "weight_zero_point": zp}, w4)
    elif m in lib_codes:
        wf = w.float()
        scale, zp = calculate_qparams(wf.amin(1, keepdim=True), wf.amax(1, keepdim=True), fp8.weights)
        c = FloatQuantizationCompressor.compress(
            {"weight": w, "weight_scale": scale, "weight_zero_point": zp}, fp8)
    else:
        mixed[name] = w
        continue
    for k, v in c.items():
        mixed[f"{m}.{k}"] = v.contiguous()
save_file(mixed, f"{mixed_dir}/model.safetensors", metadata={"format": "pt"})
c = json.load(open(f"{model}/config.json"))
c["quantization_config"] = QuantizationConfig(
    config_groups={"group_0": w4, "group_1": fp8}, format=CompressionFormat.mixed_precision.value,
    ignore=["lm_head"], quantization_status=QuantizationStatus.COMPRESSED).model_dump()
json.dump(c, open(f"{mixed_dir}/config.json", "w"), indent=2)
copy_side_files(mixed_dir)
print("      sala generate on the library's mixed checkpoint:", generate(mixed_dir, questions[1]))
check(any(k.endswith(".weight_packed") for k in mixed) and any(
    v.dtype == torch.float8_e4m3fn for v in mixed.values()), "mixed checkpoint: int4 and FP8 modules")
print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
