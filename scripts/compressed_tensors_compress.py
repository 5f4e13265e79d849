#!/usr/bin/env python3
"""A checkpoint compressed by the compressed-tensors library itself, for `sala serve` to load.

Usage: compressed_tensors_compress.py MODEL_DIR OUT_DIR

Needs torch and compressed-tensors, as scripts/compressed_tensors_check.py. The library's
FP8_DYNAMIC preset: every Linear weight but lm_head gets per-channel scales from the library's
calculate_qparams(), kept in the weight's dtype as llm-compressor keeps them, and is
compressed by its FloatQuantizationCompressor; config.json gets the library's own
QuantizationConfig.model_dump(). Other tensors and files are copied. Then
`sala serve --model-path OUT_DIR` serves it with no flag.
"""
import json
import os
import shutil
import sys

import torch
from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
from compressed_tensors.config import CompressionFormat
from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus,
                                             preset_name_to_scheme)
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import load_file, save_file

src, dst = sys.argv[1:3]
if os.path.exists(dst) and os.listdir(dst):
    sys.exit(f"{dst}: exists and is not empty")
os.makedirs(dst, exist_ok=True)
scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
out = {}
for name, w in load_file(f"{src}/model.safetensors").items():
    if w.dim() == 2 and name not in ("model.embed_tokens.weight", "lm_head.weight"):
        wf = w.float()
        scale, zp = calculate_qparams(torch.amin(wf, 1, keepdim=True),
                                      torch.amax(wf, 1, keepdim=True), scheme.weights)
        c = FloatQuantizationCompressor.compress(
            {"weight": w, "weight_scale": scale.to(w.dtype), "weight_zero_point": zp}, scheme)
        for k, v in c.items():
            out[f"{name[:-len('.weight')]}.{k}"] = v.contiguous()
    else:
        out[name] = w
save_file(out, f"{dst}/model.safetensors", metadata={"format": "pt"})
cfg = json.load(open(f"{src}/config.json"))
cfg["quantization_config"] = QuantizationConfig(
    config_groups={"group_0": scheme}, format=CompressionFormat.float_quantized.value,
    ignore=["lm_head"], quantization_status=QuantizationStatus.COMPRESSED).model_dump()
with open(f"{dst}/config.json", "w") as f:
    json.dump(cfg, f, indent=2)
for f in os.listdir(src):
    if f not in ("config.json", "model.safetensors") and os.path.isfile(f"{src}/{f}"):
        shutil.copy(f"{src}/{f}", dst)
print(f"wrote {dst}: {len(out)} tensors")
