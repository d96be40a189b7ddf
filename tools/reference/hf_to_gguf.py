#!/usr/bin/env python3
"""Writes an HF model directory (Llama/Mistral, Qwen2, Qwen3, Phi-3; the mixtures of experts Mixtral,
Qwen3-MoE, Qwen2-MoE) as a GGUF file the way llama.cpp's converter (convert_hf_to_gguf.py) does, and the weights that file really holds back as an HF
float32 directory for llama_reference.py. Shares no code with llmesh.

Needs python3 with numpy and torch (Debian: python3-numpy python3-torch; llama_reference.py's
safetensors reader is reused).

Usage:
  python3 hf_to_gguf.py --model DIR --out FILE.gguf
      --types f32|f16|bf16|q8_0|mixed|q2_k|q3_k_m|q4_k_m|q5_k_m|iq4_xs|iq4_nl [--decoded DIR2]

What llama.cpp's converter does and this script repeats: GGUF v3; metadata {arch}.* as u32 and
f32, tokenizer.ggml.* from tokenizer.json (tokens in id order, special added tokens of type 3,
other added tokens 4, merges as "a b"); tensors renamed (token_embd, blk.N.attn_q, ...), each
matrix's dims listed innermost first; Llama's q and k rows (weights and biases) permuted per
head with reshape(n_head, 2, hd/2, ...).swapaxes(1, 2) for its interleaved rotary; Llama 3's
rotary scaling as the F32 tensor rope_freqs.weight of per-frequency divisors; a mixture of
experts' router as F32 ffn_gate_inp (never quantized), each projection of every expert stacked
into one [experts, rows, cols] tensor ffn_{gate,up,down}_exps, Qwen2-MoE's shared expert as
ffn_*_shexp and its gate as the F32 vector ffn_gate_inp_shexp; metadata expert_count,
expert_used_count, expert_feed_forward_length (Qwen) and expert_shared_feed_forward_length;
Phi-3's fused attn_qkv and ffn_up (gate, then up) as they are, rope.dimension_count for a
partial rotary, original_context_length, sliding_window, and LongRoPE's factors as the F32
tensors rope_factors_long / rope_factors_short with rope.scaling.attn_factor.

--types: every tensor of 2 dimensions in that type (norms and biases stay F32); "mixed" gives
the matrices Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K in turn (the embedding Q8_0), so one
file exercises those block formats. The others follow llama.cpp's llama_tensor_get_type for a
dense model without an importance matrix: "q4_k_m" and "q5_k_m" (Q4_K / Q5_K matrices and
embedding; Q6_K for output.weight and for attn_v and ffn_down in the layers its use_more_bits
picks: the first and last eighth and every third between); "q3_k_m" (Q3_K; attn_v Q5_K in
layers 0-1 and Q4_K after, attn_output Q4_K, ffn_down Q5_K in the first sixteenth of the
layers and Q4_K after); "q2_k" (Q2_K; attn_v Q4_K with 4 or more query heads per KV head, else
Q3_K; attn_output and ffn_down Q3_K); "iq4_xs" and "iq4_nl" (attn_v Q5_K with 4 or more query
heads per KV head, ffn_down Q5_K in the first eighth of the layers); ffn_down rules cover the
experts' and a shared expert's, and a model of 8 experts gets attn_k and attn_v Q8_0 and (but
for q5_k_m) attn_output Q5_K. In all of them output.weight is Q6_K, and so is a tied model's embedding (llama.cpp gives it the output's
type); a type whose blocks do not divide a row falls back as llama.cpp's does (Q2_K, Q3_K,
IQ4_XS to IQ4_NL, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, then F16). The Q*_0/Q*_1 and Q8_0
blocks are made as ggml's reference quantizers make them; the K-quant and IQ4 blocks by a
simpler search (any valid block decodes the same way), vectorized over blocks. --decoded
writes what the file's blocks decode to (ggml-quants.c's dequantize_row_*, re-implemented from
the block layouts in decode_block; the vectorized encoders' own values are checked against it
bit for bit on a sample of each tensor's blocks), un-permuted, as F32 safetensors,
with gguf_types.json beside them: each HF tensor name and the ggml type the file holds it in
(llama_reference.py --quantize gguf reads it).
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
from llama_reference import Weights  # noqa: E402

GGML = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_k": 10, "q3_k": 11,
        "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq4_nl": 20, "iq4_xs": 23, "bf16": 30}
BLOCK = {"q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q8_0": 32, "q2_k": 256, "q3_k": 256, "q4_k": 256,
         "q5_k": 256, "q6_k": 256, "iq4_nl": 32, "iq4_xs": 256}
K_QUANTS = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)  # kvalues_iq4nl
F32 = np.float32


def f16(x):
    return np.float32(np.float16(x))


def round_away(v):  # C's roundf
    return np.sign(v) * np.floor(np.abs(v) + F32(0.5))


# ------------------------------------------------------------------ quantizers (one block)

def q8_0(x):
    amax = F32(np.max(np.abs(x)))
    d = amax / F32(127)
    i = F32(1) / d if d else F32(0)
    q = round_away(x * i).astype(np.int8)
    return struct.pack("<e", d) + q.tobytes()


def q4_0(x, bits=4):
    top = 1 << bits
    m = x[np.argmax(np.abs(x))]
    d = F32(m) / F32(-top // 2)
    i = F32(1) / d if d else F32(0)
    q = np.minimum(top - 1, (x * i + F32(top // 2 + 0.5)).astype(np.int8)).astype(np.uint8)
    return struct.pack("<e", d), q


def q4_1(x, bits=4):
    top = (1 << bits) - 1
    lo, hi = F32(np.min(x)), F32(np.max(x))
    d = (hi - lo) / F32(top)
    i = F32(1) / d if d else F32(0)
    q = np.minimum(top, ((x - lo) * i + F32(0.5)).astype(np.int8)).astype(np.uint8)
    return struct.pack("<e", d) + struct.pack("<e", lo), q


def pack_nibbles(q):  # element j low nibble, j+16 high
    return (q[:16] & 15 | (q[16:] & 15) << 4).astype(np.uint8).tobytes()


def pack_high_bits(q):
    qh = 0
    for j in range(32):
        qh |= int((q[j] >> 4) & 1) << j
    return struct.pack("<I", qh)


def encode_block(kind, x):
    if kind == "q8_0":
        return q8_0(x)
    if kind == "q4_0":
        head, q = q4_0(x)
        return head + pack_nibbles(q)
    if kind == "q4_1":
        head, q = q4_1(x)
        return head + pack_nibbles(q)
    if kind == "q5_0":
        head, q = q4_0(x, 5)
        return head + pack_high_bits(q) + pack_nibbles(q)
    if kind == "q5_1":
        head, q = q4_1(x, 5)
        return head + pack_high_bits(q) + pack_nibbles(q)
    if kind in ("q4_k", "q5_k"):
        top = 15 if kind == "q4_k" else 31
        sub = x.reshape(8, 32)
        mins = np.minimum(F32(0), sub.min(axis=1))
        scales = (sub.max(axis=1) - mins) / F32(top)
        d, dmin = f16(scales.max() / F32(63)), f16(-mins.min() / F32(63))
        sc = np.clip(np.round(scales / d), 0, 63).astype(np.uint8) if d else np.zeros(8, np.uint8)
        mn = np.clip(np.round(-mins / dmin), 0, 63).astype(np.uint8) if dmin else np.zeros(8, np.uint8)
        q = np.zeros((8, 32), np.uint8)
        for j in range(8):
            step = d * F32(sc[j])
            if step:
                q[j] = np.clip(np.round((sub[j] + dmin * F32(mn[j])) / step), 0, top)
        packed = np.zeros(12, np.uint8)
        for j in range(4):
            packed[j] = sc[j] | (sc[j + 4] >> 4) << 6
            packed[j + 4] = mn[j] | (mn[j + 4] >> 4) << 6
            packed[j + 8] = (sc[j + 4] & 15) | (mn[j + 4] & 15) << 4
        q = q.reshape(256)
        qs = np.zeros(128, np.uint8)
        qh = np.zeros(32, np.uint8)
        for c in range(4):
            lo, hi = q[64 * c:64 * c + 32], q[64 * c + 32:64 * c + 64]
            qs[32 * c:32 * c + 32] = (lo & 15) | (hi & 15) << 4
            qh |= ((lo >> 4) & 1) << (2 * c) | ((hi >> 4) & 1) << (2 * c + 1)
        body = struct.pack("<ee", d, dmin) + packed.tobytes()
        return body + (qh.tobytes() if kind == "q5_k" else b"") + qs.tobytes()
    if kind == "q6_k":
        sub = x.reshape(16, 16)
        scales = np.abs(sub).max(axis=1) / F32(31)
        d = f16(scales.max() / F32(127))
        sc = np.clip(np.round(scales / d), 0, 127).astype(np.int8) if d else np.zeros(16, np.int8)
        q = np.zeros((16, 16), np.int32)
        for j in range(16):
            step = d * F32(sc[j])
            if step:
                q[j] = np.clip(np.round(sub[j] / step), -32, 31)
        q = (q.reshape(256) + 32).astype(np.uint8)
        ql = np.zeros(128, np.uint8)
        qh = np.zeros(64, np.uint8)
        for n in range(2):
            b = q[128 * n:128 * n + 128]
            q1, q2, q3, q4 = b[0:32], b[32:64], b[64:96], b[96:128]
            ql[64 * n:64 * n + 32] = (q1 & 15) | (q3 & 15) << 4
            ql[64 * n + 32:64 * n + 64] = (q2 & 15) | (q4 & 15) << 4
            qh[32 * n:32 * n + 32] = (q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6
        return ql.tobytes() + qh.tobytes() + sc.tobytes() + struct.pack("<e", d)
    raise ValueError(kind)


# ------------------------------------------------------------------ dequantizers (one block)

def half(b, off):
    return F32(struct.unpack_from("<e", b, off)[0])


def scale_min_k4(j, s):
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def decode_block(kind, b):
    y = np.zeros(BLOCK[kind], F32)
    if kind == "q8_0":
        return np.frombuffer(b, np.int8, 32, 2).astype(F32) * half(b, 0)
    if kind in ("q4_0", "q4_1", "q5_0", "q5_1"):
        has_min = kind.endswith("_1")
        five = kind.startswith("q5")
        d = half(b, 0)
        m = half(b, 2) if has_min else F32(0)
        off = 4 if has_min else 2
        qh = struct.unpack_from("<I", b, off)[0] if five else 0
        qs = np.frombuffer(b, np.uint8, 16, off + (4 if five else 0))
        for j in range(16):
            lo, hi = int(qs[j] & 15), int(qs[j] >> 4)
            if five:
                lo |= ((qh >> j) & 1) << 4
                hi |= ((qh >> (j + 16)) & 1) << 4
            bias = 0 if has_min else (16 if five else 8)
            y[j] = F32(lo - bias) * d + m
            y[j + 16] = F32(hi - bias) * d + m
        return y
    if kind in ("q4_k", "q5_k"):
        five = kind == "q5_k"
        d, dmin = half(b, 0), half(b, 2)
        s = np.frombuffer(b, np.uint8, 12, 4)
        qh = np.frombuffer(b, np.uint8, 32, 16) if five else None
        qs = np.frombuffer(b, np.uint8, 128, 48 if five else 16)
        for c in range(4):
            for half_index in range(2):
                sc, mn = scale_min_k4(2 * c + half_index, s)
                for l in range(32):
                    v = int(qs[32 * c + l] >> 4) if half_index else int(qs[32 * c + l] & 15)
                    if five and (qh[l] >> (2 * c + half_index)) & 1:
                        v += 16
                    y[64 * c + 32 * half_index + l] = d * F32(sc) * F32(v) - dmin * F32(mn)
        return y
    if kind == "iq4_nl":  # ggml's dequantize_row_iq4_nl
        d, qs = half(b, 0), np.frombuffer(b, np.uint8, 16, 2)
        for j in range(16):
            y[j] = d * F32(IQ4NL[qs[j] & 15])
            y[j + 16] = d * F32(IQ4NL[qs[j] >> 4])
        return y
    if kind == "iq4_xs":  # ggml's dequantize_row_iq4_xs
        d = half(b, 0)
        scales_h = struct.unpack_from("<H", b, 2)[0]
        scales_l = np.frombuffer(b, np.uint8, 4, 4)
        qs = np.frombuffer(b, np.uint8, 128, 8)
        for ib in range(8):
            ls = ((int(scales_l[ib // 2]) >> 4 * (ib % 2)) & 15) | (((scales_h >> 2 * ib) & 3) << 4)
            dl = d * F32(ls - 32)
            for j in range(16):
                y[32 * ib + j] = dl * F32(IQ4NL[qs[16 * ib + j] & 15])
                y[32 * ib + j + 16] = dl * F32(IQ4NL[qs[16 * ib + j] >> 4])
        return y
    if kind == "q2_k":  # ggml's dequantize_row_q2_K
        sc = np.frombuffer(b, np.uint8, 16, 0)
        q = np.frombuffer(b, np.uint8, 64, 16)
        d, dmin = half(b, 80), half(b, 82)
        out, is_ = [], 0
        for n in range(2):
            for j in range(4):
                for part in range(2):
                    dl, ml = d * F32(sc[is_] & 15), dmin * F32(sc[is_] >> 4)
                    is_ += 1
                    for l in range(16):
                        out.append(dl * F32((q[32 * n + 16 * part + l] >> (2 * j)) & 3) - ml)
        return np.array(out, F32)
    if kind == "q3_k":  # ggml's dequantize_row_q3_K, its scales unpacked with its 32-bit masks
        hm = np.frombuffer(b, np.uint8, 32, 0)
        q = np.frombuffer(b, np.uint8, 64, 32)
        aux = list(struct.unpack_from("<3I", b, 96))
        tmp = aux[2]
        k1, k2 = 0x03030303, 0x0F0F0F0F
        aux = [(aux[0] & k2) | ((tmp & k1) << 4), (aux[1] & k2) | (((tmp >> 2) & k1) << 4),
               ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4), ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4)]
        scales = np.frombuffer(struct.pack("<4I", *aux), np.int8)
        d = half(b, 108)
        out, is_, m = [], 0, 1
        for n in range(2):
            for j in range(4):
                for part in range(2):
                    dl = d * F32(int(scales[is_]) - 32)
                    is_ += 1
                    for l in range(16):
                        i = 16 * part + l
                        out.append(dl * F32(int((q[32 * n + i] >> (2 * j)) & 3) - (0 if hm[i] & m else 4)))
                m <<= 1
        return np.array(out, F32)
    if kind == "q6_k":
        ql = np.frombuffer(b, np.uint8, 128, 0)
        qh = np.frombuffer(b, np.uint8, 64, 128)
        sc = np.frombuffer(b, np.int8, 16, 192)
        d = half(b, 208)
        for e in range(256):
            n, r = divmod(e, 128)
            k, l = divmod(r, 32)
            low = ql[64 * n + l + (32 if k in (1, 3) else 0)]
            low = (low >> 4) if k >= 2 else (low & 15)
            high = (qh[32 * n + l] >> (2 * k)) & 3
            y[e] = d * F32(sc[e // 16]) * F32(int(low | high << 4) - 32)
        return y
    raise ValueError(kind)


# ------------------------------------------------------------------ the model

def permute(w, n_head):  # llama.cpp's LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode_k_blocks(kind, w):
    """encode_block and decode_block of every super-block of w at once (models of real size)."""
    x = w.reshape(-1, 256)
    n = len(x)

    def ratio(a, b, top, lo=0):  # clip(round(a / b), lo, top) where b != 0, else 0
        safe = np.where(b != 0, b, F32(1)).astype(F32)
        return np.where(b != 0, np.clip(np.round(a / safe), lo, top), 0)

    def two_bits(q):  # q[n, 256] of 0-3: bits 2j, 2j+1 of byte 32h + l hold element 128h + 32j + l
        qs = np.zeros((n, 64), np.uint8)
        for h in range(2):
            for j in range(4):
                qs[:, 32 * h:32 * h + 32] |= q[:, 128 * h + 32 * j:128 * h + 32 * j + 32] << (2 * j)
        return qs

    if kind == "q2_k":  # per 16: q in 0-3, scale and min 4 bits each
        sub = x.reshape(n, 16, 16)
        mins = np.minimum(F32(0), sub.min(axis=2))
        scales = ((sub.max(axis=2) - mins) / F32(3)).astype(F32)
        d, dmin = f16(scales.max(axis=1) / F32(15)), f16(-mins.min(axis=1) / F32(15))
        sc = ratio(scales, d[:, None], 15).astype(np.uint8)
        mn = ratio(-mins, dmin[:, None], 15).astype(np.uint8)
        step = (d[:, None] * sc.astype(F32)).astype(F32)
        low = (dmin[:, None] * mn.astype(F32)).astype(F32)
        q = ratio((sub + low[:, :, None]).astype(F32), step[:, :, None], 3).astype(np.uint8).reshape(n, 256)
        out = np.zeros(n, dtype=[("s", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2")])
        out["s"], out["qs"] = sc | mn << 4, two_bits(q)
        out["d"], out["dmin"] = d.astype(np.float16), dmin.astype(np.float16)
        back = step[:, :, None] * q.reshape(n, 16, 16).astype(F32) - low[:, :, None]
        return out.tobytes(), back.astype(F32).reshape(w.shape)
    if kind == "q3_k":  # per 16: q in -4..3, the largest magnitude at -4 (ggml's sign choice); scales 6-bit signed
        sub = x.reshape(n, 16, 16)
        big = np.take_along_axis(sub, np.abs(sub).argmax(axis=2)[:, :, None], 2)[:, :, 0]
        scales = (big / F32(-4)).astype(F32)
        top = scales[np.arange(n), np.abs(scales).argmax(axis=1)]
        d = f16(top / F32(-32))
        sc = ratio(scales, d[:, None], 31, -32).astype(np.int32)
        step = (d[:, None] * sc.astype(F32)).astype(F32)
        q = ratio(sub, step[:, :, None], 3, -4).astype(np.int32).reshape(n, 256)
        u = (q + 4).astype(np.uint8)
        hmask = np.zeros((n, 32), np.uint8)
        for h in range(2):
            for j in range(4):
                hmask |= (u[:, 128 * h + 32 * j:128 * h + 32 * j + 32] >> 2) << (4 * h + j)
        v = (sc + 32).astype(np.uint8)
        packed = np.zeros((n, 12), np.uint8)
        for g in range(16):
            packed[:, g % 8] |= (v[:, g] & 15) << (4 * (g // 8))
            packed[:, 8 + g % 4] |= (v[:, g] >> 4) << (2 * (g // 4))
        out = np.zeros(n, dtype=[("hm", "u1", 32), ("qs", "u1", 64), ("s", "u1", 12), ("d", "<f2")])
        out["hm"], out["qs"], out["s"], out["d"] = hmask, two_bits(u & 3), packed, d.astype(np.float16)
        back = step[:, :, None] * q.reshape(n, 16, 16).astype(F32)
        return out.tobytes(), back.astype(F32).reshape(w.shape)
    if kind in ("q4_k", "q5_k"):
        top = 15 if kind == "q4_k" else 31
        sub = x.reshape(n, 8, 32)
        mins = np.minimum(F32(0), sub.min(axis=2))
        scales = ((sub.max(axis=2) - mins) / F32(top)).astype(F32)
        d = f16(scales.max(axis=1) / F32(63))
        dmin = f16(-mins.min(axis=1) / F32(63))
        sc = ratio(scales, d[:, None], 63).astype(np.uint8)
        mn = ratio(-mins, dmin[:, None], 63).astype(np.uint8)
        step = (d[:, None] * sc.astype(F32)).astype(F32)
        shifted = (sub + (dmin[:, None] * mn.astype(F32))[:, :, None]).astype(F32)
        q = ratio(shifted, step[:, :, None], top).astype(np.uint8).reshape(n, 256)
        packed = np.zeros((n, 12), np.uint8)
        for j in range(4):
            packed[:, j] = sc[:, j] | (sc[:, j + 4] >> 4) << 6
            packed[:, j + 4] = mn[:, j] | (mn[:, j + 4] >> 4) << 6
            packed[:, j + 8] = (sc[:, j + 4] & 15) | (mn[:, j + 4] & 15) << 4
        qs, qh = np.zeros((n, 128), np.uint8), np.zeros((n, 32), np.uint8)
        for c in range(4):
            lo, hi = q[:, 64 * c:64 * c + 32], q[:, 64 * c + 32:64 * c + 64]
            qs[:, 32 * c:32 * c + 32] = (lo & 15) | (hi & 15) << 4
            qh |= ((lo >> 4) & 1) << (2 * c) | ((hi >> 4) & 1) << (2 * c + 1)
        fields = [("d", "<f2"), ("dmin", "<f2"), ("s", "u1", 12)] + ([("qh", "u1", 32)] if kind == "q5_k" else [])
        out = np.zeros(n, dtype=fields + [("qs", "u1", 128)])
        out["d"], out["dmin"], out["s"], out["qs"] = d.astype(np.float16), dmin.astype(np.float16), packed, qs
        if kind == "q5_k":
            out["qh"] = qh
        back = ((d[:, None] * sc.astype(F32))[:, :, None] * q.reshape(n, 8, 32).astype(F32)
                - (dmin[:, None] * mn.astype(F32))[:, :, None])
        return out.tobytes(), back.astype(F32).reshape(w.shape)
    sub = x.reshape(n, 16, 16)
    scales = (np.abs(sub).max(axis=2) / F32(31)).astype(F32)
    d = f16(scales.max(axis=1) / F32(127))
    sc = ratio(scales, d[:, None], 127).astype(np.int8)
    step = (d[:, None] * sc.astype(F32)).astype(F32)
    q = ratio(sub, step[:, :, None], 31, -32).astype(np.int32).reshape(n, 256)
    u = (q + 32).astype(np.uint8)
    ql, qh = np.zeros((n, 128), np.uint8), np.zeros((n, 64), np.uint8)
    for h in range(2):
        q1, q2, q3, q4 = (u[:, 128 * h + 32 * i:128 * h + 32 * i + 32] for i in range(4))
        ql[:, 64 * h:64 * h + 32] = (q1 & 15) | (q3 & 15) << 4
        ql[:, 64 * h + 32:64 * h + 64] = (q2 & 15) | (q4 & 15) << 4
        qh[:, 32 * h:32 * h + 32] = (q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6
    out = np.zeros(n, dtype=[("ql", "u1", 128), ("qh", "u1", 64), ("sc", "i1", 16), ("d", "<f2")])
    out["ql"], out["qh"], out["sc"], out["d"] = ql, qh, sc, d.astype(np.float16)
    back = (d[:, None] * sc.astype(F32))[:, :, None] * q.reshape(n, 16, 16).astype(F32)
    return out.tobytes(), back.astype(F32).reshape(w.shape)


def encode_iq4(kind, w):
    """IQ4_NL (blocks of 32: f16 d, 16 index bytes) or IQ4_XS (super-blocks of 256: f16 d, u16
    scales_h, scales_l[4], 128 index bytes; a 6-bit scale per 32) over w, and what they decode
    to. Each 32's largest magnitude lands on -127 (ggml's first try); every element then takes
    the nearest of the 16 values."""
    x = w.astype(F32).reshape(-1, 32)
    big = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], 1)[:, 0]
    scale = (big / F32(-127)).astype(F32)
    if kind == "iq4_nl":
        dl = f16(scale)
        d = dl
    else:
        s = scale.reshape(-1, 8)
        top = s[np.arange(len(s)), np.abs(s).argmax(axis=1)]
        d = f16(top / F32(-32))
        safe = np.where(d != 0, d, F32(1)).astype(F32)
        ls = np.where(d[:, None] != 0, np.clip(np.round(s / safe[:, None]), -32, 31), 0).astype(np.int32)
        dl = (d[:, None] * ls.astype(F32)).astype(F32).reshape(-1)
    idx = np.zeros(x.shape, np.uint8)
    values = IQ4NL.astype(F32)
    for c in range(0, len(x), 4096):  # nearest value, in chunks (16 candidates per weight)
        err = np.abs(x[c:c + 4096, :, None] - dl[c:c + 4096, None, None] * values)
        idx[c:c + 4096] = err.argmin(axis=2)
    back = (dl[:, None] * values[idx]).astype(F32)
    qs = idx[:, :16] | idx[:, 16:] << 4
    if kind == "iq4_nl":
        out = np.zeros(len(x), dtype=[("d", "<f2"), ("qs", "u1", 16)])
        out["d"], out["qs"] = d.astype(np.float16), qs
        return out.tobytes(), back.reshape(w.shape)
    n = len(d)
    u = (ls + 32).astype(np.uint32)
    scales_h = np.zeros(n, np.uint32)
    scales_l = np.zeros((n, 4), np.uint8)
    for ib in range(8):
        scales_h |= (u[:, ib] >> 4) << (2 * ib)
        scales_l[:, ib // 2] |= ((u[:, ib] & 15) << (4 * (ib % 2))).astype(np.uint8)
    out = np.zeros(n, dtype=[("d", "<f2"), ("sh", "<u2"), ("sl", "u1", 4), ("qs", "u1", 128)])
    out["d"], out["sh"], out["sl"], out["qs"] = d.astype(np.float16), scales_h.astype(np.uint16), scales_l, qs.reshape(n, 128)
    return out.tobytes(), back.reshape(w.shape)


def encode_tensor(kind, w):
    """Bytes of w (float32 ndarray) in `kind`, and what they decode to."""
    if kind == "f32":
        return w.astype("<f4").tobytes(), w.astype(F32)
    if kind == "f16":
        h = w.astype("<f2")
        return h.tobytes(), h.astype(F32)
    if kind == "bf16":
        bits = w.astype(F32).view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return bits.tobytes(), (bits.astype(np.uint32) << 16).view(F32)
    if kind == "q8_0":  # vectorized, for models of real size: the same arithmetic as q8_0()
        blocks = w.astype(F32).reshape(-1, 32)
        d = (np.abs(blocks).max(axis=1) / F32(127)).astype(F32)
        inv = np.divide(F32(1), d, out=np.zeros_like(d), where=d != 0).astype(F32)
        q = round_away(blocks * inv[:, None]).astype(np.int8)
        packed = np.zeros(len(blocks), dtype=[("d", "<f2"), ("q", "i1", 32)])
        packed["d"], packed["q"] = d.astype(np.float16), q
        back = q.astype(F32) * packed["d"].astype(F32)[:, None]
        return packed.tobytes(), back.reshape(w.shape)
    if kind in ("iq4_nl", "iq4_xs") or kind in K_QUANTS:
        # Vectorized over blocks (models of real size), each giving what its blocks decode to by
        # its own arithmetic: checked against decode_block (ggml's loops) on a sample of blocks.
        data, back = encode_iq4(kind, w) if kind.startswith("iq4") else encode_k_blocks(kind, w.astype(F32))
        blk = BLOCK[kind]
        size = len(data) // (w.size // blk)
        flat = back.reshape(-1, blk)
        for i in sorted({0, len(flat) // 3, len(flat) // 2, len(flat) - 1}):
            got = decode_block(kind, data[i * size:(i + 1) * size])
            if not np.array_equal(got.view(np.uint32), flat[i].view(np.uint32)):
                raise AssertionError(f"{kind}: block {i} decodes to other values than the encoder's")
        return data, back
    blk = BLOCK[kind]
    rows = w.reshape(-1, w.shape[-1])
    out, back = bytearray(), np.zeros(rows.shape, F32)
    for r in range(rows.shape[0]):
        for c in range(0, rows.shape[1], blk):
            b = encode_block(kind, rows[r, c:c + blk].astype(F32))
            out += b
            back[r, c:c + blk] = decode_block(kind, b)
    return bytes(out), back.reshape(w.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--types", choices=("f32", "f16", "bf16", "q8_0", "mixed", "q2_k", "q3_k_m", "q4_k_m", "q5_k_m",
                                                "iq4_xs", "iq4_nl"),
                    required=True)
    ap.add_argument("--decoded", help="write the decoded HF float32 model here")
    args = ap.parse_args()

    cfg = json.load(open(os.path.join(args.model, "config.json")))
    tok = json.load(open(os.path.join(args.model, "tokenizer.json")))
    archs = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
             "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "llama", "Qwen3MoeForCausalLM": "qwen3moe",
             "Qwen2MoeForCausalLM": "qwen2moe", "Phi3ForCausalLM": "phi3"}
    arch = archs[cfg["architectures"][0]]
    mixtral = cfg["architectures"][0] == "MixtralForCausalLM"
    n_experts = cfg.get("num_local_experts" if mixtral else "num_experts", 0) if mixtral or arch.endswith("moe") else 0
    expert_inter = cfg["intermediate_size"] if mixtral else cfg.get("moe_intermediate_size", 0)
    shared_inter = cfg.get("shared_expert_intermediate_size", 0) if arch == "qwen2moe" else 0
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or hidden // heads
    layers, inter, vocab = cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    theta = cfg.get("rope_theta", 10000.0)
    weights = Weights(args.model)

    kv_items = []

    def kv_add(key, t, v):
        kv_items.append((key, t, v))

    kv_add("general.architecture", 8, arch)
    kv_add("general.alignment", 4, 32)
    kv_add(f"{arch}.context_length", 4, cfg.get("max_position_embeddings", 2048))
    kv_add(f"{arch}.embedding_length", 4, hidden)
    kv_add(f"{arch}.block_count", 4, layers)
    kv_add(f"{arch}.feed_forward_length", 4, inter)
    kv_add(f"{arch}.attention.head_count", 4, heads)
    kv_add(f"{arch}.attention.head_count_kv", 4, kv)
    kv_add(f"{arch}.rope.freq_base", 6, theta)
    kv_add(f"{arch}.attention.layer_norm_rms_epsilon", 6, cfg.get("rms_norm_eps", 1e-6))
    phi3 = arch == "phi3"
    rope_dims = int(hd * cfg.get("partial_rotary_factor", 1.0))  # the converter's int(rot_pct * n_embd) // n_head
    kv_add(f"{arch}.rope.dimension_count", 4, rope_dims)
    rs = cfg.get("rope_scaling") or {}
    if phi3:  # Phi3MiniModel's metadata: the original context, the window, LongRoPE's cos/sin scale
        orig = cfg.get("original_max_position_embeddings", cfg.get("max_position_embeddings", 2048))
        kv_add("phi3.rope.scaling.original_context_length", 4, orig)
        kv_add("phi3.attention.sliding_window", 4, cfg.get("sliding_window") or 0)
        if rs.get("rope_type", rs.get("type")) in ("longrope", "su"):
            scale = cfg.get("max_position_embeddings", 2048) / orig
            kv_add("phi3.rope.scaling.attn_factor", 6,
                   math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
    if "head_dim" in cfg:
        kv_add(f"{arch}.attention.key_length", 4, hd)
        kv_add(f"{arch}.attention.value_length", 4, hd)
    kv_add(f"{arch}.vocab_size", 4, vocab)
    if n_experts:
        kv_add(f"{arch}.expert_count", 4, n_experts)
        kv_add(f"{arch}.expert_used_count", 4, cfg["num_experts_per_tok"])
        if not mixtral:
            kv_add(f"{arch}.expert_feed_forward_length", 4, expert_inter)
        if shared_inter:
            kv_add(f"{arch}.expert_shared_feed_forward_length", 4, shared_inter)
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    types = {i: 1 for i in by_id}
    for a in tok.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
        types[a["id"]] = 3 if a.get("special") else 4
    n_tokens = max(by_id) + 1
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n_tokens)]
    kv_add("tokenizer.ggml.model", 8, "gpt2")
    kv_add("tokenizer.ggml.pre", 8, "gpt-2")
    kv_add("tokenizer.ggml.tokens", 9, (8, tokens))
    kv_add("tokenizer.ggml.token_type", 9, (5, [types.get(i, 5) for i in range(n_tokens)]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    kv_add("tokenizer.ggml.merges", 9, (8, merges))
    for key in ("bos_token_id", "eos_token_id"):
        if isinstance(cfg.get(key), int):
            kv_add(f"tokenizer.ggml.{key}", 4, cfg[key])

    tensors = []  # (gguf name, kind, hf name, decoded HF array)
    matrices = ["q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]
    counter = [0]

    def use_more_bits(i):  # llama.cpp's choice of the Q4_K_M layers that get Q6_K
        return i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2

    def recipe_2_3(gguf_name):  # llama.cpp's llama_tensor_get_type for Q2_K and Q3_K_M (a dense model)
        layer = int(gguf_name.split(".")[1]) if gguf_name.startswith("blk.") else -1
        q2 = args.types == "q2_k"
        if gguf_name == "output.weight":
            return "q6_k"
        if gguf_name.endswith("attn_v.weight"):
            if q2:
                return "q4_k" if heads // kv >= 4 else "q3_k"
            return "q5_k" if layer < 2 else "q4_k"
        if "ffn_down" in gguf_name:  # dense, stacked experts' and a shared expert's (llama.cpp's find)
            return "q3_k" if q2 else ("q5_k" if layer < layers // 16 else "q4_k")
        if gguf_name.endswith("attn_output.weight"):
            return "q3_k" if q2 else "q4_k"
        if gguf_name.endswith("attn_qkv.weight") and not q2:  # Phi-3's fused q, k, v
            return "q4_k"
        return "q2_k" if q2 else "q3_k"

    def recipe_iq4(gguf_name):  # llama.cpp's IQ4_XS / IQ4_NL without an importance matrix
        if gguf_name == "output.weight":
            return "q6_k"
        if gguf_name.endswith("attn_v.weight") and heads // kv >= 4:
            return "q5_k"
        if "ffn_down" in gguf_name and int(gguf_name.split(".")[1]) < layers // 8:
            return "q5_k"
        return args.types

    # llama.cpp's fallback for a type whose blocks do not divide a row, then F16
    fallback = {"q2_k": "iq4_nl", "q3_k": "iq4_nl", "iq4_xs": "iq4_nl", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}

    def fitting(k, cols):
        if cols % BLOCK[k]:
            k = fallback.get(k, "f16")
            return k if cols % BLOCK[k] == 0 else "f16"
        return k

    def kind_for(shape, gguf_name=""):
        if len(shape) == 1:
            return "f32"
        recipes = ("q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "iq4_xs", "iq4_nl")
        if args.types in recipes and gguf_name == "token_embd.weight" and tied:
            gguf_name = "output.weight"  # llama.cpp: with no output tensor the embedding gets its type
        if args.types in recipes and n_experts == 8:  # llama.cpp's rules for 8-expert models
            if gguf_name.endswith(("attn_v.weight", "attn_k.weight")):
                return fitting("q8_0", shape[-1])
            if gguf_name.endswith("attn_output.weight") and args.types != "q5_k_m":
                return fitting("q5_k", shape[-1])
        if args.types in ("iq4_xs", "iq4_nl"):
            return fitting(recipe_iq4(gguf_name), shape[-1])
        if args.types in ("q2_k", "q3_k_m"):
            return fitting(recipe_2_3(gguf_name), shape[-1])
        if args.types in ("q4_k_m", "q5_k_m"):
            k = args.types[:4]
            if gguf_name == "output.weight":
                k = "q6_k"
            elif ("attn_v.weight" in gguf_name or "ffn_down" in gguf_name) and use_more_bits(int(gguf_name.split(".")[1])):
                k = "q6_k"
            elif gguf_name.endswith("attn_qkv.weight"):  # Phi-3's fused q, k, v: one step up
                k = "q5_k" if args.types == "q4_k_m" else "q6_k"
            return fitting(k, shape[-1])
        if args.types != "mixed":
            return args.types
        k = matrices[counter[0] % len(matrices)]
        counter[0] += 1
        if shape[-1] % BLOCK[k]:
            k = "q8_0"
        return k

    def add(gguf_name, hf_name, shape, perm_heads=None, kind=None, file_shape=None):
        w = weights.get(hf_name, shape).numpy().astype(F32)
        if perm_heads:
            w = permute(w, perm_heads)
        kind = kind or kind_for(shape, gguf_name)
        data, back = encode_tensor(kind, w)
        if perm_heads:
            back = unpermute(back, perm_heads)
        tensors.append((gguf_name, kind, list(file_shape or shape), data, [(hf_name, list(shape))], back))

    def add_stacked(gguf_name, hf_names, shape):  # one [experts, *shape] tensor of every expert's matrix
        w = np.stack([weights.get(n, shape).numpy().astype(F32) for n in hf_names])
        kind = kind_for(w.shape, gguf_name)
        data, back = encode_tensor(kind, w)
        tensors.append((gguf_name, kind, list(w.shape), data, [(n, list(shape)) for n in hf_names], back))

    llama = arch == "llama"
    tied = cfg.get("tie_word_embeddings", False)
    add("token_embd.weight", "model.embed_tokens.weight", [vocab, hidden], kind="q8_0" if args.types == "mixed" else None)
    add("output_norm.weight", "model.norm.weight", [hidden])
    if not tied:
        add("output.weight", "lm_head.weight", [vocab, hidden])
    rope_old = None
    if phi3 and rs.get("rope_type", rs.get("type")) in ("longrope", "su"):  # the factors as F32 tensors
        for which in ("long", "short"):
            fac = np.array(rs[f"{which}_factor"], F32)
            assert len(fac) == rope_dims // 2
            tensors.append((f"rope_factors_{which}.weight", "f32", [rope_dims // 2], fac.tobytes(), None, None))
    if rs.get("rope_type", rs.get("type")) == "llama3":
        factor, low, high = rs.get("factor", 8.0), rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old = cfg.get("original_max_position_embeddings", 8192)  # the converter's lookup: top level only
        rope_old = old
        fac = []
        for i in range(0, hd, 2):
            freq = 1.0 / theta ** (i / hd)
            wl = 2 * math.pi / freq
            if wl < old / high:
                fac.append(1.0)
            elif wl > old / low:
                fac.append(factor)
            else:
                s = (old / wl - low) / (high - low)
                fac.append(1.0 / ((1 - s) / factor + s))
        tensors.append(("rope_freqs.weight", "f32", [hd // 2], np.array(fac, F32).tobytes(), None, None))
    q_dim, kv_dim = heads * hd, kv * hd
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", p + "input_layernorm.weight", [hidden])
        if phi3:  # the fused projections as they are (no permutation: Phi-3's rotary is NEOX's)
            add(b + "attn_qkv.weight", p + "self_attn.qkv_proj.weight", [q_dim + 2 * kv_dim, hidden])
            add(b + "attn_output.weight", p + "self_attn.o_proj.weight", [hidden, q_dim])
            add(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", [hidden])
            add(b + "ffn_up.weight", p + "mlp.gate_up_proj.weight", [2 * inter, hidden])
            add(b + "ffn_down.weight", p + "mlp.down_proj.weight", [hidden, inter])
            continue
        add(b + "attn_q.weight", p + "self_attn.q_proj.weight", [q_dim, hidden], heads if llama else None)
        add(b + "attn_k.weight", p + "self_attn.k_proj.weight", [kv_dim, hidden], kv if llama else None)
        add(b + "attn_v.weight", p + "self_attn.v_proj.weight", [kv_dim, hidden])
        add(b + "attn_output.weight", p + "self_attn.o_proj.weight", [hidden, q_dim])
        for n, heads_n, dim in (("q", heads, q_dim), ("k", kv, kv_dim), ("v", None, kv_dim)):
            if weights.has(p + f"self_attn.{n}_proj.bias"):
                add(b + f"attn_{n}.bias", p + f"self_attn.{n}_proj.bias", [dim], heads_n if llama and heads_n else None)
        if weights.has(p + "self_attn.o_proj.bias"):
            add(b + "attn_output.bias", p + "self_attn.o_proj.bias", [hidden])
        if weights.has(p + "self_attn.q_norm.weight"):
            add(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", [hd])
            add(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", [hd])
        add(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", [hidden])
        if not n_experts:
            add(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", [inter, hidden])
            add(b + "ffn_up.weight", p + "mlp.up_proj.weight", [inter, hidden])
            add(b + "ffn_down.weight", p + "mlp.down_proj.weight", [hidden, inter])
            continue
        # llama.cpp's MoE tensors: the router unquantized, each projection of every expert
        # stacked into one [experts, rows, cols] tensor; Qwen2-MoE's shared expert beside them
        m = p + ("block_sparse_moe." if mixtral else "mlp.")
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        add(b + "ffn_gate_inp.weight", m + "gate.weight", [n_experts, hidden], kind="f32")
        ei = expert_inter
        for gname, hf, shape in (("ffn_gate_exps", names[0], [ei, hidden]), ("ffn_up_exps", names[1], [ei, hidden]),
                                 ("ffn_down_exps", names[2], [hidden, ei])):
            add_stacked(b + gname + ".weight", [m + f"experts.{e}.{hf}.weight" for e in range(n_experts)], shape)
        if shared_inter:
            si = shared_inter
            add(b + "ffn_gate_inp_shexp.weight", m + "shared_expert_gate.weight", [1, hidden], kind="f32", file_shape=[hidden])
            add(b + "ffn_gate_shexp.weight", m + "shared_expert.gate_proj.weight", [si, hidden])
            add(b + "ffn_up_shexp.weight", m + "shared_expert.up_proj.weight", [si, hidden])
            add(b + "ffn_down_shexp.weight", m + "shared_expert.down_proj.weight", [hidden, si])

    def s(x):
        e = x.encode("utf-8")
        return struct.pack("<Q", len(e)) + e

    def value(t, v):
        if t == 4:
            return struct.pack("<I", v)
        if t == 5:
            return struct.pack("<i", v)
        if t == 6:
            return struct.pack("<f", v)
        if t == 8:
            return s(v)
        item_type, items = v
        return struct.pack("<IQ", item_type, len(items)) + b"".join(value(item_type, x) for x in items)

    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv_items)))
    for key, t, v in kv_items:
        out += s(key) + struct.pack("<I", t) + value(t, v)
    offset = 0
    for name, kind, shape, data, _, _ in tensors:
        dims = list(reversed(shape))
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", GGML[kind], offset)
        offset += (len(data) + 31) // 32 * 32
    out += b"\0" * ((32 - len(out) % 32) % 32)
    for _, _, _, data, _, _ in tensors:
        out += data + b"\0" * ((32 - len(data) % 32) % 32)
    with open(args.out, "wb") as f:
        f.write(out)
    print(f"{args.out}: {len(tensors)} tensors, {len(out)} bytes;", ", ".join(sorted({t[1] for t in tensors})))

    if args.decoded:
        os.makedirs(args.decoded, exist_ok=True)
        header, blobs, pos = {}, [], 0
        for _, _, _, _, hfs, back in tensors:
            if hfs is None:
                continue
            parts = back.reshape(len(hfs), -1)  # a stacked tensor: one HF tensor per expert
            for (hf, shape), part in zip(hfs, parts):
                blob = np.ascontiguousarray(part, dtype="<f4").tobytes()
                header[hf] = {"dtype": "F32", "shape": shape, "data_offsets": [pos, pos + len(blob)]}
                blobs.append(blob)
                pos += len(blob)
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(args.decoded, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        with open(os.path.join(args.decoded, "gguf_types.json"), "w") as f:
            json.dump({hf: kind for _, kind, _, _, hfs, _ in tensors if hfs is not None for hf, _ in hfs}, f, indent=1,
                      sort_keys=True)
        if rope_old is not None:
            # The file holds the converter's divisors, made with its `old`: the reference must see those.
            dcfg = dict(cfg)
            dcfg["rope_scaling"] = dict(rs, original_max_position_embeddings=rope_old)
            with open(os.path.join(args.decoded, "config.json"), "w") as f:
                json.dump(dcfg, f)
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if name == "config.json" and rope_old is not None:
                continue
            if os.path.exists(os.path.join(args.model, name)):
                shutil.copy(os.path.join(args.model, name), os.path.join(args.decoded, name))


if __name__ == "__main__":
    main()
