#!/usr/bin/env python3
"""`sala quantize --scheme fp8` against the compressed-tensors library itself (ctest
compressed_tensors_fp8, run with .venv-torch: tests/requirements-torch.txt).

Usage: compressed_tensors_check.py SALA MODEL_DIR WORK_DIR

1. `sala quantize --scheme fp8` of MODEL_DIR (bf16). Its quantization_config parses as the
   library's QuantizationConfig, format float-quantized, and the group's weights /
   input_activations args equal the library's FP8_DYNAMIC preset.
2. The library's model-free dequantizer (CompressedTensorsDequantizer, what
   `compressed_tensors.entrypoints.convert` runs) decompresses that checkpoint, and finds no
   orphan quantization parameter; every weight it gives equals, bit for bit, our own
   dequantization (each E4M3 code decoded from its bits, times its row's F32 scale), and is
   within E4M3's rounding of the bf16 original: |w' - w| <= 2^-4 |w| + 2^-9 scale.
3. Every code equals the library's quantize() of the original with the scales of its own
   calculate_qparams(), and those scales equal ours.
4. The library compresses MODEL_DIR itself (FloatQuantizationCompressor, FP8_DYNAMIC preset, its
   own QuantizationConfig dump), twice: with F32 scales, then with the scales in the weights'
   bf16 as llm-compressor keeps them. The F32 one holds, tensor for tensor, the bytes of ours,
   and `sala generate` (no flag) on it gives, greedy on the first prompts of the tiny-chat eval
   set, the token ids of our checkpoint. The bf16-scaled one has other scales and so some other
   codes (its greedy ids agree with ours on most prompts: printed, not checked); the library's
   dequantization of it is bf16(code * scale) (it multiplies in the scale's dtype), and sala
   must give on it exactly the ids of the same codes with those scales widened to F32 (exact),
   i.e. read the bf16 scales as the library does.
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
from compressed_tensors.config import CompressionFormat
from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
    CompressedTensorsDequantizer)
from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus,
                                             preset_name_to_scheme)
from compressed_tensors.quantization.lifecycle.forward import quantize
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import load_file, save_file

sala, model, work = sys.argv[1:4]
N_PROMPTS, NEW_TOKENS = 8, 24
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def e4m3fn_table():
    """The value of each of the 256 E4M3 (fn) codes, from its bits: 1 sign, 4 exponent (bias
    7), 3 mantissa; exponent 0 subnormal; S.1111.111 NaN, no infinities."""
    t = np.empty(256, np.float32)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        v = np.nan if (e, m) == (15, 7) else (m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0**(e - 7))
        t[b] = -v if b & 128 else v
    return t


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
ours_dir = f"{work}/sala-quantize"
subprocess.run([sala, "quantize", "--model-path", model, "--out", ours_dir, "--scheme", "fp8"],
               check=True)

# 1. The config.
cfg = json.load(open(f"{ours_dir}/config.json"))["quantization_config"]
qcfg = QuantizationConfig.model_validate(cfg)
group = qcfg.config_groups["group_0"]
preset = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
check(qcfg.format == CompressionFormat.float_quantized.value and qcfg.ignore == ["lm_head"]
      and list(qcfg.config_groups) == ["group_0"] and group.targets == ["Linear"],
      f"quantization_config: format {qcfg.format}, ignore {qcfg.ignore}, targets {group.targets}")
check(group.weights == preset.weights and group.input_activations == preset.input_activations
      and group.output_activations is None, "weights / input_activations args = FP8_DYNAMIC preset")

# 2. The library's dequantization of our checkpoint vs ours and vs the original.
orig = load_file(f"{model}/model.safetensors")
ours = load_file(f"{ours_dir}/model.safetensors")
fp8_names = [n for n, t in ours.items() if t.dtype == torch.float8_e4m3fn]
# The model-free dequantizer takes every *.weight outside ignore for a Linear's: the embedding
# (an nn.Embedding, kept bf16 as llm-compressor keeps it) is named, as its API asks.
deq = CompressedTensorsDequantizer(ours_dir, ignore=["model.embed_tokens"], dtype=torch.float32)
lib = deq.validate(dict(ours))
table = e4m3fn_table()
n = unequal = over = 0
worst = 0.0
for name in fp8_names:
    codes = ours[name].view(torch.uint8).numpy()
    scale = ours[name.replace(".weight", ".weight_scale")].numpy()
    own = table[codes] * scale  # float32 [rows, cols] * [rows, 1]
    got = lib[name].numpy()
    unequal += int((got.view(np.uint32) != own.view(np.uint32)).sum())
    w = orig[name].float().numpy()
    err = np.abs(own - w)
    over += int((err > 2.0**-4 * np.abs(w) + 2.0**-9 * scale).sum())
    worst = max(worst, float((err.max(axis=1) / np.abs(w).max(axis=1)).max()))
    n += codes.size
check(len(fp8_names) > 0 and n > 0, f"{len(fp8_names)} F8_E4M3 weights, {n} codes")
check(sorted(lib) == sorted(orig), "the library's dequantization: the original's tensor names, "
      "no quantization parameter left")
check(unequal == 0, f"library dequantize() = codes * scale decoded by us: {unequal} of {n} differ")
check(over == 0, f"|dequantized - bf16 original| within E4M3 rounding: {over} of {n} outside "
      f"(max |error| / row amax {worst:.4f})")
check(all(torch.equal(lib[k], orig[k]) for k in orig if k not in fp8_names),
      "unquantized tensors (embedding, norms, lm_head, ...) as in the original")

# 3. Codes and scales vs the library's own quantize() / calculate_qparams().
code_diff = scale_diff = 0
for name in fp8_names:
    w = orig[name].float()
    scale, zp = calculate_qparams(torch.amin(w, 1, keepdim=True), torch.amax(w, 1, keepdim=True),
                                  group.weights)
    codes = quantize(x=w, scale=scale, zero_point=zp, args=group.weights,
                     dtype=torch.float8_e4m3fn)
    code_diff += int((codes.view(torch.uint8) != ours[name].view(torch.uint8)).sum())
    scale_diff += int((scale != ours[name.replace(".weight", ".weight_scale")]).sum())
check(code_diff == 0 and scale_diff == 0,
      f"library quantize(): {code_diff} codes and {scale_diff} scales differ from ours")


# 4. Checkpoints the library compressed, loaded by sala.
def library_compress(dst, scale_dtype):
    os.makedirs(dst)
    out = {}
    for name, w in orig.items():
        if name.endswith(".weight") and w.dim() == 2 and name not in (
                "model.embed_tokens.weight", "lm_head.weight"):
            wf = w.float()
            scale, zp = calculate_qparams(torch.amin(wf, 1, keepdim=True),
                                          torch.amax(wf, 1, keepdim=True), preset.weights)
            c = FloatQuantizationCompressor.compress(
                {"weight": w, "weight_scale": scale.to(scale_dtype), "weight_zero_point": zp},
                preset)
            for k, v in c.items():
                out[f"{name[:-len('.weight')]}.{k}"] = v.contiguous()
        else:
            out[name] = w
    save_file(out, f"{dst}/model.safetensors", metadata={"format": "pt"})
    c = json.load(open(f"{model}/config.json"))
    c["quantization_config"] = QuantizationConfig(
        config_groups={"group_0": preset}, format=CompressionFormat.float_quantized.value,
        ignore=["lm_head"], quantization_status=QuantizationStatus.COMPRESSED).model_dump()
    json.dump(c, open(f"{dst}/config.json", "w"), indent=2)
    for f in os.listdir(model):
        if f not in ("config.json", "model.safetensors") and os.path.isfile(f"{model}/{f}"):
            shutil.copy(f"{model}/{f}", dst)
    return out


lib32 = library_compress(f"{work}/ct-f32-scales", torch.float32)
check(sorted(lib32) == sorted(ours) and all(
    lib32[k].dtype == ours[k].dtype and torch.equal(lib32[k].view(torch.uint8),
                                                    ours[k].view(torch.uint8)) for k in ours),
      "library-compressed (F32 scales): every tensor holds our bytes")
lib16 = library_compress(f"{work}/ct-bf16-scales", torch.bfloat16)
check(all(lib16[k].dtype == torch.bfloat16 for k in lib16 if k.endswith("weight_scale")),
      "library-compressed (bf16 scales): scales stored as bf16")
deq16 = CompressedTensorsDequantizer(f"{work}/ct-bf16-scales", ignore=["model.embed_tokens"],
                                     dtype=torch.float32).validate(dict(lib16))


def round_to_bf16(x):
    """float32 -> the nearest bf16 (ties to even), as float32 (no NaN here)."""
    u = x.view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


# The library multiplies in the scale's dtype: bf16(code * scale), the product itself exact in F32.
unequal16 = sum(int((deq16[k].numpy().view(np.uint32) != round_to_bf16(
    table[lib16[k].view(torch.uint8).numpy()] * lib16[k + "_scale"].float().numpy()).view(
        np.uint32)).sum()) for k in fp8_names)
check(unequal16 == 0, f"library-compressed (bf16 scales): library dequantize() = bf16(codes * "
      f"scale) decoded by us: {unequal16} differ")
# The same codes with the bf16 scales widened to F32 (exact): what sala must compute on it.
widened = f"{work}/ct-bf16-scales-as-f32"
shutil.copytree(f"{work}/ct-bf16-scales", widened)
save_file({k: v.float() if k.endswith("weight_scale") else v for k, v in lib16.items()},
          f"{widened}/model.safetensors", metadata={"format": "pt"})

questions = [json.loads(line)["question"] for line in open(
    os.path.join(os.path.dirname(__file__), "..", "fixtures", "eval", "tiny-chat.jsonl"))]


def generate(model_dir, question):
    r = subprocess.run([sala, "generate", "--model-path", model_dir, "--chat", "--prompt", question,
                        "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos", "--dtype", "float32",
                        "--show-ids"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sala generate --model-path {model_dir} failed:\n{r.stderr}")
    return [line for line in r.stderr.splitlines() if line.startswith("[output ids:")][0]


same32 = same16 = same16_ours = 0
for q in questions[:N_PROMPTS]:
    ref = generate(ours_dir, q)
    same32 += generate(f"{work}/ct-f32-scales", q) == ref
    ids16 = generate(f"{work}/ct-bf16-scales", q)
    same16 += ids16 == generate(widened, q)
    same16_ours += ids16 == ref
check(same32 == N_PROMPTS, f"sala generate, library-compressed (F32 scales): {same32}/{N_PROMPTS} "
      f"prompts give our checkpoint's {NEW_TOKENS} greedy ids")
check(same16 == N_PROMPTS, f"sala generate, library-compressed (bf16 scales): {same16}/{N_PROMPTS} "
      f"prompts give the ids of its codes with F32 scales ({same16_ours}/{N_PROMPTS} those of ours)")
print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
