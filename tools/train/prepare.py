#!/usr/bin/env python3
"""Tokenizes the corpus for training with megactx's own tokenizer, on the development machine.

Input: the corpus directory corpus.sh writes (train.txt, heldout.txt, haystack.txt: one paragraph per line) and
a directory holding the trained tokenizer.json. Output (--out):
  data.npz     per split: <split>_tokens (uint16, every paragraph as the tokens of "paragraph\\n", concatenated)
               and <split>_offsets (int64 [n + 1])
               and facts_* (tasks.Facts): `megactx eval facts --in-distribution` samples, made by megactx over the
               haystack split at FACTS_LENGTHS, stored as their layouts (start paragraph, the fact sentences and
               where they stand, the question, the answer), so tasks.py lays out the generator's own documents
  pieces.json  the tokens of every piece tasks.py builds tasks from, the digit groups and the special-token ids
Then it checks the premise of tasks.py: sample sequences are detokenized and tokenized again by megactx, and the
tokens must come back unchanged (every task kind, with and without thinking); every facts sample's layout has the
prompt length megactx gave it, one sample per length is megactx's own prompt token for token, and no sentence
frame, question frame or key of the held-out split (`megactx eval facts`'s default) is in the facts data.

Usage: prepare.py --corpus DIR --tokenizer DIR --out DIR [--megactx build/megactx] [--max-train-mb 64]
                  [--facts-per-length 210]
"""
import argparse
import json
import os
import random
import re
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


# The lengths facts samples are generated at: four a doubling from 256 to 32768 tokens, less 64 so that a task of
# budget T - 45 (tasks.Sampler.sequence) at T = 32768 still fits the longest; a task takes the longest that fits.
FACTS_LENGTHS = [int(2 ** (e / 4)) - 64 for e in range(32, 61)]
FACTS_DEPTHS = ",".join(f"{d / 20:g}" for d in range(21))
CHAT = "[gMASK]<sop><|user|>{}<|assistant|><think></think>"  # eval facts' prompt: GLM-5, thinking off


def facts_lines(megactx, tokenizer_dir, haystack, length, per_cell, absent, seed, in_distribution=True):
    """The JSON lines `megactx eval facts --write-jsonl` writes for one length (every depth of FACTS_DEPTHS)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "facts.jsonl")
        cmd = [megactx, "eval", "facts", "--model", tokenizer_dir, "--haystack", haystack, "--lengths", str(length),
               "--depths", FACTS_DEPTHS, "--samples", str(per_cell), "--absent", str(absent), "--seed", str(seed),
               "--write-jsonl", path, "-q"]
        subprocess.run(cmd + (["--in-distribution"] if in_distribution else []), check=True)
        with open(path, encoding="utf-8") as f:
            return [json.loads(l) for l in f]


def facts_layout(line, para_index, n_para):
    """A JSON line → (start paragraph, paragraph count, [(boundary, sentence)], question). The document's lines
    are haystack paragraphs, consecutive from a start paragraph, and the fact sentences between them."""
    content = line["content"]
    assert line["prompt"] == CHAT.format(content), "eval facts' prompt is not the chat format tasks.py writes"
    *doc, question = content.split("\n")
    start, n, inserts = None, 0, []
    for x in doc:
        i = para_index.get(x)
        if i is None:
            inserts.append((n, x))
            continue
        if start is None:
            start = i
        assert i == (start + n) % n_para, "the document's paragraphs are not consecutive haystack paragraphs"
        n += 1
    return start or 0, n, inserts, question


FRAME_SLOTS = ("{V}", "{E}", "{A}")


def frame_of(text, fact):
    """text with the fact's value, entity and attribute as {V} {E} {A} (case aside): the frame it was written in."""
    out = text
    for slot, part in zip(FRAME_SLOTS, fact):
        out = re.sub(re.escape(part), slot, out, count=1, flags=re.IGNORECASE)
    return out


def asked_fact(reference):
    """(value, entity, attribute) of an answer "The {A} of {E} is {V}."; None for the refusal."""
    m = re.fullmatch(r"The (.+?) of (the \S+ \S+) is (.+)\.", reference)
    return (m.group(3), m.group(2), m.group(1)) if m else None


def split_frames(lines):
    """The sentence and question frames of the asked facts in JSON lines, and their entity words and attributes."""
    frames, keys = set(), set()
    for line in lines:
        fact = asked_fact(line["reference"])
        if fact is None:
            continue
        value, entity, attribute = fact
        *doc, question = line["content"].split("\n")
        frames.add(("question", frame_of(question, fact)))
        for x in doc:
            if value in x and entity.lower() in x.lower() and attribute.lower() in x.lower():
                frames.add(("sentence", frame_of(x, fact)))
        keys.update(entity.split()[1:])
        keys.add(attribute)
    return frames, keys


