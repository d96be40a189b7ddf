#!/usr/bin/env python3
"""A small GPT-2 style byte-level BPE trainer, plus encode/decode.

Usage: train_tokenizer.py CORPUS_TXT OUTPUT_TOKENIZER_JSON [--vocab 4096]

Vocabulary layout: ids 0..255 are the 256 byte tokens in byte order (written
with GPT-2's bytes_to_unicode mapping), then the learned merges in rank order,
then the two special tokens <|begin_of_text|> and <|end_of_text|> last.
The output is a standard Hugging Face `tokenizer.json` (model type BPE).
"""
import argparse
import heapq
import json
from collections import Counter, defaultdict

import regex

GPT2_SPLIT = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>"]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character table."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()
U2B = {v: k for k, v in B2U.items()}


def train(text, vocab_size):
    """Returns the merges as a list of (left_id, right_id) in rank order."""
    n_merges = vocab_size - 256 - len(SPECIALS)
    counts = Counter(GPT2_SPLIT.findall(text))
    words = [list(w.encode("utf-8")) for w in counts]  # symbols as token ids
    freqs = list(counts.values())

    pair_count = defaultdict(int)
    pair_words = defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freqs[wi]
            pair_words[(a, b)].add(wi)
    # max-heap on count; ties go to the smallest (left_id, right_id)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)

    merges = []
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue  # stale heap entry
        new_id = 256 + len(merges)
        merges.append(pair)
        touched = set()
        for wi in list(pair_words[pair]):
            w, f = words[wi], freqs[wi]
            for a, b in zip(w, w[1:]):  # remove this word's old pairs
                pair_count[(a, b)] -= f
                touched.add((a, b))
            nw, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == pair[0] and w[i + 1] == pair[1]:
                    nw.append(new_id)
                    i += 2
                else:
                    nw.append(w[i])
                    i += 1
            words[wi] = nw
            for a, b in zip(w, w[1:]):
                pair_words[(a, b)].discard(wi)
            for a, b in zip(nw, nw[1:]):  # add the new pairs
                pair_count[(a, b)] += f
                pair_words[(a, b)].add(wi)
                touched.add((a, b))
        for p in touched:
            c = pair_count[p]
            if c <= 0:
                pair_count.pop(p, None)
                pair_words.pop(p, None)
            else:
                heapq.heappush(heap, (-c, p))
    return merges


def token_strings(merges):
    toks = [B2U[b] for b in range(256)]
    for a, b in merges:
        toks.append(toks[a] + toks[b])
    return toks


def build_tokenizer_json(merges):
    toks = token_strings(merges)
    vocab = {t: i for i, t in enumerate(toks)}
    assert len(vocab) == len(toks), "duplicate token string"
    n = len(toks)
    added = [{"id": n + i, "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for i, s in enumerate(SPECIALS)]
    for i, s in enumerate(SPECIALS):
        vocab[s] = n + i
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                          "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                    "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{toks[a]} {toks[b]}" for a, b in merges],
        },
    }


class Tokenizer:
    """Standard byte-level BPE: split with the GPT-2 regex, then repeatedly
    merge the adjacent pair with the lowest merge rank."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        self.vocab = tj["model"]["vocab"]
        self.id_to_tok = {i: t for t, i in self.vocab.items()}
        self.ranks = {tuple(m.split(" ")): r for r, m in enumerate(tj["model"]["merges"])}
        self.special = {t["content"]: t["id"] for t in tj["added_tokens"]}
        self.cache = {}

    def _bpe(self, word):
        syms = [B2U[b] for b in word.encode("utf-8")]
        while len(syms) > 1:
            best = min(range(len(syms) - 1),
                       key=lambda i: self.ranks.get((syms[i], syms[i + 1]), 1 << 30))
            if (syms[best], syms[best + 1]) not in self.ranks:
                break
            syms[best:best + 2] = [syms[best] + syms[best + 1]]
        return [self.vocab[s] for s in syms]

    def encode(self, text):
        ids = []
        for w in GPT2_SPLIT.findall(text):
            if w not in self.cache:
                self.cache[w] = self._bpe(w)
            ids.extend(self.cache[w])
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            t = self.id_to_tok[i]
            if t in self.special:
                out += t.encode("utf-8")
            else:
                out += bytes(U2B[c] for c in t)
        return out.decode("utf-8", errors="replace")


_default = None


def encode(text, path="models/kjv-tiny/tokenizer.json"):
    global _default
    if _default is None:
        _default = Tokenizer(path)
    return _default.encode(text)


def decode(ids, path="models/kjv-tiny/tokenizer.json"):
    global _default
    if _default is None:
        _default = Tokenizer(path)
    return _default.decode(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("output")
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        text = f.read()
    merges = train(text, args.vocab)
    tj = build_tokenizer_json(merges)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=1)
    print(f"{len(merges)} merges, vocab {len(tj['model']['vocab'])} -> {args.output}")
    tok = Tokenizer(args.output)
    s = "In the beginning God created the heaven and the earth."
    ids = tok.encode(s)
    assert tok.decode(ids) == s
    print(s, "->", ids)


if __name__ == "__main__":
    main()
