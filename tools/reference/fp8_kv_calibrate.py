#!/usr/bin/env python3
"""Writes an FP8 checkpoint of a model with per-layer KV-cache scales, to measure what
calibrated scales buy `--kv-cache-dtype fp8`.

The output is AutoFP8's layout (quant_method fp8, dynamic activations): every decoder
projection X.weight as F8_E4M3 codes of w / s with X.weight_scale s = max|w| / 448 (float32),
everything else float32, and each layer's self_attn.k_scale / v_scale:
- `--kv-scale calibrated` (default): max |k| (after RoPE) and max |v| over the calibration
  prompt, divided by 448 — llm-compressor's static per-tensor KV scheme (its minmax observer);
- `--kv-scale C`: the constant C for every layer (1: what an uncalibrated cache uses).
The forward pass for the calibration is tools/reference/llama_reference.py's (float64).

Run by hand (not in CI); needs python3-torch and python3-numpy (/usr/bin/python3):
  fp8_kv_calibrate.py --model DIR --out DIR --prompt-ids 1,2,3 [--kv-scale calibrated|C]
"""

import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref  # noqa: E402


def e4m3_codes(w):
    """Codes of the nearest e4m3fn values (ties to the even code), saturating at 448."""
    codes = np.arange(0, 127)
    values = ref.e4m3_values(codes)
    a = np.minimum(np.abs(w).astype(np.float64), 448.0)
    i = np.clip(np.searchsorted(values, a), 1, len(values) - 1)
    lo, hi = values[i - 1], values[i]
    up = (hi - a < a - lo) | ((hi - a == a - lo) & (codes[i] % 2 == 0))
    c = np.where(up, codes[i], codes[i - 1]).astype(np.uint8)
    return np.where(w < 0, c | 0x80, c).astype(np.uint8)


def calibrate(model_dir, prompt):
    """max |k| and max |v| per layer over the prompt, from the reference's forward pass."""
    maxima = []
    model = ref.Model(model_dir)
    model.kv_kind = "e4m3"   # makes attention hand every k and v to round_f8, which only records them
    real = ref.round_f8

    def record(x, kind, scale):
        maxima.append(float(x.abs().max()))
        return x
    ref.round_f8 = record
    try:
        with torch.no_grad():
            model.forward(prompt)
    finally:
        ref.round_f8 = real
    return [(maxima[2 * i], maxima[2 * i + 1]) for i in range(len(maxima) // 2)]


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt-ids", required=True, help="calibration prompt, comma-separated ids")
    ap.add_argument("--kv-scale", default="calibrated")
    args = ap.parse_args()
    prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    cfg = ref.load_config(args.model)
    if args.kv_scale == "calibrated":
        scales = [(k / 448.0, v / 448.0) for k, v in calibrate(args.model, prompt)]
    else:
        scales = [(float(args.kv_scale), float(args.kv_scale))] * cfg["layers"]
    W = ref.Weights(args.model)
    out = {}
    for name, (_, _, info) in sorted(W.entries.items()):
        w = W.get(name, info["shape"]).numpy()
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            s = np.float32(np.abs(w).max()) / np.float32(448.0)
            out[name] = ("F8_E4M3", w.shape, e4m3_codes((w.astype(np.float32) / s).astype(np.float32)).tobytes())
            out[name[:-len(".weight")] + ".weight_scale"] = ("F32", [], np.array([s], "<f4").tobytes())
        else:
            out[name] = ("F32", w.shape, w.astype("<f4").tobytes())
    for i, (k, v) in enumerate(scales):
        out[f"model.layers.{i}.self_attn.k_scale"] = ("F32", [], np.array([k], "<f4").tobytes())
        out[f"model.layers.{i}.self_attn.v_scale"] = ("F32", [], np.array([v], "<f4").tobytes())
    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.model):
        if f.endswith(".json") and not f.startswith("model.safetensors"):
            shutil.copy(os.path.join(args.model, f), args.out)
    with open(os.path.join(args.model, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    write_safetensors(os.path.join(args.out, "model.safetensors"), out)
    for i, (k, v) in enumerate(scales):
        print(f"layer {i}: k_scale {k:.6g} v_scale {v:.6g}")


if __name__ == "__main__":
    main()
