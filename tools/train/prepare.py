#!/usr/bin/env python3
"""Tokenizes the corpus for training with megactx's own tokenizer, on the development machine.

Input: the corpus directory corpus.sh writes (train.txt, heldout.txt, haystack.txt: one paragraph per line) and
a directory holding the trained tokenizer.json. Output (--out):
  data.npz     per split: <split>_tokens (uint16, every paragraph as the tokens of "paragraph\\n", concatenated)
               and <split>_offsets (int64 [n + 1])
  pieces.json  the tokens of every piece tasks.py builds tasks from, the digit groups and the special-token ids
Then it checks the premise of tasks.py: sample sequences are detokenized and tokenized again by megactx, and the
tokens must come back unchanged (every task kind, with and without thinking).

Usage: prepare.py --corpus DIR --tokenizer DIR --out DIR [--megactx build/megactx] [--max-train-mb 64]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402


def tokenize_many(megactx, tokenizer_dir, texts):
    """megactx tokenize --jsonl: one JSON string per line in, one id array per line out."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
        path = f.name
    try:
        out = subprocess.run([megactx, "tokenize", "--model", tokenizer_dir, "--jsonl", path, "--no-special"],
                             check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    lines = out.splitlines()
    assert len(lines) == len(texts), (len(lines), len(texts))
    return [json.loads(l) for l in lines]


def detokenize(megactx, tokenizer_dir, ids):
    return subprocess.run([megactx, "detokenize", "--model", tokenizer_dir, "--ids", ",".join(map(str, ids))],
                          check=True, capture_output=True, text=True).stdout


def read_paragraphs(path, max_bytes=None):
    out, used = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            used += len(line) + 1
            if max_bytes and used > max_bytes:
                break
            out.append(line)
    return out


def split_arrays(token_lists):
    lengths = np.array([len(t) for t in token_lists], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.fromiter((i for t in token_lists for i in t), np.int64, count=int(offsets[-1]))
    assert flat.max(initial=0) < 65536
    return flat.astype(np.uint16), offsets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--megactx", default=os.path.join(os.path.dirname(__file__), "../../build/megactx"))
    ap.add_argument("--max-train-mb", type=float, default=64.0)
    ap.add_argument("--check", type=int, default=24, help="sample sequences to round-trip through megactx")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    with open(os.path.join(a.tokenizer, "tokenizer.json"), encoding="utf-8") as f:
        tok_json = json.load(f)
    added = {t["content"]: t["id"] for t in tok_json["added_tokens"]}
    specials = {s: added[s] for s in tasks.SPECIALS}

    arrays = {}
    for split, limit in (("train", a.max_train_mb * 1e6), ("heldout", None), ("haystack", None)):
        paras = read_paragraphs(os.path.join(a.corpus, split + ".txt"), limit)
        toks = tokenize_many(a.megactx, a.tokenizer, [p + "\n" for p in paras])
        arrays[split + "_tokens"], arrays[split + "_offsets"] = split_arrays(toks)
        n_tok = int(arrays[split + "_offsets"][-1])
        print(f"{split}: {len(paras)} paragraphs, {sum(map(len, paras)) / 1e6:.1f} MB, {n_tok / 1e6:.2f} M tokens "
              f"({sum(map(len, paras)) / max(n_tok, 1):.2f} bytes/token)")
    np.savez_compressed(os.path.join(a.out, "data.npz"), **arrays)

    strings = tasks.piece_strings()
    names = list(strings)
    ids = tokenize_many(a.megactx, a.tokenizer, [strings[n] for n in names])
    digits = [str(i) for i in range(10)] + [f"{i:02d}" for i in range(100)] + [f"{i:03d}" for i in range(1000)]
    digit_ids = tokenize_many(a.megactx, a.tokenizer, digits)
    vocab_size = max(max(added.values()) + 1, len(tok_json["model"]["vocab"]))
    pieces = {"pieces": dict(zip(names, ids)), "digits": dict(zip(digits, digit_ids)), "specials": specials,
              "vocab_size": vocab_size}
    with open(os.path.join(a.out, "pieces.json"), "w") as f:
        json.dump(pieces, f)

    # The premise: a task's tokens are what megactx makes of its text.
    P = tasks.Pieces(os.path.join(a.out, "pieces.json"))
    text = tasks.Split(arrays["train_tokens"], arrays["train_offsets"])
    s = tasks.Sampler(text, P, seed=1, think_frac=0.5)
    bad = 0
    for i in range(a.check):
        kind = s.kinds[1 + i % (len(s.kinds) - 1)]
        think = i % 2 == 1
        content, answer, reasoning = getattr(s, "task_" + kind)(600)
        toks, _ = s.chat(content, answer, think and reasoning is not None, reasoning)
        again = tokenize_many(a.megactx, a.tokenizer, [detokenize(a.megactx, a.tokenizer, toks)])[0]
        if again != toks:
            bad += 1
            j = next((k for k in range(min(len(toks), len(again))) if toks[k] != again[k]), min(len(toks), len(again)))
            print(f"  {kind} (think={think}): differs at token {j} of {len(toks)}: {toks[j:j + 8]} vs {again[j:j + 8]}")
    print(f"round trip: {a.check - bad}/{a.check} task samples tokenize back to the same ids")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
