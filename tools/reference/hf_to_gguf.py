#!/usr/bin/env python3
"""Writes an HF model directory (Llama/Mistral, Qwen2, Qwen3, Phi-3, Gemma 1-3; the mixtures of experts Mixtral,
Qwen3-MoE, Qwen2-MoE, GPT-OSS) as a GGUF file the way llama.cpp's converter (convert_hf_to_gguf.py) does, and the weights that file really holds back as an HF
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

GPT-OSS (llama.cpp's GptOssModel, arch "gpt-oss"): the generic metadata with expert_count,
expert_used_count, key/value_length, attention.sliding_window and expert_feed_forward_length;
rope.scaling.type yarn with factor, original_context_length and, where the config has them,
yarn_beta_fast / yarn_beta_slow (yarn_ext_factor, yarn_attn_factor); tokenizer.ggml.pre "gpt-4o";
GptOssConfig's defaults where config.json leaves a field out (as transformers' AutoConfig, which
llama.cpp reads it with, fills them). Tensors: post_attention_layernorm as post_attention_norm,
q/k/v/o weights and biases unpermuted (its rotary is NEOX's), the sinks as the F32 vector
attn_sinks, the router and its bias as F32 ffn_gate_inp.{weight,bias}; the experts' MXFP4 blocks
and scales repacked as ggml's MXFP4 (type 39, see gguf_blocks.repack_mxfp4) without re-encoding,
gate_up_proj's even rows (outputs) as ffn_gate_exps and its odd ones as ffn_up_exps,
down_proj as ffn_down_exps, each [experts, rows, cols]; their biases split the same way, F32
[experts, rows]. A checkpoint whose experts are plain (BF16 gate_up_proj [E, in, 2I], down_proj
[E, I, out]) gets them transposed and split the same way and written in --types, as llama.cpp
does. llama.cpp's GPT-OSS graph alternates sliding (even) and full layers and clamps its SwiGLU
at 7: a config saying otherwise is refused. --decoded writes the experts in HF's plain form
(gate_up_proj interleaved [E, hidden, 2I] and down_proj [E, I, hidden], float32, with biases),
the config without its quantization_config and with rope_scaling as the file says it (truncate
false: HF's GPT-OSS semantics, though llama.cpp's yarn rounds the correction range), and lists
the experts in gguf_types.json under llama.cpp's intermediate names
model.layers.N.mlp.experts.{gate,up,down}_proj.{weight,bias}.

SmolLM3 (llama.cpp's SmolLM3Model, arch "smollm3"): Llama's metadata and permuted q/k; llama.cpp
hardcodes every fourth layer NoPE and no window, so a config saying otherwise is refused.

Gemma, Gemma 2, Gemma 3 (llama.cpp's GemmaModel, Gemma2Model, Gemma3Model: arch "gemma",
"gemma2", "gemma3"): key/value_length always; Gemma 2's attn/final_logit_softcapping and
attention.sliding_window; Gemma 3's sliding_window, final_logit_softcapping when set, rope.freq_base (its config's default 1e6) and
a linear rope.scaling; every tensor named *norm.weight written as weight + 1 (the converters' data_torch + 1, which
prepare_tensors hands them in float32 but for an F16 checkpoint's, added in float16); Gemma 2/3's
post_attention_layernorm as post_attention_norm, pre_feedforward_layernorm as ffn_norm,
post_feedforward_layernorm as post_ffw_norm; no output tensor (llama.cpp's Gemma graphs use the
embedding). What llama.cpp's graphs cannot hold is refused (gemma_checks): an untied model, a
query_pre_attn_scalar other than llama.cpp's rule, other layer patterns or local rotary base.
--decoded writes each norm as the file's value less one, in float32.

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
import torch  # noqa: E402
from llama_reference import Weights  # noqa: E402
from gguf_blocks import BLOCK, F32, GGML, encode_tensor, permute, repack_mxfp4, unpermute  # noqa: E402


def gpt_oss_defaults(cfg):
    """config.json with transformers' GptOssConfig defaults where it leaves a field out (llama.cpp
    reads the config through AutoConfig), checked against what llama.cpp's GPT-OSS graph can hold:
    sliding even layers and full odd ones, the SwiGLU clamped at 7 (alpha 1.702)."""
    c = dict(cfg)
    n = c["num_hidden_layers"]
    for k, v in (("rope_theta", 150000.0), ("rms_norm_eps", 1e-5), ("sliding_window", 128), ("head_dim", 64),
                 ("max_position_embeddings", 131072), ("num_key_value_heads", c["num_attention_heads"]),
                 ("num_experts_per_tok", c.get("experts_per_token", 4)), ("tie_word_embeddings", False),
                 ("rope_scaling", {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                   "truncate": False, "original_max_position_embeddings": 4096})):
        if c.get(k) is None:
            c[k] = v
    types = c.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if types != ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]:
        sys.exit("error: GPT-OSS layer_types other than sliding even layers and full odd ones (llama.cpp's swa pattern 2)")
    if c.get("swiglu_limit", 7.0) != 7.0 or c.get("swiglu_alpha", 1.702) != 1.702:
        sys.exit("error: GPT-OSS swiglu_limit / swiglu_alpha other than 7 / 1.702 (llama.cpp's graph hardcodes them)")
    return c


def gemma_checks(cfg, arch):
    """What llama.cpp's Gemma graphs can hold, refused otherwise (the converter writes no key for
    them): the query scale 1/sqrt(head_dim) (the 27B models' hidden / heads, by their layer
    count), Gemma 2's sliding even layers, Gemma 3's every sixth layer global and linear rotary
    scaling only; the config classes' defaults filled in."""
    c = dict(cfg)
    n, hd = c["num_hidden_layers"], c.get("head_dim") or 256
    c["head_dim"] = hd
    if c.get("tie_word_embeddings", True) is False:
        sys.exit("error: an untied Gemma (llama.cpp's Gemma graphs use the embedding as the output)")
    if arch == "gemma":
        return c
    big = n == (46 if arch == "gemma2" else 62)
    want = c["hidden_size"] // c["num_attention_heads"] if big else hd
    if c.get("query_pre_attn_scalar", 256) != want:
        sys.exit(f"error: query_pre_attn_scalar {c.get('query_pre_attn_scalar', 256)}: llama.cpp uses {want} for this model")
    if arch == "gemma2":
        for k, v in (("sliding_window", 4096), ("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0)):
            if c.get(k) is None:
                c[k] = v
        sliding = [i % 2 == 0 for i in range(n)]
    else:
        if c.get("attn_logit_softcapping") is not None:
            sys.exit("error: Gemma 3 with attention logit soft-capping (the converter asserts there is none)")
        if c.get("sliding_window_pattern", 6) != 6:
            sys.exit("error: Gemma 3 sliding_window_pattern other than 6 (llama.cpp hardcodes it)")
        if "sliding_window" not in c:
            c["sliding_window"] = 4096   # Gemma3TextConfig's default
        if c.get("rope_local_base_freq", 10000.0) != 10000.0:
            sys.exit("error: Gemma 3 rope_local_base_freq other than 10000 (llama.cpp hardcodes it)")
        rs = c.get("rope_scaling") or {}
        if rs and rs.get("rope_type", rs.get("type")) != "linear":
            sys.exit("error: Gemma 3 rope_scaling other than linear")
        sliding = [(i + 1) % 6 != 0 for i in range(n)]
    if c.get("layer_types") and [t == "sliding_attention" for t in c["layer_types"]] != sliding:
        sys.exit("error: layer_types other than llama.cpp's swa pattern for this model")
    return c


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
             "Qwen2MoeForCausalLM": "qwen2moe", "Phi3ForCausalLM": "phi3", "GptOssForCausalLM": "gpt-oss",
             "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
             "SmolLM3ForCausalLM": "smollm3"}
    if cfg["architectures"][0] not in archs:
        sys.exit(f"error: unsupported architecture {cfg['architectures'][0]}")
    arch = archs[cfg["architectures"][0]]
    mixtral = cfg["architectures"][0] == "MixtralForCausalLM"
    gpt_oss = arch == "gpt-oss"
    if gpt_oss:
        cfg = gpt_oss_defaults(cfg)
    gemma, sandwich = arch.startswith("gemma"), arch in ("gemma2", "gemma3")
    if gemma:
        cfg = gemma_checks(cfg, arch)
    if arch == "smollm3":  # llama.cpp's graph: every fourth layer NoPE (n_no_rope_layer_step 4), no window
        n = cfg["num_hidden_layers"]
        want = [int((i + 1) % 4 != 0) for i in range(n)]
        if (cfg.get("no_rope_layers") or want) != want or (cfg.get("use_sliding_window") and cfg.get("sliding_window")):
            sys.exit("error: SmolLM3 with NoPE layers other than every fourth, or a sliding window (llama.cpp hardcodes both)")
        cfg = dict(cfg, tie_word_embeddings=cfg.get("tie_word_embeddings", True))
    n_experts = cfg.get("num_local_experts" if mixtral or gpt_oss else "num_experts", 0) if mixtral or gpt_oss or arch.endswith("moe") else 0
    expert_inter = cfg["intermediate_size"] if mixtral or gpt_oss else cfg.get("moe_intermediate_size", 0)
    shared_inter = cfg.get("shared_expert_intermediate_size", 0) if arch == "qwen2moe" else 0
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or hidden // heads
    layers, inter, vocab = cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    theta = cfg.get("rope_theta") or {"gemma3": 1000000.0, "smollm3": 2000000.0}.get(arch, 10000.0)
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
    if not gpt_oss:  # GptOssModel writes TextModel's keys only: no rope.dimension_count, no vocab_size
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
    if "head_dim" in cfg or gemma:
        kv_add(f"{arch}.attention.key_length", 4, hd)
        kv_add(f"{arch}.attention.value_length", 4, hd)
    if not gpt_oss:
        kv_add(f"{arch}.vocab_size", 4, vocab)
    if n_experts:
        kv_add(f"{arch}.expert_count", 4, n_experts)
        kv_add(f"{arch}.expert_used_count", 4, cfg["num_experts_per_tok"])
        if gpt_oss:
            kv_add("gpt-oss.attention.sliding_window", 4, cfg["sliding_window"])
        if not mixtral:
            kv_add(f"{arch}.expert_feed_forward_length", 4, expert_inter)
        if shared_inter:
            kv_add(f"{arch}.expert_shared_feed_forward_length", 4, shared_inter)
    if gpt_oss:  # GptOssModel: yarn only; TextModel's yarn keys for the fields the config has
        if rs.get("rope_type", rs.get("type")) != "yarn":
            sys.exit(f"error: GPT-OSS only supports yarn rope scaling, got {rs.get('rope_type', rs.get('type'))}")
        kv_add("gpt-oss.rope.scaling.type", 8, "yarn")
        kv_add("gpt-oss.rope.scaling.factor", 6, rs.get("factor", 32.0))
        kv_add("gpt-oss.rope.scaling.original_context_length", 4, int(rs.get("original_max_position_embeddings", 4096)))
        for key, hf in (("yarn_ext_factor", ("extrapolation_factor",)), ("yarn_attn_factor", ("attention_factor", "attn_factor")),
                        ("yarn_beta_fast", ("beta_fast",)), ("yarn_beta_slow", ("beta_slow",))):
            v = next((rs[k] for k in hf if rs.get(k) is not None), None)
            if v is not None:
                kv_add(f"gpt-oss.rope.scaling.{key}", 6, v)
    if sandwich:  # Gemma2Model / Gemma3Model: the window; Gemma 2's caps; Gemma 3's linear rotary scaling
        kv_add(f"{arch}.attention.sliding_window", 4, cfg["sliding_window"])
    if arch == "gemma2":
        kv_add("gemma2.attn_logit_softcapping", 6, cfg["attn_logit_softcapping"])
        kv_add("gemma2.final_logit_softcapping", 6, cfg["final_logit_softcapping"])
    if arch == "gemma3" and cfg.get("final_logit_softcapping"):
        kv_add("gemma3.final_logit_softcapping", 6, cfg["final_logit_softcapping"])
    if arch == "gemma3" and rs:
        kv_add("gemma3.rope.scaling.type", 8, "linear")
        kv_add("gemma3.rope.scaling.factor", 6, rs["factor"])
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    types = {i: 1 for i in by_id}
    for a in tok.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
        types[a["id"]] = 3 if a.get("special") else 4
    n_tokens = max(by_id) + 1
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n_tokens)]
    kv_add("tokenizer.ggml.model", 8, "gpt2")
    # llama.cpp names a tokenizer.json by its pre-tokenizer; GptOssModel's o200k is "gpt-4o". The
    # others here get "gpt-2" (the random models' byte-level tokenizer.json uses GPT-2's regex).
    kv_add("tokenizer.ggml.pre", 8, "gpt-4o" if gpt_oss else "gpt-2")
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
        t = weights.get(hf_name, shape)
        plus_one = gemma and gguf_name.endswith("norm.weight")
        if plus_one:  # Gemma's converters: data_torch + 1, after prepare_tensors widened all but F16 to F32
            t = t.to(torch.float16 if weights.dtype(hf_name) == "F16" else torch.float32) + 1
        w = t.to(torch.float64).numpy().astype(F32)
        if perm_heads:
            w = permute(w, perm_heads)
        kind = kind or kind_for(shape, gguf_name)
        data, back = encode_tensor(kind, w)
        if perm_heads:
            back = unpermute(back, perm_heads)
        if plus_one:  # HF's weight: what the file holds, less the 1 HF's RMSNorm adds back
            back = (back.astype(F32) - np.float32(1)).astype(F32)
        tensors.append((gguf_name, kind, list(file_shape or shape), data, [(hf_name, list(shape))], back))

    def add_stacked(gguf_name, hf_names, shape):  # one [experts, *shape] tensor of every expert's matrix
        w = np.stack([weights.get(n, shape).numpy().astype(F32) for n in hf_names])
        kind = kind_for(w.shape, gguf_name)
        data, back = encode_tensor(kind, w)
        tensors.append((gguf_name, kind, list(w.shape), data, [(n, list(shape)) for n in hf_names], back))

    llama = arch in ("llama", "smollm3")  # LlamaModel's converters permute q and k (SmolLM3Model is one)
    tied = cfg.get("tie_word_embeddings", gemma)  # Gemma's configs default to tied
    add("token_embd.weight", "model.embed_tokens.weight", [vocab, hidden], kind="q8_0" if args.types == "mixed" else None)
    add("output_norm.weight", "model.norm.weight", [hidden])
    if not tied:
        add("output.weight", "lm_head.weight", [vocab, hidden])
    decoded_extra, kinds_extra = {}, {}  # GPT-OSS's experts: HF tensors made of several GGUF ones

    def add_raw(gguf_name, kind, shape, data, back, kinds_name):  # a tensor --decoded writes otherwise
        tensors.append((gguf_name, kind, list(shape), data, None, None))
        kinds_extra[kinds_name] = kind
        return back

    def gpt_oss_experts(i, b, m):
        """llama.cpp's GptOssModel: gate = gate_up's even outputs, up = its odd ones; MXFP4 blocks
        repacked as they are, a plain checkpoint's experts transposed to [E, out, in] and encoded."""
        E, I, H = n_experts, expert_inter, hidden
        mine = f"model.layers.{i}.mlp.experts."   # llama.cpp's intermediate names, for gguf_types.json
        if weights.has(m + "gate_up_proj_blocks"):
            for x, rows, cols in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
                for suffix, want in (("_blocks", [E, rows, cols // 32, 16]), ("_scales", [E, rows, cols // 32])):
                    info = weights.entries.get(m + x + suffix, (None, None, None))[2]
                    if cols % 32 or info is None or info["dtype"] != "U8" or list(info["shape"]) != want:
                        sys.exit(f"error: {m}{x}{suffix} missing or not U8 {want}")
            gu_b, gu_s = weights.raw(m + "gate_up_proj_blocks", np.uint8), weights.raw(m + "gate_up_proj_scales", np.uint8)
            parts = {}
            for name, sl in (("gate", slice(0, None, 2)), ("up", slice(1, None, 2))):
                data, back = repack_mxfp4(np.ascontiguousarray(gu_b[:, sl]), np.ascontiguousarray(gu_s[:, sl]))
                parts[name] = add_raw(b + f"ffn_{name}_exps.weight", "mxfp4", [E, I, H], data, back, mine + f"{name}_proj.weight")
            data, back = repack_mxfp4(weights.raw(m + "down_proj_blocks", np.uint8), weights.raw(m + "down_proj_scales", np.uint8))
            down = add_raw(b + "ffn_down_exps.weight", "mxfp4", [E, H, I], data, back, mine + "down_proj.weight")
        elif weights.has(m + "gate_up_proj"):   # llama.cpp: "not in MXFP4, performance may be degraded"
            gu = weights.get(m + "gate_up_proj", [E, H, 2 * I]).numpy().astype(F32).transpose(0, 2, 1)   # [E, 2I, H]
            parts = {}
            for name, sl in (("gate", slice(0, None, 2)), ("up", slice(1, None, 2))):
                w = np.ascontiguousarray(gu[:, sl])
                kind = kind_for(w.shape, b + f"ffn_{name}_exps.weight")
                data, back = encode_tensor(kind, w)
                parts[name] = add_raw(b + f"ffn_{name}_exps.weight", kind, w.shape, data, back, mine + f"{name}_proj.weight")
            w = np.ascontiguousarray(weights.get(m + "down_proj", [E, I, H]).numpy().astype(F32).transpose(0, 2, 1))  # [E, H, I]
            kind = kind_for(w.shape, b + "ffn_down_exps.weight")
            data, back = encode_tensor(kind, w)
            down = add_raw(b + "ffn_down_exps.weight", kind, w.shape, data, back, mine + "down_proj.weight")
        else:
            sys.exit(f"error: {m}gate_up_proj(_blocks) missing")
        gate_up = np.empty((E, 2 * I, H), F32)
        gate_up[:, 0::2], gate_up[:, 1::2] = parts["gate"], parts["up"]
        decoded_extra[m + "gate_up_proj"] = gate_up.transpose(0, 2, 1)   # HF's [E, in, out]
        decoded_extra[m + "down_proj"] = down.transpose(0, 2, 1)
        gu_bias = weights.get(m + "gate_up_proj_bias", [E, 2 * I]).numpy().astype(F32)
        biases = {}
        for name, sl in (("gate", slice(0, None, 2)), ("up", slice(1, None, 2))):
            v = np.ascontiguousarray(gu_bias[:, sl])
            biases[name] = add_raw(b + f"ffn_{name}_exps.bias", "f32", [E, I], v.astype("<f4").tobytes(), v, mine + f"{name}_proj.bias")
        v = weights.get(m + "down_proj_bias", [E, H]).numpy().astype(F32)
        decoded_extra[m + "down_proj_bias"] = add_raw(b + "ffn_down_exps.bias", "f32", [E, H], v.astype("<f4").tobytes(), v,
                                                      mine + "down_proj.bias")
        bias = np.empty((E, 2 * I), F32)
        bias[:, 0::2], bias[:, 1::2] = biases["gate"], biases["up"]
        decoded_extra[m + "gate_up_proj_bias"] = bias
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
        if sandwich:
            add(b + "post_attention_norm.weight", p + "post_attention_layernorm.weight", [hidden])
            add(b + "post_ffw_norm.weight", p + "post_feedforward_layernorm.weight", [hidden])
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
        if gpt_oss:  # its sinks (one logit per head), the norm's own name, the biased router, the experts
            add(b + "attn_sinks.weight", p + "self_attn.sinks", [heads])
            add(b + "post_attention_norm.weight", p + "post_attention_layernorm.weight", [hidden])
            add(b + "ffn_gate_inp.weight", p + "mlp.router.weight", [n_experts, hidden], kind="f32")
            add(b + "ffn_gate_inp.bias", p + "mlp.router.bias", [n_experts])
            gpt_oss_experts(i, b, p + "mlp.experts.")
            continue
        add(b + "ffn_norm.weight", p + ("pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight"),
            [hidden])
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
        for hf, back in decoded_extra.items():
            blob = np.ascontiguousarray(back, dtype="<f4").tobytes()
            header[hf] = {"dtype": "F32", "shape": list(back.shape), "data_offsets": [pos, pos + len(blob)]}
            blobs.append(blob)
            pos += len(blob)
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(args.decoded, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        with open(os.path.join(args.decoded, "gguf_types.json"), "w") as f:
            json.dump(dict({hf: kind for _, kind, _, _, hfs, _ in tensors if hfs is not None for hf, _ in hfs}, **kinds_extra),
                      f, indent=1, sort_keys=True)
        dcfg = None
        if rope_old is not None:
            # The file holds the converter's divisors, made with its `old`: the reference must see those.
            dcfg = dict(cfg)
            dcfg["rope_scaling"] = dict(rs, original_max_position_embeddings=rope_old)
        if gpt_oss:  # plain float32 experts; the rotary as the file says it, with HF's untruncated range
            dcfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
            drs = {"rope_type": "yarn", "factor": rs.get("factor", 32.0),
                   "original_max_position_embeddings": rs.get("original_max_position_embeddings", 4096), "truncate": False}
            for k in ("beta_fast", "beta_slow", "attention_factor", "attn_factor", "extrapolation_factor"):
                if rs.get(k) is not None:
                    drs[k] = rs[k]
            dcfg["rope_scaling"] = drs
        if dcfg is not None:
            with open(os.path.join(args.decoded, "config.json"), "w") as f:
                json.dump(dcfg, f)
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if name == "config.json" and dcfg is not None:
                continue
            if os.path.exists(os.path.join(args.model, name)):
                shutil.copy(os.path.join(args.model, name), os.path.join(args.decoded, name))


if __name__ == "__main__":
    main()
