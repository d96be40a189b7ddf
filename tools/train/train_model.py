#!/usr/bin/env python3
"""Train a tiny Llama on the KJV Bible with plain torch, export it as an HF
model directory (BF16 safetensors), and write greedy reference generations.

Usage (from the repository root, with the system python that has torch):
  train_model.py train  --corpus /tmp/kjv.txt --tokenizer models/kjv-tiny/tokenizer.json \
                        --ckpt /tmp/kjv-ckpt.pt --minutes 22
  train_model.py export --ckpt /tmp/kjv-ckpt.pt --out models/kjv-tiny \
                        --expected tests/data/kjv_tiny/expected.txt
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tokenizer import Tokenizer  # noqa: E402

CFG = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=6,
           num_attention_heads=6, num_key_value_heads=2, head_dim=32,
           vocab_size=4096, max_position_embeddings=256, rms_norm_eps=1e-5,
           rope_theta=10000.0)
BOS, EOS = 4094, 4095
PROMPTS = ["In the beginning God created", "And Jesus said unto them",
           "The LORD is my shepherd"]


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.type_as(x)


def rope_cache(seq, head_dim, theta):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)  # HF rotate_half layout
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.input_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.q_proj = nn.Linear(H, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False)
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv  # GQA: query head j uses kv head j // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        y = att.softmax(-1) @ v
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        cos, sin = rope_cache(c["max_position_embeddings"], c["head_dim"], c["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
                if n.endswith("o_proj.weight") or n.endswith("down_proj.weight"):
                    p.data /= math.sqrt(2 * c["num_hidden_layers"])

    def forward(self, idx):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        mask = torch.full((T, T), float("-inf")).triu(1)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x) @ self.embed_tokens.weight.t()  # tied lm_head


# ---------------------------------------------------------------- HF naming
def hf_state(model):
    out = {"model.embed_tokens.weight": model.embed_tokens.weight}
    for i, L in enumerate(model.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = L.input_layernorm.weight
        for n in ("q", "k", "v", "o"):
            out[p + f"self_attn.{n}_proj.weight"] = getattr(L, f"{n}_proj").weight
        out[p + "post_attention_layernorm.weight"] = L.post_attention_layernorm.weight
        for n in ("gate", "up", "down"):
            out[p + f"mlp.{n}_proj.weight"] = getattr(L, f"{n}_proj").weight
    out["model.norm.weight"] = model.norm.weight
    return out


def to_bf16_bits(t):
    """float32 -> bf16 bit patterns (uint16), round to nearest even."""
    u = t.detach().float().contiguous().numpy().view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def from_bf16_bits(bits):
    return torch.from_numpy((bits.astype(np.uint32) << 16).view(np.float32).copy())


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = to_bf16_bits(t).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        assert h["dtype"] == "BF16"
        a, b = h["data_offsets"]
        out[name] = from_bf16_bits(np.frombuffer(data[a:b], dtype=np.uint16)).view(h["shape"])
    return out


# ---------------------------------------------------------------- training
def load_tokens(corpus, tok_path, cache):
    if cache and os.path.exists(cache):
        return np.load(cache)
    tok = Tokenizer(tok_path)
    with open(corpus, encoding="utf-8") as f:
        text = f.read()
    ids = np.array(tok.encode(text), dtype=np.int16)  # vocab < 32768
    if cache:
        np.save(cache, ids)
    return ids


def train(args):
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    data = torch.from_numpy(load_tokens(args.corpus, args.tokenizer, args.tokens_cache).astype(np.int64))
    print(f"corpus: {len(data)} tokens", flush=True)
    model = Llama(CFG)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"parameters: {nparams}", flush=True)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    T, B = CFG["max_position_embeddings"], args.batch
    gen = torch.Generator().manual_seed(0)
    t0 = time.time()
    budget = args.minutes * 60
    step, ema = 0, None
    while step < args.max_steps:
        elapsed = time.time() - t0
        if elapsed > budget:
            break
        # schedule driven by the fraction of the wall-clock budget used, so a
        # timed run still ends with a cooled-down learning rate
        frac = max(elapsed / budget, step / args.max_steps)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(data) - T - 1, (B,), generator=gen)
        x = torch.stack([data[s:s + T] for s in starts])
        y = torch.stack([data[s + 1:s + T + 1] for s in starts])
        loss = F.cross_entropy(model(x).view(-1, CFG["vocab_size"]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 10 == 0 or step == 1:
            print(f"step {step} loss {loss.item():.4f} ema {ema:.4f} lr {lr:.2e} "
                  f"t {time.time() - t0:.0f}s", flush=True)
        if step % args.ckpt_every == 0:
            save_ckpt(args.ckpt, model, step, ema, time.time() - t0, nparams)
    save_ckpt(args.ckpt, model, step, ema, time.time() - t0, nparams)
    print(f"done: {step} steps, final ema loss {ema:.4f}, {time.time() - t0:.0f}s", flush=True)


def save_ckpt(path, model, step, ema, secs, nparams):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "step": step, "ema_loss": ema,
                "seconds": secs, "params": nparams}, tmp)
    os.replace(tmp, path)


# ---------------------------------------------------------------- export
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}")


@torch.no_grad()
def greedy(model, ids, n):
    ids = list(ids)
    out, first_logits = [], None
    for _ in range(n):
        logits = model(torch.tensor([ids[-CFG["max_position_embeddings"]:]]))[0, -1]
        if first_logits is None:
            first_logits = logits.clone()
        nxt = int(logits.argmax())
        out.append(nxt)
        ids.append(nxt)
    return out, first_logits


def export(args):
    torch.set_num_threads(args.threads)
    ck = torch.load(args.ckpt)
    model = Llama(CFG)
    model.load_state_dict(ck["model"])
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "model.safetensors"), hf_state(model))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **CFG,
              "hidden_act": "silu", "tie_word_embeddings": True,
              "attention_bias": False, "mlp_bias": False,
              "bos_token_id": BOS, "eos_token_id": EOS, "torch_dtype": "bfloat16"}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": False,
                   "max_length": 256}, f, indent=2)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast",
                   "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                   "add_bos_token": False, "add_eos_token": False,
                   "model_max_length": 256, "clean_up_tokenization_spaces": False,
                   "chat_template": CHAT_TEMPLATE}, f, indent=2)

    # reload the saved bf16 weights (upcast to f32): what the C++ engine sees
    st = read_safetensors(os.path.join(args.out, "model.safetensors"))
    m2 = Llama(CFG)
    params = hf_state(m2)
    assert set(params) == set(st), set(params) ^ set(st)
    for name, p in params.items():
        p.data.copy_(st[name])
    m2.eval()
    tok = Tokenizer(os.path.join(args.out, "tokenizer.json"))
    lines = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        gen, logits = greedy(m2, ids, 32)
        text = tok.decode(gen)
        print(f"{prompt!r} -> {text!r}\n  first-step logits max-abs {logits.abs().max():.4f}"
              f" argmax {int(logits.argmax())}", flush=True)
        lines.append(f"{' '.join(map(str, ids))} | {' '.join(map(str, gen))} | {text.replace(chr(10), ' ')}")
    os.makedirs(os.path.dirname(args.expected), exist_ok=True)
    with open(args.expected, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"checkpoint: step {ck['step']}, ema loss {ck['ema_loss']:.4f}, "
          f"{ck['seconds']:.0f}s, params {ck['params']}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--corpus", required=True)
    t.add_argument("--tokenizer", required=True)
    t.add_argument("--tokens-cache", default="")
    t.add_argument("--ckpt", required=True)
    t.add_argument("--minutes", type=float, default=22)
    t.add_argument("--max-steps", type=int, default=100000)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--warmup", type=int, default=30)
    t.add_argument("--ckpt-every", type=int, default=25)
    t.add_argument("--threads", type=int, default=2)
    e = sub.add_parser("export")
    e.add_argument("--ckpt", required=True)
    e.add_argument("--out", default="models/kjv-tiny")
    e.add_argument("--expected", default="tests/data/kjv_tiny/expected.txt")
    e.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    train(args) if args.cmd == "train" else export(args)


if __name__ == "__main__":
    main()
