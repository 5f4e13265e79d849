#!/usr/bin/env python3
"""`sala quantize --scheme fp8` output checked with the compressed-tensors library itself.

Usage: compressed_tensors_check.py ORIGINAL_DIR QUANTIZED_DIR

Needs torch and compressed-tensors (not in tests/requirements.txt: PyPI's torch wheel and its
NVIDIA libraries take ~5.6 GB, too much for every CI run; a venv with
`pip install torch compressed-tensors transformers` is enough). Checks that
  * the written quantization_config parses as the library's QuantizationConfig and its
    weights / input_activations args equal the library's FP8_DYNAMIC preset;
  * every F8_E4M3 weight equals, code for code, the library's quantize() of the original
    weight with the scales its own calculate_qparams() gives, and those scales equal ours;
  * the library's dequantize() of our codes and scales is within e4m3's precision of the
    original (max |error| / row amax printed).
Exits 1 when a code or a scale differs or the config is not the preset.
"""
import json
import sys

import torch
from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import load_file

orig_dir, q_dir = sys.argv[1:3]
cfg = json.load(open(f"{q_dir}/config.json"))["quantization_config"]
ours = QuantizationConfig.model_validate(cfg).config_groups["group_0"]
preset = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
same_args = ours.weights == preset.weights and ours.input_activations == preset.input_activations
print("quantization args equal the FP8_DYNAMIC preset:", same_args)
orig = load_file(f"{orig_dir}/model.safetensors")
q = load_file(f"{q_dir}/model.safetensors")
n = code_diff = 0
scale_maxrel = deq_maxrel = 0.0
for name, t in q.items():
    if t.dtype != torch.float8_e4m3fn:
        continue
    w = orig[name].float()
    args = ours.weights
    scale, zp = calculate_qparams(torch.amin(w, dim=1, keepdim=True),
                                  torch.amax(w, dim=1, keepdim=True), args)
    lib = quantize(x=w, scale=scale, zero_point=zp, args=args, dtype=torch.float8_e4m3fn)
    our_scale = q[name.replace(".weight", ".weight_scale")].float()
    code_diff += int((lib.view(torch.uint8) != t.view(torch.uint8)).sum())
    scale_maxrel = max(scale_maxrel, float(((scale.float() - our_scale).abs() / our_scale).max()))
    d = dequantize(t, our_scale, args=args, dtype=torch.float32)
    deq_maxrel = max(deq_maxrel, float(((d - w).abs().amax(dim=1) / w.abs().amax(dim=1)).max()))
    n += t.numel()
print(f"{n} FP8 codes: {code_diff} differ from the library's quantize(); max relative scale "
      f"difference {scale_maxrel:.3g}; dequantize max |error| / row amax {deq_maxrel:.4f}")
sys.exit(0 if same_args and code_diff == 0 and scale_maxrel == 0 and n > 0 else 1)
