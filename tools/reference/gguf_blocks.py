"""ggml's block formats for hf_to_gguf.py: the type numbers, block sizes, the encoders (ggml's
reference quantizers for Q*_0, Q*_1 and Q8_0; a simpler vectorized search for the K-quants and
IQ4, any valid block decoding the same way) and decode_block (ggml-quants.c's dequantize_row_*,
re-implemented from the block layouts), llama.cpp's q/k permutation, and GPT-OSS's MXFP4 blocks
repacked from HF's layout into ggml's (repack_mxfp4, as llama.cpp's GptOssModel.repack_mxfp4).
Shares no code with llmesh. Needs numpy.
"""

import math
import struct

import numpy as np

GGML = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_k": 10, "q3_k": 11,
        "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq4_nl": 20, "iq4_xs": 23, "bf16": 30, "mxfp4": 39}
BLOCK = {"q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q8_0": 32, "q2_k": 256, "q3_k": 256, "q4_k": 256,
         "q5_k": 256, "q6_k": 256, "iq4_nl": 32, "iq4_xs": 256, "mxfp4": 32}
K_QUANTS = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)  # kvalues_iq4nl
MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # kvalues_mxfp4: e2m1 times 2
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
    if kind == "mxfp4":  # ggml's dequantize_row_mxfp4: d = GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128)
        d = F32(math.ldexp(1.0, b[0] - 128))
        qs = np.frombuffer(b, np.uint8, 16, 1)
        for j in range(16):
            y[j] = F32(MXFP4[qs[j] & 15]) * d
            y[j + 16] = F32(MXFP4[qs[j] >> 4]) * d
        return y
    raise ValueError(kind)


def repack_mxfp4(blocks, scales):
    """HF's MXFP4 (GPT-OSS's x_blocks [..., rows, groups, 16] and x_scales [..., rows, groups], U8:
    byte j of a group holds element 2j in its low nibble and 2j + 1 in its high one) as ggml's
    block_mxfp4 rows {uint8 e; uint8 qs[16]}: e the scale byte unchanged, qs[j] element j low and
    j + 16 high (what llama.cpp's transform_nibble_layout gives). Returns the bytes and what they
    decode to (float32 [..., rows, groups * 32], vectorized; checked against decode_block on a
    sample of blocks)."""
    assert blocks.dtype == np.uint8 and scales.dtype == np.uint8 and blocks.shape[-1] == 16
    assert blocks.shape[:-1] == scales.shape
    x = np.empty(blocks.shape[:-1] + (32,), np.uint8)
    x[..., 0::2], x[..., 1::2] = blocks & 15, blocks >> 4
    qs = (x[..., :16] | (x[..., 16:] << 4)).astype(np.uint8)
    data = np.concatenate([scales[..., None], qs], axis=-1)   # [..., rows, groups, 17]
    d = np.ldexp(np.float32(1), scales.astype(np.int32) - 128).astype(F32)
    back = (MXFP4[x].astype(F32) * d[..., None]).astype(F32)
    raw = np.ascontiguousarray(data).tobytes()
    flat = back.reshape(-1, 32)
    for i in sorted({0, len(flat) // 3, len(flat) // 2, len(flat) - 1}):
        got = decode_block("mxfp4", raw[i * 17:(i + 1) * 17])
        if not np.array_equal(got.view(np.uint32), flat[i].view(np.uint32)):
            raise AssertionError(f"mxfp4: block {i} decodes to other values than the repacker's")
    return raw, back.reshape(blocks.shape[:-2] + (blocks.shape[-2] * 32,))


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
