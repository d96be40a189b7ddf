#!/usr/bin/env python3
"""Independent float64 reference of the Hugging Face Llama-family forward pass.

Produces golden files (greedy token ids and first-step logits) for llmesh's
correctness tests. It is run BY HAND, not in CI, and it deliberately shares no
code (and no file-format parsing) with the C++ engine, so that a bug in one is
not silently mirrored in the other.

Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
Phi3ForCausalLM (fused qkv_proj and gate_up_proj, split here), Qwen3MoeForCausalLM and
MixtralForCausalLM (every layer's MLP a mixture of experts: softmax router, top-k,
renormalised; Qwen2MoeForCausalLM adds a shared expert scaled by a sigmoid gate),
GraniteForCausalLM (embedding, attention, residual and logit multipliers), SmolLM3ForCausalLM (Llama with
NoPE layers: no_rope_layers, every fourth by default), GemmaForCausalLM, Gemma2ForCausalLM and Gemma3ForCausalLM (norms times
1 + weight, the embedding times sqrt(hidden) in the weights' dtype, tanh-GELU GeGLU; Gemma 2/3
also normalise each block's output, soft-cap scores and logits, alternate sliding and global
layers, and Gemma 3 gives its sliding layers their own rotary base), GptOssForCausalLM (see
Model.moe_gpt_oss and Model.attention: biased router, softmax over the top-k logits, clamped
SwiGLU experts with interleaved gate/up columns and biases, per-head attention sinks, sliding
and full layers by layer_types; MXFP4 experts decoded by Weights.mxfp4); rope_scaling linear,
llama3, yarn, dynamic (vLLM's fixed NTK base) and longrope (vLLM's choice of long factors by the served context) and
partial_rotary_factor; with
weights in model.safetensors or a sharded model.safetensors.index.json
(F32, F16 or BF16; AWQ (GEMM), GPTQ and compressed-tensors pack-quantized checkpoints'
packed layers decoded from their quantization_config, see Weights.unpack and
Weights.unpack_compressed; FP8 checkpoints' F8_E4M3 layers times their scale, see
Weights.fp8; GPT-OSS's MXFP4 (U8) expert blocks and scales, see Weights.mxfp4).
Everything is computed in float64; the full sequence is recomputed at every step
(no KV cache), which is fine for tiny models.

Needs only python3 with numpy and torch (Debian: python3-numpy python3-torch).

Usage:
  python3 llama_reference.py --model DIR --prompt-ids 1,2,3 --max-tokens 32 \
      --out-ids ids.txt --out-logits logits.f32 [--quantize int8]

--quantize int8 applies llmesh's `--quantization int8` to the projection weights
and the LM head first (re-implemented here from its definition, in float32
torch arithmetic), then runs the same float64 forward pass. --quantize gguf
applies it only to the matrices a GGUF file holds in a block type llmesh
re-quantizes (Q5_1; its Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K and Q6_K blocks are
read exactly), as the model directory's gguf_types.json (hf_to_gguf.py
--decoded) lists them; GPT-OSS's attention and LM head likewise, its MXFP4 experts read exactly
(experts in a requantized type are refused).

--kv-cache-dtype fp8 (e4m3) or fp8_e5m2 rounds every key and value as llmesh's
8-bit KV cache holds them (see round_f8): x / scale in float32, to the nearest
8-bit float, saturating, then times the scale; the scale is the layer's k_scale /
v_scale from the checkpoint (the names vLLM reads), else 1.

--out-ids gets the generated ids, space-separated on one line. --out-logits
gets the logits after the last prompt token (the first generated position) as
raw little-endian float32. stdout shows the ids and the smallest top-1/top-2
logit gap over all generated positions, to judge how fragile greedy is.
"""

import argparse
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    sys.exit(f"error: {e}. Debian's python3-numpy/python3-torch are only visible to "
             "/usr/bin/python3 (not a pyenv or venv python).")

GEMMAS = ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM")
SUPPORTED_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                   "Phi3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
                   "GraniteForCausalLM", "GptOssForCausalLM", "SmolLM3ForCausalLM", "Ministral3ForCausalLM") + GEMMAS
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)   # e2m1 codes


# ---------------------------------------------------------------- safetensors