def make_facts(a, haystack_path, haystack_paras):
    """facts_* arrays for data.npz (tasks.Facts), the texts of their pieces to tokenize, and what to check."""
    para_index = {p: i for i, p in enumerate(haystack_paras)}
    assert len(para_index) == len(haystack_paras), "the haystack has a paragraph twice"
    meta, at, texts, samples_per_length = [], [], [], {}
    train_frames, train_keys = set(), set()
    cell = max(a.facts_per_length // 21, 1)  # samples a (length, depth) cell; one in five absent
    for length in FACTS_LENGTHS:
        lines = facts_lines(a.megactx, a.tokenizer, haystack_path, length, cell - cell // 5, cell // 5, a.facts_seed)
        frames, keys = split_frames(lines)
        train_frames |= frames
        train_keys |= keys
        for line in lines:
            start, n, inserts, question = facts_layout(line, para_index, len(haystack_paras))
            meta.append([length, start, n, len(texts), len(inserts), int(line["absent"]), line["prompt_tokens"]])
            for b, x in inserts:
                at.append(b)
                texts.append(x + "\n")
            at += [-1, -1]
            texts += [question, line["reference"]]
        samples_per_length[length] = lines[0]["prompt"]
        print(f"  facts at {length}: {len(lines)} samples, {sum(l['absent'] for l in lines)} absent, "
              f"{sum(l['prompt_tokens'] for l in lines) / len(lines):.0f} prompt tokens on average", flush=True)
    # The held-out split's frames and keys, from the default split of the same generator, must not be in the data.
    held_frames, held_keys = split_frames(facts_lines(a.megactx, a.tokenizer, haystack_path, 2048, 8, 0,
                                                      a.facts_seed + 1, in_distribution=False))
    leaked = held_frames & train_frames
    every = "\n".join(texts)
    leaked |= {k for k in held_keys if re.search(rf"\b{re.escape(k)}\b", every, re.IGNORECASE)}
    print(f"  held-out split: {len(held_frames)} frames and {len(held_keys)} keys seen, none in the facts data"
          if not leaked else f"  held-out frames or keys in the facts data: {sorted(map(str, leaked))}")
    print(f"  train split: {len(train_frames)} frames, {len(train_keys)} keys")
    meta = np.array(meta, np.int64)
    return meta, np.array(at, np.int32), texts, samples_per_length, not leaked


def check_facts(a, s, firsts):
    """Every facts sample's layout has the prompt length megactx gave it; the first sample of every length is
    megactx's prompt token for token (the sample as tasks.py lays it out, in the chat turn it trains on)."""
    F = s.facts
    frame = len(s.chat([], [], False)[0]) - 1  # the prompt around an empty user message (less the answer's end)
    wrong = [i for i in range(F.n) if frame + F.content_tokens(i) != F.meta[i, 6]]
    print(f"facts: {F.n - len(wrong)}/{F.n} layouts have megactx's prompt length" +
          (f"; not {wrong[:8]}" if wrong else ""))
    lengths = list(firsts)
    want = tokenize_many(a.megactx, a.tokenizer, [firsts[L] for L in lengths])
    bad = 0
    for L, ids in zip(lengths, want):
        i = int(F.by_length[L][0])
        content, answer = F.sample(i)
        toks, is_answer = s.chat(content, answer, False)
        if toks[: is_answer.index(1)] != ids:
            bad += 1
            print(f"  facts at {L}: the laid-out prompt differs from megactx's ({len(toks)} vs {len(ids)} tokens)")
    print(f"facts: {len(lengths) - bad}/{len(lengths)} laid-out prompts are megactx's tokens of eval facts' prompt")
    return not wrong and not bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--megactx", default=os.path.join(os.path.dirname(__file__), "../../build/megactx"))
    ap.add_argument("--max-train-mb", type=float, default=64.0)
    ap.add_argument("--check", type=int, default=24, help="sample sequences to round-trip through megactx")
    ap.add_argument("--facts-per-length", type=int, default=210,
                    help="facts samples per generated length (21 depths, 2 of every 10 absent); 0: none")
    ap.add_argument("--facts-seed", type=int, default=11)
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
        if split == "haystack":
            haystack_paras = paras
    ok = True
    if a.facts_per_length > 0:
        print(f"facts: megactx eval facts --in-distribution at {len(FACTS_LENGTHS)} lengths, {FACTS_LENGTHS[0]} to "
              f"{FACTS_LENGTHS[-1]} tokens", flush=True)
        meta, at, texts, firsts, ok = make_facts(a, os.path.join(a.corpus, "haystack.txt"), haystack_paras)
        arrays["facts_tokens"], arrays["facts_offsets"] = split_arrays(tokenize_many(a.megactx, a.tokenizer, texts))
        arrays["facts_at"], arrays["facts_meta"] = at, meta
        print(f"facts: {len(meta)} samples, {len(texts)} pieces, {int(arrays['facts_offsets'][-1])} tokens")
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
    facts = tasks.Facts.load(a.out)
    s = tasks.Sampler(text, P, seed=1, think_frac=0.5, facts=facts)
    if facts is not None:
        ok &= check_facts(a, s, firsts)
    kinds = [k for k in s.kinds if k != "text"] + (["facts"] if facts is not None else [])
    bad = 0
    for i in range(a.check):
        kind = kinds[i % len(kinds)]
        think = i % 2 == 1
        content, answer, reasoning = getattr(s, "task_" + kind)(600)
        toks, _ = s.chat(content, answer, think and reasoning is not None, reasoning)
        again = tokenize_many(a.megactx, a.tokenizer, [detokenize(a.megactx, a.tokenizer, toks)])[0]
        if again != toks:
            bad += 1
            j = next((k for k in range(min(len(toks), len(again))) if toks[k] != again[k]), min(len(toks), len(again)))
            print(f"  {kind} (think={think}): differs at token {j} of {len(toks)}: {toks[j:j + 8]} vs {again[j:j + 8]}")
    print(f"round trip: {a.check - bad}/{a.check} task samples tokenize back to the same ids")
    sys.exit(1 if bad or not ok else 0)


if __name__ == "__main__":
    main()