def read_safetensors_header(path):
    """Returns (header dict without __metadata__, byte offset where data starts)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    header.pop("__metadata__", None)
    return header, 8 + n


class Weights:
    """Lazily decodes tensors from one or more safetensors files into float64."""

    def __init__(self, model_dir):
        single = os.path.join(model_dir, "model.safetensors")
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(single):
            files = {"model.safetensors"}
            name_to_file = None
        elif os.path.exists(index):
            with open(index) as f:
                name_to_file = json.load(f)["weight_map"]
            files = set(name_to_file.values())
        else:
            sys.exit(f"error: no model.safetensors or model.safetensors.index.json in {model_dir}")
        self.entries = {}  # name -> (path, data_start, info)
        for fname in sorted(files):
            path = os.path.join(model_dir, fname)
            header, start = read_safetensors_header(path)
            for name, info in header.items():
                if name_to_file is not None and name_to_file.get(name) != fname:
                    continue
                self.entries[name] = (path, start, info)
        if name_to_file is not None:
            missing = [n for n in name_to_file if n not in self.entries]
            if missing:
                sys.exit(f"error: index names tensors not found in their shard: {missing[:5]}")
        self.maps = {}
        with open(os.path.join(model_dir, "config.json")) as f:
            self.qcfg = json.load(f).get("quantization_config")

    def has(self, name):
        x = name[:-len(".weight")] if name.endswith(".weight") else None
        return name in self.entries or (x is not None and (x + ".qweight" in self.entries or x + ".weight_packed" in self.entries))

    def dtype(self, name):
        return self.entries[name][2]["dtype"]

    def raw(self, name, dtype):
        """A tensor's elements as stored (numpy dtype `dtype`), with its shape."""
        if name not in self.entries:
            sys.exit(f"error: tensor {name} missing")
        path, start, info = self.entries[name]
        if path not in self.maps:
            self.maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        begin, end = info["data_offsets"]
        return np.asarray(self.maps[path][start + begin:start + end]).view(dtype).reshape(info["shape"])

    def unpack(self, x, shape):
        """Layer x of an AWQ or GPTQ checkpoint as weights [out, in]: w = s * (q - z), with q, z
        and s those of the input's group. GPTQ (AutoGPTQ's QuantLinear): qweight [in / pack, out],
        input i in bits bits*(i % pack) of row i // pack; qzeros [groups, out / pack], output o in
        bits bits*(o % pack), stored less one (checkpoint_format "gptq"); g_idx gives each input's
        group. AWQ (AutoAWQ's WQLinear_GEMM): qweight [in, out / 8] and qzeros [groups, out / 8],
        nibble p of a word holding output 8 * (o // 8) + (0, 2, 4, 6, 1, 3, 5, 7)[p]. Where
        llmesh cannot keep the values exactly in its int8 blocks (a block of 32 inputs spanning
        groups, as act-order GPTQ has; 8-bit zeros other than 128) it requantizes the matrix with
        its int8 rule, and so does this reference."""
        q = self.qcfg
        if not q or q.get("quant_method") not in ("awq", "gptq"):
            sys.exit(f"error: {x}.qweight without an AWQ or GPTQ quantization_config")
        awq = q["quant_method"] == "awq"
        bits = q.get("bits", q.get("w_bit", 4))
        pack, mask = 32 // bits, (1 << bits) - 1
        out, n_in = shape
        group = q.get("group_size", q.get("q_group_size", 128))
        group = n_in if group == -1 else group
        qw = self.raw(x + ".qweight", "<u4").astype(np.int64)
        qz = self.raw(x + ".qzeros", "<u4").astype(np.int64)
        s = self.get(x + ".scales", [-(-n_in // group), out]).numpy()
        if awq:
            nibble = np.argsort([0, 2, 4, 6, 1, 3, 5, 7])   # output o % 8 -> its nibble
            shifts = (4 * nibble)[None, None, :]
            Q = ((qw[:, :, None] >> shifts) & mask).reshape(n_in, out)
            Z = ((qz[:, :, None] >> shifts) & mask).reshape(-1, out)
            g = np.arange(n_in) // group
        else:
            shifts = bits * np.arange(pack)
            Q = ((qw[:, None, :] >> shifts[None, :, None]) & mask).reshape(n_in, out)
            Z = ((qz[:, :, None] >> shifts[None, None, :]) & mask).reshape(-1, out)
            if q.get("checkpoint_format", "gptq") == "gptq":
                Z = Z + 1
            g = self.raw(x + ".g_idx", "<i4").astype(np.int64) if x + ".g_idx" in self.entries else np.arange(n_in) // group
        w = torch.from_numpy((s[g, :] * (Q - Z[g, :]).astype(np.float64)).T.copy())
        return w if self.int8_exact(g, bits == 4 or np.all(Z == 128)) else quantize_int8(w)

    @staticmethod
    def int8_exact(g, fits):
        """Whether llmesh holds a layer exactly: every block of 32 inputs in one group (g: each
        input's group) and every q - z within int8 (`fits`)."""
        padded = np.concatenate([g, np.full((-len(g)) % 32, -1)])
        uniform = all(np.all((b == b[0]) | (b == -1)) for b in padded.reshape(-1, 32))
        return uniform and bool(fits)

    def unpack_compressed(self, x, shape):
        """Layer x of a compressed-tensors pack-quantized checkpoint (compressed_tensors'
        pack_to_int32 / unpack_from_int32): weight_packed [out, ceil(in / pack)], value j of each
        word in bits bits*j, the signed quant plus 2**(bits - 1); weight_scale [out, groups];
        weight_zero_point (asymmetric) packed the same way along dim 0, [ceil(out / pack),
        groups]; weight_g_idx gives each input's group. w = s * (q - zp)."""
        grp = next(iter(self.qcfg["config_groups"].values()))["weights"]
        bits = grp.get("num_bits", 8)
        pack, mask, offset = 32 // bits, (1 << bits) - 1, 1 << (bits - 1)
        out, n_in = shape
        shifts = bits * np.arange(pack)
        packed = self.raw(x + ".weight_packed", "<u4").astype(np.int64)
        Q = ((packed[:, :, None] >> shifts[None, None, :]) & mask).reshape(out, -1)[:, :n_in] - offset
        groups = 1 if grp.get("strategy") == "channel" else -(-n_in // grp["group_size"])
        s = self.get(x + ".weight_scale", [out, groups]).numpy()
        if grp.get("symmetric", True):
            ZP = np.zeros((out, groups), dtype=np.int64)
        else:
            zp = self.raw(x + ".weight_zero_point", "<u4").astype(np.int64)
            ZP = ((zp[:, None, :] >> shifts[None, :, None]) & mask).reshape(-1, groups)[:out] - offset
        if x + ".weight_g_idx" in self.entries:
            g = self.raw(x + ".weight_g_idx", "<i4").astype(np.int64)
        else:
            g = np.arange(n_in) // (n_in if groups == 1 else grp["group_size"])
        w = torch.from_numpy(s[:, g] * (Q - ZP[:, g]).astype(np.float64))
        return w if self.int8_exact(g, bits == 4 or np.all(ZP == 0)) else quantize_int8(w)

    def fp8(self, x, raw, shape):
        """Layer x of an FP8 checkpoint: OCP e4m3fn codes (sign, 4 exponent bits of bias 7,
        3 mantissa bits; exponent 0: subnormal m/8 * 2^-6; S.1111.111 NaN) times the scale
        X.weight_scale(_inv) — one per tensor ([] or [1]), per output ([out] or [out, 1]), per
        group of group_size inputs ([out, groups], compressed-tensors' strategy group) or per
        block ([ceil(out/r), ceil(in/c)], weight_block_size or block_structure [r, c]) —
        multiplied in float32 (the dequantized weight's definition)."""
        out, n_in = shape
        u = raw.astype(np.int64).reshape(out, n_in)
        e, m = (u >> 3) & 15, (u & 7).astype(np.float64)
        mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * np.exp2(e - 7.0))
        if np.any((u & 0x7f) == 0x7f):
            sys.exit(f"error: {x}.weight holds a NaN code")
        codes = np.where(u & 0x80, -mag, mag).astype(np.float32)
        sname = x + ".weight_scale_inv" if x + ".weight_scale_inv" in self.entries else x + ".weight_scale"
        sshape = list(self.entries[sname][2]["shape"])
        s = self.get(sname, sshape).numpy().astype(np.float32)
        q = self.qcfg or {}
        block = q.get("weight_block_size")
        if q.get("quant_method") == "compressed-tensors":
            w = next(iter(q["config_groups"].values()))["weights"]
            if w.get("strategy") == "block":
                block = w["block_structure"]
            elif w.get("strategy") == "group":
                block = [1, w["group_size"]]
        if s.size == 1:
            full = np.full((out, n_in), s.reshape(-1)[0], dtype=np.float32)
        elif block is None:
            full = np.repeat(s.reshape(out, 1), n_in, axis=1)
        else:
            r, c = block
            full = np.repeat(np.repeat(s.reshape(-(-out // r), -(-n_in // c)), r, axis=0), c, axis=1)[:out, :n_in]
        return (codes * full).astype(np.float64).reshape(-1)

    def mxfp4(self, x, shape):
        """GPT-OSS's MXFP4 experts x (mlp.experts.gate_up_proj or .down_proj) as HF's parameter
        [E, in, out], decoded as transformers' convert_moe_packed_tensors (then transposed):
        x_blocks (U8) [E, out, in / 32, 16] and x_scales (U8) [E, out, in / 32]; byte j of a
        block's 16 holds element 2j in its low nibble and 2j + 1 in its high one, each an e2m1
        code (FP4_VALUES); value = FP4_VALUES[code] * 2^(scale - 127). HF decodes into bfloat16,
        which holds every such value exactly; a scale byte above 252 (255: the format's NaN;
        253, 254: values float32 cannot hold) is refused."""
        if (self.qcfg or {}).get("quant_method") != "mxfp4":
            sys.exit(f"error: {x}_blocks without an mxfp4 quantization_config")
        E, n_in, out = shape
        if n_in % 32:
            sys.exit(f"error: {x}: input size {n_in} not a multiple of 32")
        for suffix, want in (("_blocks", [E, out, n_in // 32, 16]), ("_scales", [E, out, n_in // 32])):
            info = self.entries.get(x + suffix, (None, None, None))[2]
            if info is None or info["dtype"] != "U8" or list(info["shape"]) != want:
                sys.exit(f"error: {x}{suffix} missing or not U8 {want}")
        blocks = self.raw(x + "_blocks", np.uint8).astype(np.int64)   # [E, out, G, 16]
        scales = self.raw(x + "_scales", np.uint8).astype(np.int64)   # [E, out, G]
        if np.any(scales > 252):
            sys.exit(f"error: {x}_scales holds an exponent byte above 252")
        lut = np.array(FP4_VALUES, dtype=np.float64)
        codes = np.empty(blocks.shape[:-1] + (32,), dtype=np.float64)
        codes[..., 0::2] = lut[blocks & 0x0F]
        codes[..., 1::2] = lut[blocks >> 4]
        w = np.ldexp(codes, (scales - 127).astype(np.int32)[..., None])   # exact in float64
        return torch.from_numpy(w.reshape(E, out, n_in).transpose(0, 2, 1).copy())

    def get(self, name, shape):
        if name not in self.entries and name + "_blocks" in self.entries:
            return self.mxfp4(name, shape)
        if name not in self.entries and name.endswith(".weight") and name[:-len(".weight")] + ".qweight" in self.entries:
            return self.unpack(name[:-len(".weight")], shape)
        if name not in self.entries and name.endswith(".weight") and name[:-len(".weight")] + ".weight_packed" in self.entries:
            return self.unpack_compressed(name[:-len(".weight")], shape)
        if name not in self.entries:
            sys.exit(f"error: tensor {name} missing")
        path, start, info = self.entries[name]
        if list(info["shape"]) != list(shape):
            sys.exit(f"error: tensor {name} has shape {info['shape']}, expected {list(shape)}")
        if path not in self.maps:
            self.maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        begin, end = info["data_offsets"]
        raw = np.asarray(self.maps[path][start + begin:start + end])
        dtype = info["dtype"]
        if dtype == "F32":
            arr = raw.view("<f4").astype(np.float64)
        elif dtype == "F16":
            arr = raw.view("<f2").astype(np.float64)
        elif dtype == "BF16":
            bits = raw.view("<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32).astype(np.float64)
        elif dtype == "U8":
            arr = raw.astype(np.float64)
        elif dtype == "F8_E4M3" and name.endswith(".weight") and len(shape) == 2:
            arr = self.fp8(name[:-len(".weight")], raw, shape)
        else:
            sys.exit(f"error: tensor {name} has unsupported dtype {dtype}")
        if arr.size != math.prod(shape):
            sys.exit(f"error: tensor {name} byte size does not match its shape")
        return torch.from_numpy(arr.reshape(shape).copy())


# ---------------------------------------------------------------- int8

def quantize_int8(w):
    """llmesh's weight-only int8 (kernels/include/llmesh/kernels/dtype.hpp, quantize.hpp):
    blocks of 32 along each row; scale = max|w| / 127 in float32; q = w / scale in float32,
    rounded half to even and clamped to +-127 (0 where the scale is 0); value = q * scale in
    float32. Returns the dequantized weights as float64."""
    rows, cols = w.shape
    pad = (-cols) % 32
    w32 = torch.nn.functional.pad(w.to(torch.float32), (0, pad)).view(rows, -1, 32)
    scale = w32.abs().amax(dim=-1, keepdim=True) / torch.tensor(127.0, dtype=torch.float32)
    q = torch.where(scale == 0, torch.zeros_like(w32), torch.round(w32 / scale)).clamp(-127.0, 127.0)
    return (q * scale).view(rows, -1)[:, :cols].to(torch.float64)


def e4m3_values(codes):
    """The OCP e4m3fn values of non-negative codes (0..126): 2^(e-7) * (1 + m/8), or m/8 * 2^-6."""
    e, m = (codes >> 3) & 15, (codes & 7).astype(np.float64)
    return np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * np.exp2(e - 7.0))


def quantize_fp8(ws):
    """vLLM's online FP8 (llmesh --quantization fp8 on an unquantized checkpoint) of the
    matrices `ws`, which vLLM holds as one fused layer (q, k, v; gate and up): one scale
    max|w| / 448 over all of them, in float32; each weight times the scale's float32 reciprocal
    (float32), rounded to the nearest e4m3 value (ties to the even code), saturating at 448;
    dequantized as value * scale in float32. Returns the dequantized matrices as float64."""
    w32 = [w.to(torch.float32).numpy() for w in ws]
    scale = np.float32(max(float(np.abs(w).max()) for w in w32)) / np.float32(448.0)
    if scale == 0:
        return [torch.zeros_like(w) for w in ws]
    inverse = np.float32(1.0) / scale
    codes = np.arange(0, 127)
    values = e4m3_values(codes)
    out = []
    for w in w32:
        a = np.minimum(np.abs((w * inverse).astype(np.float32)).astype(np.float64), 448.0)
        i = np.clip(np.searchsorted(values, a), 1, len(values) - 1)
        lo, hi = values[i - 1], values[i]
        up = (hi - a < a - lo) | ((hi - a == a - lo) & (codes[i] % 2 == 0))
        v = np.where(up, hi, lo) * np.sign(w)
        out.append(torch.from_numpy((v.astype(np.float32) * scale).astype(np.float64)))
    return out


def f8_values(kind):
    """The non-negative finite values of OCP e4m3fn (codes 0..126) or e5m2 (0..123), with their codes."""
    if kind == "e4m3":
        codes = np.arange(0, 127)
        return codes, e4m3_values(codes)
    codes = np.arange(0, 124)
    e, m = (codes >> 2) & 31, (codes & 3).astype(np.float64)
    return codes, np.where(e == 0, m / 4.0 * 2.0 ** -14, (1.0 + m / 4.0) * np.exp2(e - 15.0))


def round_f8(x, kind, scale):
    """An 8-bit float KV cache's copy of x (float64 tensor): x in float32 divided by the float32
    scale, rounded to the nearest value of `kind` (ties to the even code), saturating at the
    largest finite one; read back as that value times the scale in float32."""
    codes, values = f8_values(kind)
    s = np.float32(scale)
    a32 = (x.numpy().astype(np.float32) / s).astype(np.float32)
    a = np.minimum(np.abs(a32).astype(np.float64), values[-1])
    i = np.clip(np.searchsorted(values, a), 1, len(values) - 1)
    lo, hi = values[i - 1], values[i]
    up = (hi - a < a - lo) | ((hi - a == a - lo) & (codes[i] % 2 == 0))
    v = (np.where(up, hi, lo) * np.sign(a32)).astype(np.float32)
    return torch.from_numpy((v * s).astype(np.float32).astype(np.float64))


def kv_scales(W, p):
    """A layer's FP8 KV-cache scales (k, v) under the names vLLM reads (prefix p = ...self_attn.;
    the largest where a layer has several), a key scale alone serving both; (1, 1) when the
    checkpoint has none or its quantization_config is not fp8 / compressed-tensors (vLLM reads
    them for those only)."""
    if (W.qcfg or {}).get("quant_method") not in ("fp8", "fbgemm_fp8", "compressed-tensors"):
        return 1.0, 1.0

    def scalar(name):
        if name not in W.entries:
            return 0.0
        t = W.get(name, list(W.entries[name][2]["shape"]))
        return float(t.reshape(-1)[0])
    k = max([scalar(p + n) for n in ("k_scale", "k_proj.k_scale", "k_proj.output_scale", "kv_scale")])
    v = max([scalar(p + n) for n in ("v_scale", "v_proj.v_scale", "v_proj.output_scale")])
    if k == 0.0 and v > 0.0:
        sys.exit(f"error: {p}v_scale without a key scale")
    if k == 0.0:
        return 1.0, 1.0
    return k, (v if v > 0.0 else k)


# ---------------------------------------------------------------- config

def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    arch = (c.get("architectures") or ["<none>"])[0]
    if arch not in SUPPORTED_ARCHS:
        sys.exit(f"error: unsupported architecture {arch}")
    gemma = arch in GEMMAS
    if gemma:   # HF's Gemma MLPs take hidden_activation (missing: the tanh GELU)
        if (c.get("hidden_activation") or "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            sys.exit(f"error: hidden_activation {c.get('hidden_activation')} is not gelu_pytorch_tanh")
    elif arch != "GptOssForCausalLM" and c.get("hidden_act", "silu") != "silu":   # GPT-OSS: its own SwiGLU
        sys.exit(f"error: hidden_act {c.get('hidden_act')} is not silu")
    moe_qwen = arch in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM")
    cfg = {
        "arch": arch,
        "hidden": c["hidden_size"],
        "inter": c["moe_intermediate_size"] if moe_qwen else c["intermediate_size"],
        "layers": c["num_hidden_layers"],
        "heads": c["num_attention_heads"],
        "eps": c["rms_norm_eps"],
        "theta": c.get("rope_theta") or 10000.0,
        "vocab": c["vocab_size"],
        "tied": bool(c.get("tie_word_embeddings", gemma or arch == "SmolLM3ForCausalLM")),   # Gemma's and SmolLM3's default to tied
        "rope_scaling": c.get("rope_scaling"),
    }
    cfg["kv_heads"] = c.get("num_key_value_heads") or (4 if arch == "SmolLM3ForCausalLM" else cfg["heads"])   # SmolLM3Config's default 4
    # HF's Qwen3Config defaults head_dim to 128; the others derive it.
    qwen3 = arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
    cfg["head_dim"] = c.get("head_dim") or (128 if qwen3 else 256 if gemma else 64 if arch == "GptOssForCausalLM"
                                            else cfg["hidden"] // cfg["heads"])
    if cfg["heads"] % cfg["kv_heads"] != 0:
        sys.exit("error: num_attention_heads not a multiple of num_key_value_heads")
    if arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"):
        cfg["qkv_bias"], cfg["o_bias"] = True, False
    elif arch in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "GraniteForCausalLM",
                  "SmolLM3ForCausalLM") + GEMMAS:
        cfg["qkv_bias"] = cfg["o_bias"] = bool(c.get("attention_bias", False))
    elif arch == "GptOssForCausalLM":   # GptOssConfig: attention_bias defaults to true
        cfg["qkv_bias"] = cfg["o_bias"] = bool(c.get("attention_bias", True))
    else:  # Mistral, Phi-3: no biases
        cfg["qkv_bias"] = cfg["o_bias"] = False
    # HF's partial_rotary_factor: only the first head_dim * factor dims of each head rotate.
    rp = c.get("rope_parameters") or {}
    partial = rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    cfg["rotary_dim"] = int(cfg["head_dim"] * partial)
    if cfg["rotary_dim"] % 2 or cfg["rotary_dim"] <= 0:
        sys.exit("error: partial_rotary_factor gives an odd or empty rotary dimension")
    cfg["max_pos"] = c.get("max_position_embeddings", 2048)
    cfg["orig_max_pos"] = c.get("original_max_position_embeddings")   # Phi-3's top-level field (longrope)
    cfg["fused"] = arch == "Phi3ForCausalLM"
    window = None
    if arch in ("MistralForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM") or (
            arch == "Qwen2ForCausalLM" and c.get("use_sliding_window")):
        window = c.get("sliding_window")
    if qwen3 and c.get("use_sliding_window"):
        sys.exit("error: Qwen3 use_sliding_window is not supported")
    cfg["window"] = window
    cfg["layer_windows"] = [window] * cfg["layers"]
    cfg["layer_sliding"] = [False] * cfg["layers"]
    cfg["qk_norm"] = qwen3 or arch == "Gemma3ForCausalLM"   # per-head RMSNorm of q and k before RoPE
    cfg["gemma"], cfg["sandwich"] = gemma, arch in GEMMAS[1:]
    cfg["scale"] = 1.0 / math.sqrt(cfg["head_dim"])
    cfg["attn_cap"] = cfg["final_cap"] = None
    cfg["local_theta"] = None
    # HF GraniteModel: embeddings * embedding_multiplier, scaling = attention_multiplier,
    # residual + out * residual_multiplier, logits / logits_scaling.
    granite = arch == "GraniteForCausalLM"
    cfg["embed_mult"] = c.get("embedding_multiplier", 1.0) if granite else 1.0
    cfg["resid_mult"] = c.get("residual_multiplier", 1.0) if granite else 1.0
    cfg["logits_div"] = c.get("logits_scaling", 1.0) if granite else 1.0
    if granite:
        cfg["scale"] = c.get("attention_multiplier", 1.0)
    if cfg["sandwich"]:   # Gemma 2 and 3
        g2 = arch == "Gemma2ForCausalLM"
        cfg["attn_cap"] = c.get("attn_logit_softcapping", 50.0 if g2 else None)
        cfg["final_cap"] = c.get("final_logit_softcapping", 30.0 if g2 else None)
        cfg["scale"] = c.get("query_pre_attn_scalar", 256) ** -0.5
        n = cfg["layers"]
        if c.get("layer_types"):
            sliding = [t == "sliding_attention" for t in c["layer_types"]]
        elif g2:   # HF Gemma2: is_sliding = not bool(layer_idx % 2)
            sliding = [i % 2 == 0 for i in range(n)]
        else:      # HF Gemma3: is_sliding = bool((layer_idx + 1) % sliding_window_pattern)
            pattern = c.get("sliding_window_pattern", 6)
            sliding = [(i + 1) % pattern != 0 for i in range(n)]
        w = c.get("sliding_window", 4096)   # the config classes' default; null: none
        cfg["layer_windows"] = [w if (s_ and w) else None for s_ in sliding]
        cfg["layer_sliding"] = sliding
        if not g2:
            cfg["local_theta"] = c.get("rope_local_base_freq", 10000.0)
            cfg["theta"] = c.get("rope_theta") or 1000000.0   # Gemma3TextConfig's default
    cfg["experts"] = 0
    if moe_qwen:
        if c.get("decoder_sparse_step", 1) != 1 or c.get("mlp_only_layers"):
            sys.exit("error: dense layers among MoE ones are not supported")
        cfg["experts"], cfg["top_k"] = c["num_experts"], c["num_experts_per_tok"]
        cfg["norm_topk"] = bool(c.get("norm_topk_prob", False))
        if arch == "Qwen2MoeForCausalLM":   # HF: shared_expert, shared_expert_gate
            cfg["shared_inter"] = c.get("shared_expert_intermediate_size", 5632)
    elif arch == "MixtralForCausalLM":
        cfg["experts"], cfg["top_k"], cfg["norm_topk"] = c["num_local_experts"], c["num_experts_per_tok"], True
    cfg["nope"] = [False] * cfg["layers"]
    cfg["q_temp"] = None
    if arch == "Ministral3ForCausalLM":
        # HF Ministral3: Mistral's layers; rope_parameters (yarn, Ministral3Config's defaults when
        # absent) also hold llama_4_scaling_beta: each query times
        # 1 + beta * ln(1 + floor(position / original_max_position_embeddings)) after the rotary.
        rp = c.get("rope_parameters") or {
            "type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 16384,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}
        cfg["rope_scaling"] = c.get("rope_scaling") or rp
        cfg["theta"] = c.get("rope_theta") or rp.get("rope_theta") or 10000.0
        cfg["max_pos"] = c.get("max_position_embeddings", 262144)
        if cfg["rope_scaling"].get("llama_4_scaling_beta"):
            cfg["q_temp"] = (cfg["rope_scaling"]["llama_4_scaling_beta"], cfg["rope_scaling"]["original_max_position_embeddings"])
        cfg["window"] = c.get("sliding_window")
        cfg["layer_windows"] = [cfg["window"]] * cfg["layers"]
    if arch == "SmolLM3ForCausalLM":
        # HF SmolLM3: no_rope_layers[i] == 0 leaves layer i's q and k unrotated (default: every
        # no_rope_layer_interval-th layer); with use_sliding_window and a sliding_window, the
        # layers layer_types calls sliding (default: the NoPE ones) slide. rope_theta default 2e6.
        n = cfg["layers"]
        flags = c.get("no_rope_layers") or [int((i + 1) % c.get("no_rope_layer_interval", 4) != 0) for i in range(n)]
        cfg["nope"] = [not f for f in flags]
        cfg["theta"] = c.get("rope_theta") or 2000000.0
        cfg["max_pos"] = c.get("max_position_embeddings", 32768)
        w = c.get("sliding_window")
        if c.get("use_sliding_window") and w:
            types = c.get("layer_types") or ["sliding_attention" if nope else "full_attention" for nope in cfg["nope"]]
            cfg["layer_sliding"] = [t == "sliding_attention" for t in types]
            cfg["layer_windows"] = [w if s_ else None for s_ in cfg["layer_sliding"]]
    cfg["gpt_oss"] = arch == "GptOssForCausalLM"
    if cfg["gpt_oss"]:
        # GptOssConfig: rope_theta 150000, layer_types default sliding on even layers,
        # sliding_window 128, yarn (factor 32 over 4096, beta 32 / 1, truncate false) when absent;
        # every layer's MLP is the biased-router MoE, its SwiGLU clamped at swiglu_limit.
        cfg["theta"] = c.get("rope_theta") or 150000.0
        rp = c.get("rope_parameters") or {}
        cfg["rope_scaling"] = c.get("rope_scaling") or (rp if rp.get("rope_type") else None) or {
            "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
            "original_max_position_embeddings": 4096}
        cfg["max_pos"] = c.get("max_position_embeddings", 131072)
        n = cfg["layers"]
        types = c.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
        if len(types) != n or any(t not in ("sliding_attention", "full_attention") for t in types):
            sys.exit("error: layer_types must name sliding_attention or full_attention for every layer")
        w = c.get("sliding_window", 128)
        cfg["layer_sliding"] = [t == "sliding_attention" for t in types]
        cfg["layer_windows"] = [w if (s_ and w) else None for s_ in cfg["layer_sliding"]]
        cfg["experts"] = c["num_local_experts"]
        cfg["top_k"] = c.get("num_experts_per_tok") or c.get("experts_per_token") or 4
        cfg["swiglu_limit"] = c.get("swiglu_limit", 7.0)
        cfg["swiglu_alpha"] = c.get("swiglu_alpha", 1.702)
    return cfg


# ---------------------------------------------------------------- model

def rope_inv_freq(cfg, theta=None, rs=None, max_model_len=None):
    """Returns (inv_freq [rotary_dim/2], the factor cos and sin are multiplied by)."""
    d = cfg["rotary_dim"]
    base = theta or cfg["theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = cfg["rope_scaling"] if theta is None else rs
    if not rs:
        return inv_freq, 1.0
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":   # HF's linear interpolation
        return inv_freq / rs["factor"], 1.0
    if kind == "yarn":
        # YaRN (Peng et al. 2023, "NTK-by-parts" + attention temperature), as vLLM applies it:
        # dims turning more than beta_fast times over the original context keep their frequency,
        # those turning fewer than beta_slow times are interpolated (divided by the factor), a
        # linear ramp between; cos and sin are scaled by 0.1 ln(factor) + 1.
        factor = rs["factor"]
        orig = rs.get("original_max_position_embeddings") or cfg["max_pos"]
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def dim_of(rotations):   # the dim index i (of d) whose wavelength fits `rotations` times into orig
            return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = dim_of(beta_fast), dim_of(beta_slow)
        if rs.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, d - 1)
        if lo == hi:
            hi += 0.001
        out = []
        for i, f in enumerate(inv_freq.tolist()):
            r = min(max((i - lo) / (hi - lo), 0.0), 1.0)   # 0: extrapolate (keep), 1: interpolate
            out.append(f * (1 - r) + (f / factor) * r)
        mscale = rs.get("attention_factor")

        def get_mscale(m):   # HF's _compute_yarn_parameters
            return 0.1 * m * math.log(factor) + 1 if factor > 1 else 1.0
        if mscale is None and rs.get("mscale") and rs.get("mscale_all_dim"):
            mscale = get_mscale(rs["mscale"]) / get_mscale(rs["mscale_all_dim"])
        if mscale is None:
            mscale = get_mscale(1.0)
        return torch.tensor(out, dtype=torch.float64), mscale * rs.get("attn_factor", 1.0)
    if kind in ("longrope", "su"):
        # LongRoPE (Phi-3): per-frequency divisors, the long ones when the served context
        # (max_model_len, default the model's) exceeds the original one (vLLM's rule);
        # cos/sin scaled by sqrt(1 + ln(s) / ln(orig)), s = max_position_embeddings / orig.
        orig = rs.get("original_max_position_embeddings") or cfg["orig_max_pos"]
        ctx = max_model_len or cfg["max_pos"]
        ext = rs["long_factor"] if ctx > orig else rs["short_factor"]
        assert len(ext) == d // 2
        s_ = cfg["max_pos"] / orig
        mscale = rs.get("attention_factor") or (1.0 if s_ <= 1 else math.sqrt(1 + math.log(s_) / math.log(orig)))
        return inv_freq / torch.tensor(ext, dtype=torch.float64), mscale
    if kind == "dynamic":
        # Dynamic NTK as vLLM applies it: the NTK-aware base for a sequence of the longest
        # context, seq = max_position_embeddings * factor, at every position:
        # base * (factor * seq / max_pos - (factor - 1)) ** (d / (d - 2)); Hunyuan's alpha form
        # base * alpha ** (d / (d - 2)).
        if "alpha" in rs:
            ntk = rs["alpha"]
        else:
            seq = cfg["max_pos"] * rs["factor"]
            ntk = rs["factor"] * seq / cfg["max_pos"] - (rs["factor"] - 1)
        scaled = base * ntk ** (d / (d - 2))
        return 1.0 / (scaled ** (torch.arange(0, d, 2, dtype=torch.float64) / d)), 1.0
    if kind != "llama3":
        sys.exit(f"error: unsupported rope_scaling type {kind}")
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_ctx = rs["original_max_position_embeddings"]
    out = []
    for freq in inv_freq.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            out.append(freq)
        elif wavelen > old_ctx / low:
            out.append(freq / factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(out, dtype=torch.float64), 1.0


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rms_norm(x, w, eps, gemma=False):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * ((1.0 + w) if gemma else w)


def soft_cap(x, cap):
    return x if not cap else torch.tanh(x / cap) * cap


class Model:
    def __init__(self, model_dir, quantize="none", kv_cache="auto"):
        self.cfg = cfg = load_config(model_dir)
        self.kv_kind = {"auto": None, "fp8": "e4m3", "fp8_e5m2": "e5m2"}[kv_cache]
        if cfg["gpt_oss"] and quantize not in ("none", "gguf"):
            sys.exit(f"error: --quantize {quantize} is not implemented for GptOssForCausalLM")
        W = Weights(model_dir)
        H, I, V = cfg["hidden"], cfg["inter"], cfg["vocab"]
        nh, nkv, hd = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        self.embed = W.get("model.embed_tokens.weight", [V, H])
        self.normalizer = cfg["embed_mult"]
        if cfg["gemma"]:   # HF: torch.tensor(hidden_size ** 0.5, dtype=<the embedding's dtype>)
            kind = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
            self.normalizer = float(torch.tensor(H ** 0.5, dtype=kind[W.dtype("model.embed_tokens.weight")]))
        self.layers = []
        for i in range(cfg["layers"]):
            p = f"model.layers.{i}."
            sandwich = cfg["sandwich"]   # Gemma 2/3: post-attention norm, then pre/post-MLP norms
            L = {
                "ln1": W.get(p + "input_layernorm.weight", [H]),
                "ln2": W.get(p + ("pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight"), [H]),
                "post_attn": W.get(p + "post_attention_layernorm.weight", [H]) if sandwich else None,
                "post_mlp": W.get(p + "post_feedforward_layernorm.weight", [H]) if sandwich else None,
                "o": W.get(p + "self_attn.o_proj.weight", [H, nh * hd]),
            }
            L["k_scale"], L["v_scale"] = kv_scales(W, p + "self_attn.")
            L["sinks"] = W.get(p + "self_attn.sinks", [nh]) if cfg["gpt_oss"] else None
            if cfg["gpt_oss"]:   # HF's parameters: router [E, H] + bias; experts [E, in, out] + biases
                E, m = cfg["experts"], p + "mlp."
                L["router"] = W.get(m + "router.weight", [E, H])
                L["router_b"] = W.get(m + "router.bias", [E])
                L["gate_up"] = W.get(m + "experts.gate_up_proj", [E, H, 2 * I])   # columns gate, up, gate, up, ...
                L["gate_up_b"] = W.get(m + "experts.gate_up_proj_bias", [E, 2 * I])
                L["down_e"] = W.get(m + "experts.down_proj", [E, I, H])
                L["down_e_b"] = W.get(m + "experts.down_proj_bias", [E, H])
            elif cfg["experts"]:
                mixtral = cfg["arch"] == "MixtralForCausalLM"
                m = p + ("block_sparse_moe." if mixtral else "mlp.")
                names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
                L["router"] = W.get(m + "gate.weight", [cfg["experts"], H])
                L["experts"] = [
                    (W.get(m + f"experts.{e}.{names[0]}.weight", [I, H]),
                     W.get(m + f"experts.{e}.{names[1]}.weight", [I, H]),
                     W.get(m + f"experts.{e}.{names[2]}.weight", [H, I]))
                    for e in range(cfg["experts"])]
                if cfg.get("shared_inter"):
                    si = cfg["shared_inter"]
                    L["shared"] = (W.get(m + "shared_expert.gate_proj.weight", [si, H]),
                                   W.get(m + "shared_expert.up_proj.weight", [si, H]),
                                   W.get(m + "shared_expert.down_proj.weight", [H, si]))
                    L["shared_gate"] = W.get(m + "shared_expert_gate.weight", [1, H])
            else:
                L["down"] = W.get(p + "mlp.down_proj.weight", [H, I])
            if cfg["fused"]:  # Phi-3: rows q | k | v, and gate | up (HF's split and chunk(2))
                qkv = W.get(p + "self_attn.qkv_proj.weight", [(nh + 2 * nkv) * hd, H])
                L["q"], L["k"], L["v"] = torch.split(qkv, [nh * hd, nkv * hd, nkv * hd], dim=0)
                L["gate"], L["up"] = W.get(p + "mlp.gate_up_proj.weight", [2 * I, H]).chunk(2, dim=0)
            else:
                L["q"] = W.get(p + "self_attn.q_proj.weight", [nh * hd, H])
                L["k"] = W.get(p + "self_attn.k_proj.weight", [nkv * hd, H])
                L["v"] = W.get(p + "self_attn.v_proj.weight", [nkv * hd, H])
                if not cfg["experts"]:
                    L["gate"] = W.get(p + "mlp.gate_proj.weight", [I, H])
                    L["up"] = W.get(p + "mlp.up_proj.weight", [I, H])
            for n, size in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                L[n + "_b"] = W.get(p + f"self_attn.{n}_proj.bias", [size]) if cfg["qkv_bias"] else None
            L["o_b"] = W.get(p + "self_attn.o_proj.bias", [H]) if cfg["o_bias"] else None
            L["q_norm"] = W.get(p + "self_attn.q_norm.weight", [hd]) if cfg["qk_norm"] else None
            L["k_norm"] = W.get(p + "self_attn.k_norm.weight", [hd]) if cfg["qk_norm"] else None
            self.layers.append(L)
        self.norm = W.get("model.norm.weight", [H])
        self.lm_head = self.embed if cfg["tied"] else W.get("lm_head.weight", [V, H])
        requantized = {"q5_1"}
        if quantize == "gguf":   # per matrix, as the file holds it
            kinds = json.load(open(os.path.join(model_dir, "gguf_types.json")))
            names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                     "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
            for i, L in enumerate(self.layers):
                for n, hf in names.items():
                    if n in L and kinds.get(f"model.layers.{i}.{hf}.weight") in requantized:
                        L[n] = quantize_int8(L[n])
                if cfg["gpt_oss"]:   # its experts (MXFP4 read exactly) under llama.cpp's names gate/up/down_proj
                    bad = [x for x in ("gate_proj", "up_proj", "down_proj")
                           if kinds.get(f"model.layers.{i}.mlp.experts.{x}.weight") in requantized]
                    if bad:
                        sys.exit(f"error: layer {i}'s GPT-OSS experts {bad} in a requantized block type: not implemented")
                    continue
                m = f"model.layers.{i}." + ("block_sparse_moe." if cfg["arch"] == "MixtralForCausalLM" else "mlp.")
                mine = ("w1", "w3", "w2") if cfg["arch"] == "MixtralForCausalLM" else ("gate_proj", "up_proj", "down_proj")
                if "experts" in L:   # the router and a shared expert's gate are never requantized
                    L["experts"] = [tuple(quantize_int8(w) if kinds.get(f"{m}experts.{e}.{p}.weight") in requantized else w
                                          for w, p in zip(x, mine)) for e, x in enumerate(L["experts"])]
                if "shared" in L:
                    L["shared"] = tuple(quantize_int8(w) if kinds.get(f"{m}shared_expert.{p}.weight") in requantized else w
                                        for w, p in zip(L["shared"], ("gate_proj", "up_proj", "down_proj")))
            head = "model.embed_tokens.weight" if cfg["tied"] else "lm_head.weight"
            if kinds.get(head) in requantized:
                self.lm_head = quantize_int8(self.lm_head)
        if quantize == "int8":   # the embedding gather keeps the checkpoint's rows
            for L in self.layers:
                for n in ("q", "k", "v", "o", "gate", "up", "down"):
                    if n in L:
                        L[n] = quantize_int8(L[n])
                if "experts" in L:   # the router (and a shared expert's gate) stays as loaded
                    L["experts"] = [tuple(quantize_int8(w) for w in x) for x in L["experts"]]
                if "shared" in L:
                    L["shared"] = tuple(quantize_int8(w) for w in L["shared"])
            self.lm_head = quantize_int8(self.lm_head)
        if quantize == "fp8":   # vLLM's fused layers share a scale; the LM head and routers stay
            for L in self.layers:
                if "q" in L:
                    L["q"], L["k"], L["v"] = quantize_fp8([L["q"], L["k"], L["v"]])
                L["o"], = quantize_fp8([L["o"]])
                if "gate" in L:
                    L["gate"], L["up"] = quantize_fp8([L["gate"], L["up"]])
                    L["down"], = quantize_fp8([L["down"]])
                for key in ("experts", "shared"):
                    if key in L:
                        xs = L["experts"] if key == "experts" else [L["shared"]]
                        done = []
                        for g, u, d in xs:
                            g, u = quantize_fp8([g, u])
                            d, = quantize_fp8([d])
                            done.append((g, u, d))
                        L[key] = done if key == "experts" else done[0]
        self.inv_freq = rope_inv_freq(cfg)
        self.inv_freq_local = None
        if cfg["local_theta"]:   # Gemma 3's sliding layers: their own base, never scaled
            self.inv_freq_local = rope_inv_freq(cfg, cfg["local_theta"], None)

    def moe(self, x, L):
        """HF's sparse MoE block: softmax over the router's logits, the top-k experts per token
        (renormalised over them when norm_topk), their SwiGLU outputs weighted and summed."""
        cfg = self.cfg
        probs = torch.softmax(x @ L["router"].T, dim=-1)            # [T, E]
        weights, chosen = torch.topk(probs, cfg["top_k"], dim=-1)   # [T, k]
        if cfg["norm_topk"]:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for w, e in zip(weights[t].tolist(), chosen[t].tolist()):
                gate, up, down = L["experts"][e]
                y = (torch.nn.functional.silu(x[t] @ gate.T) * (x[t] @ up.T)) @ down.T
                out[t] += w * y
        if "shared" in L:   # Qwen2-MoE: + sigmoid(shared_expert_gate(x)) * shared_expert(x)
            gate, up, down = L["shared"]
            y = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
            out = out + torch.sigmoid(x @ L["shared_gate"].T) * y
        return out

    def moe_gpt_oss(self, x, L):
        """HF's GptOssMLP: router logits x @ W^T + b; the top-k logits per token (ties: the lower
        expert id), softmax over those k; each chosen expert e: gate_up = x @ gate_up_proj[e] +
        bias (HF's [in, out] parameter), gate = its even columns, up = its odd ones; gate clamped
        above at swiglu_limit, up to +-swiglu_limit; (up + 1) * gate * sigmoid(alpha * gate), @
        down_proj[e] + bias; weighted by the routing weight and summed."""
        cfg = self.cfg
        limit, alpha = cfg["swiglu_limit"], cfg["swiglu_alpha"]
        logits = x @ L["router"].T + L["router_b"]                                # [T, E]
        order = np.argsort(-logits.numpy(), axis=-1, kind="stable")[:, :cfg["top_k"]]   # ties: lower id first
        chosen = torch.from_numpy(order.copy())
        weights = torch.softmax(torch.gather(logits, 1, chosen), dim=-1)           # [T, k]
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for w, e in zip(weights[t].tolist(), chosen[t].tolist()):
                gate_up = x[t] @ L["gate_up"][e] + L["gate_up_b"][e]
                gate, up = gate_up[0::2], gate_up[1::2]
                gate = gate.clamp(max=limit)
                up = up.clamp(min=-limit, max=limit)
                glu = gate * torch.sigmoid(gate * alpha)
                out[t] += w * (((up + 1) * glu) @ L["down_e"][e] + L["down_e_b"][e])
        return out

    @staticmethod
    def linear(x, w, b):
        y = x @ w.T
        return y if b is None else y + b

    def attention(self, x, L, cos, sin, window):
        cfg = self.cfg
        T = x.shape[0]
        nh, nkv, hd = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        q = self.linear(x, L["q"], L["q_b"]).view(T, nh, hd).transpose(0, 1)    # [nh, T, hd]
        k = self.linear(x, L["k"], L["k_b"]).view(T, nkv, hd).transpose(0, 1)   # [nkv, T, hd]
        v = self.linear(x, L["v"], L["v_b"]).view(T, nkv, hd).transpose(0, 1)
        if cfg["qk_norm"]:
            q = rms_norm(q, L["q_norm"], cfg["eps"], cfg["gemma"])
            k = rms_norm(k, L["k_norm"], cfg["eps"], cfg["gemma"])
        r = cfg["rotary_dim"]   # the first r dims of each head rotate; the rest pass

        def rotate(x):
            xr = x[..., :r]
            return torch.cat((xr * cos + rotate_half(xr) * sin, x[..., r:]), dim=-1)
        if cos is not None:   # None: a NoPE layer (SmolLM3)
            q, k = rotate(q), rotate(k)
        if cfg["q_temp"]:   # Ministral 3: the queries' temperature by position
            beta, orig = cfg["q_temp"]
            pos = torch.arange(T, dtype=torch.float64)
            q = q * (1 + beta * torch.log(1 + torch.floor(pos / orig))).view(1, T, 1)
        if self.kv_kind:   # attention reads the 8-bit cache's copies of every key and value
            k, v = round_f8(k, self.kv_kind, L["k_scale"]), round_f8(v, self.kv_kind, L["v_scale"])
        group = nh // nkv
        out = torch.empty(nh, T, hd, dtype=torch.float64)
        i = torch.arange(T).view(T, 1)
        j = torch.arange(T).view(1, T)
        allowed = j <= i
        if window is not None:
            allowed = allowed & (j > i - window)
        for h in range(nh):
            kh, vh = k[h // group], v[h // group]
            scores = soft_cap((q[h] @ kh.T) * cfg["scale"], cfg["attn_cap"])
            scores = scores.masked_fill(~allowed, float("-inf"))
            if L["sinks"] is not None:   # GPT-OSS (HF eager): the head's sink logit as an extra key
                combined = torch.cat([scores, L["sinks"][h].expand(T, 1)], dim=-1)   # column, dropped
                combined = combined - combined.max(dim=-1, keepdim=True).values      # after the softmax
                out[h] = torch.softmax(combined, dim=-1)[:, :-1] @ vh
                continue
            out[h] = torch.softmax(scores, dim=-1) @ vh
        out = out.transpose(0, 1).reshape(T, nh * hd)
        return self.linear(out, L["o"], L["o_b"])

    def forward(self, ids):
        """Returns logits [len(ids), vocab] in float64."""
        cfg = self.cfg
        g = cfg["gemma"]
        h = self.embed[torch.tensor(ids, dtype=torch.long)] * self.normalizer
        pos = torch.arange(len(ids), dtype=torch.float64)

        def angles(freqs):
            inv_freq, mscale = freqs
            angle = pos.view(-1, 1) * inv_freq.view(1, -1)
            emb = torch.cat((angle, angle), dim=-1)   # [T, rotary_dim]
            return emb.cos() * mscale, emb.sin() * mscale
        cos, sin = angles(self.inv_freq)
        local = angles(self.inv_freq_local) if self.inv_freq_local is not None else None
        for L, window, sliding, nope in zip(self.layers, cfg["layer_windows"], cfg["layer_sliding"], cfg["nope"]):
            x = rms_norm(h, L["ln1"], cfg["eps"], g)
            c_, s_ = local if (local is not None and sliding) else (cos, sin)   # HF: by the layer's type
            if nope:
                c_ = s_ = None
            a = self.attention(x, L, c_, s_, window)
            h = h + (rms_norm(a, L["post_attn"], cfg["eps"], g) if L["post_attn"] is not None else a) * cfg["resid_mult"]
            x = rms_norm(h, L["ln2"], cfg["eps"], g)
            if cfg["experts"]:
                h = h + (self.moe_gpt_oss(x, L) if cfg["gpt_oss"] else self.moe(x, L))
                continue
            gate = self.linear(x, L["gate"], None)
            act = torch.nn.functional.gelu(gate, approximate="tanh") if g else torch.nn.functional.silu(gate)
            y = self.linear(act * self.linear(x, L["up"], None), L["down"], None)
            h = h + (rms_norm(y, L["post_mlp"], cfg["eps"], g) if L["post_mlp"] is not None else y) * cfg["resid_mult"]
        x = rms_norm(h, self.norm, cfg["eps"], g)
        return soft_cap((x @ self.lm_head.T) / cfg["logits_div"], cfg["final_cap"])


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model directory")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out-ids", required=True)
    ap.add_argument("--out-logits", required=True)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--quantize", choices=("none", "int8", "gguf", "fp8"), default="none",
                    help="llmesh --quantization applied to the weights first")
    ap.add_argument("--kv-cache-dtype", choices=("auto", "fp8", "fp8_e5m2"), default="auto",
                    help="llmesh --kv-cache-dtype: keys and values rounded as an 8-bit cache holds them")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    if not prompt:
        sys.exit("error: empty prompt")
    model = Model(args.model, args.quantize, args.kv_cache_dtype)
    vocab = model.cfg["vocab"]
    if any(t < 0 or t >= vocab for t in prompt):
        sys.exit(f"error: prompt id out of range [0, {vocab})")

    ids = list(prompt)
    generated = []
    first_logits = None
    min_gap, min_gap_step = float("inf"), -1
    with torch.no_grad():
        for step in range(args.max_tokens):
            logits = model.forward(ids)[-1].numpy()
            if first_logits is None:
                first_logits = logits
            nxt = int(np.argmax(logits))   # numpy argmax: first (lowest) index on ties
            if vocab > 1:
                top2 = np.sort(logits)[-2:]
                gap = float(top2[1] - top2[0])
                if gap < min_gap:
                    min_gap, min_gap_step = gap, step
            generated.append(nxt)
            ids.append(nxt)

    with open(args.out_ids, "w") as f:
        f.write(" ".join(str(t) for t in generated) + "\n")
    if first_logits is not None:
        first_logits.astype("<f4").tofile(args.out_logits)
    else:
        open(args.out_logits, "wb").close()
    print("ids:", " ".join(str(t) for t in generated))
    print(f"min top1-top2 logit gap: {min_gap:.6g} (at generated step {min_gap_step})")


if __name__ == "__main__":
    main()
