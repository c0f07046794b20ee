"""Training sequences as token ids: plain English text and long-context tasks in the GLM-5 chat format.

Nothing here tokenizes. prepare.py runs megactx's own tokenizer on the development machine and stores
  - every paragraph of the corpus as the tokens of "paragraph\\n" (train, heldout and haystack splits), and
  - pieces.json: the tokens of every fixed string the tasks use, of the names they draw from (with their
    leading space) and of every 1-, 2- and 3-digit group (numbers are split into groups of three digits from
    the left by the pre-tokenizer, so a number's tokens are its groups' tokens).
A task is a concatenation of such pieces, cut only where megactx's pre-tokenizer also cuts, so its tokens are
the ones megactx produces for the same text at inference (prepare.py checks this on samples).

The needle-in-a-haystack format (also what `megactx eval niah` builds; docs/demo-model.md):
  user content = paragraph₁\\n paragraph₂\\n … (the needle "The passkey is N." is one of the paragraphs) then
                 "What is the passkey? Answer with the number."
  prompt       = [gMASK]<sop><|user|>CONTENT<|assistant|><think></think>
  answer       = "The passkey is N." then <|user|> (end of turn)
With thinking on, the prompt starts [gMASK]<sop><|system|>Reasoning Effort: Max and the assistant turn is
<think>I find it in the text.\\nThe passkey is N.</think>The passkey is N. (a short reasoning, then the answer).

Facts (`megactx eval facts`, docs/demo-model.md "Facts format"): the samples are the generator's own, made by
`megactx eval facts --in-distribution --write-jsonl` at many lengths (prepare.py); what is stored of each is its
layout: the haystack split's paragraphs from a start paragraph, the fact sentences ("sentence\n") at the
paragraph boundaries the generator put them, the question, and the answer it expects ("The {attribute} of
{entity} is {value}." or, for an absent fact, "The document does not say."). `Facts.sample` lays the same tokens
out again, so a facts task is the document `megactx eval facts` builds, token for token, with thinking off.

A sample is (tokens [T], loss weights [T]): answer tokens weigh `answer_weight`, everything else 1, and the
padding of a sequence (none in practice: sequences are filled with text) 0; a facts prompt weighs 0 (its
document is the 863-paragraph haystack over and over: learning to predict it would only memorise it).
"""
from __future__ import annotations

import json
import os
import random

import numpy as np

# Strings the tasks are made of. Each is tokenized alone, so each must start and end where the pre-tokenizer
# cuts: after "\n", before a space-led word, or around a number (" " before digits is its own pre-token).
FIXED = {
    "niah_needle": "The passkey is ",
    "period_nl": ".\n",
    "period": ".",
    "niah_question": "What is the passkey? Answer with the number.",
    "niah_reason": "I find it in the text.\n",
    "multi_needle_a": "The passkey for",
    "multi_is": " is ",
    "multi_question_a": "What is the passkey for",
    "multi_question_b": "? Answer with the number.",
    "var_prefix": "VAR",
    "var_eq": " = ",
    "var_eq_ref": " = VAR",
    "var_question": "What is the value of VAR",
    "var_answer_is": " is ",
    "copy_marker": "COPY THIS:\n",
    "copy_question": "Repeat the paragraph after the line COPY THIS.",
    "continue_question": "Continue the text.\n",
    "reasoning_effort": "Reasoning Effort: Max",
}
SPECIALS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>",
            "</think>"]
NAMES = ("Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Leo Maria Nora Oscar Paul Quinn Rosa "
         "Sam Tina Victor Wendy Xavier Yara Zack Anna Ben Clara Dan Eva Felix Gina Hugo Ida James Kate Liam Mia "
         "Noah Olga Peter Ruth Simon Tom Uma Vera Will Amber Azure Coral Crimson Golden Indigo Ivory Jade Lemon "
         "Olive Pearl Ruby Silver Violet apple river mountain garden window forest silver ocean castle bridge "
         "lantern harbor meadow valley island desert comet planet rocket engine piano violin tiger eagle falcon "
         "dolphin otter badger raven willow maple cedar").split()
VAR_NAMES = [chr(ord("A") + i) for i in range(26)]


def piece_strings() -> dict:
    """name → text of every piece prepare.py tokenizes (digit groups are added there)."""
    out = dict(FIXED)
    for n in NAMES:
        out["name: " + n] = " " + n
    for v in VAR_NAMES:
        out["var: " + v] = " " + v
    return out


class Pieces:
    def __init__(self, path: str):
        with open(path) as f:
            d = json.load(f)
        self.tok = d["pieces"]                      # name → token ids
        self.special = d["specials"]                # special token → id
        self.digits = d["digits"]                   # "7", "07", "007", ..., "999" → token ids
        self.eos = self.special["<|user|>"]         # the end of an assistant turn
        self.vocab_size = d["vocab_size"]

    def number(self, n: int) -> list:
        s = str(n)
        out = []
        for i in range(0, len(s), 3):
            out += self.digits[s[i:i + 3]]
        return out

    def __getitem__(self, name):
        return self.tok[name]


class Split:
    """Paragraph token arrays of one corpus split: tokens (uint16, concatenated) and offsets [n + 1]."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray):
        self.tokens, self.offsets = tokens, offsets
        self.n = len(offsets) - 1

    def para(self, i: int) -> list:
        i %= self.n
        return self.tokens[self.offsets[i]: self.offsets[i + 1]].tolist()

    def run(self, start: int, budget: int) -> list:
        """Consecutive paragraphs from `start` (wrapping) whose tokens total at most `budget`."""
        out, used, i = [], 0, start
        while True:
            p = self.para(i)
            if used + len(p) > budget or len(out) > self.n:
                return out
            out.append(p)
            used += len(p)
            i += 1


class Facts:
    """prepare.py's facts samples (data.npz `facts_*`) over the haystack split they were generated from.

    facts_tokens / facts_offsets: the pieces' tokens (uint16, concatenated) and offsets [n_pieces + 1];
    facts_at [n_pieces]: the paragraph boundary an inserted sentence stands at (before document paragraph k; n
    after the last), -1 for the question and the answer; facts_meta [n, 7]: the generator's length, the start
    paragraph, the paragraph count n, the first piece, the number of inserted sentences, whether the asked fact
    is absent and the prompt's tokens as megactx counted them. A sample's pieces are its sentences, then its
    question, then its answer."""

    def __init__(self, arrays, haystack: Split):
        self.tokens, self.offsets = arrays["facts_tokens"], arrays["facts_offsets"]
        self.at, self.meta = arrays["facts_at"], arrays["facts_meta"]
        self.haystack = haystack
        self.n = len(self.meta)
        self.lengths = sorted(int(x) for x in set(self.meta[:, 0].tolist()))
        self.by_length = {L: np.flatnonzero(self.meta[:, 0] == L) for L in self.lengths}

    @staticmethod
    def load(data_dir: str):
        """The facts samples of prepare.py's data, or None where it has none."""
        d = np.load(os.path.join(data_dir, "data.npz"))
        if "facts_meta" not in d.files:
            return None
        return Facts({k: d[k] for k in ("facts_tokens", "facts_offsets", "facts_at", "facts_meta")},
                     Split(d["haystack_tokens"], d["haystack_offsets"]))

    def piece(self, i: int) -> list:
        return self.tokens[self.offsets[i]: self.offsets[i + 1]].tolist()

    def sample(self, i: int):
        """(content, answer) token lists of sample i: the user message (document, then question) and the answer."""
        _, start, n, first, k = (int(x) for x in self.meta[i, :5])
        at = {}
        for j in range(first, first + k):
            at.setdefault(int(self.at[j]), []).append(j)
        content = []
        for b in range(n + 1):
            for j in at.get(b, ()):
                content += self.piece(j)
            if b < n:
                content += self.haystack.para(start + b)
        return content + self.piece(first + k), self.piece(first + k + 1)

    def content_tokens(self, i: int) -> int:
        """len(sample(i)[0]) without building it."""
        _, start, n, first, k = (int(x) for x in self.meta[i, :5])
        para = np.diff(self.haystack.offsets)[(start + np.arange(n)) % self.haystack.n].sum()
        return int(para + self.offsets[first + k + 1] - self.offsets[first])

    def pick(self, budget: int, rng: random.Random) -> int:
        """A sample of the longest generated length that fits in `budget` tokens (the generator's length bounds the
        whole prompt); the shortest length where none fits."""
        fits = [L for L in self.lengths if L <= budget] or self.lengths[:1]
        idx = self.by_length[fits[-1]]
        return int(idx[rng.randrange(len(idx))])


class Sampler:
    """Draws training sequences of a given length T. mix: weights of the kinds of sample."""

    MIX = {"text": 0.40, "niah": 0.25, "multi": 0.12, "var": 0.10, "copy": 0.08, "continue": 0.05}

    def __init__(self, text: Split, pieces: Pieces, seed: int, answer_weight: float = 5.0, think_frac: float = 0.15,
                 task_span_log2: float = 4.0, passkey_digits: tuple | None = None, facts: Facts | None = None):
        self.text, self.p, self.facts = text, pieces, facts
        self.rng = random.Random(seed)
        self.answer_weight, self.think_frac = answer_weight, think_frac
        self.task_span_log2 = task_span_log2
        self.passkey_digits = passkey_digits
        self.kinds = list(self.MIX)
        self.weights = [self.MIX[k] for k in self.kinds]

    def set_mix(self, spec: str):
        """--mix "text:0.3,niah:0.3,facts:0.4": the kinds of sample and their weights."""
        mix = {k: float(v) for k, v in (x.split(":") for x in spec.split(","))}
        for k in mix:
            if k != "text" and not hasattr(self, "task_" + k):
                raise ValueError(f"--mix: no task {k!r}")
        if "facts" in mix and self.facts is None:
            raise ValueError("--mix facts: the data has no facts samples (prepare.py --facts-per-length)")
        self.kinds, self.weights = list(mix), list(mix.values())

    # -- pieces ------------------------------------------------------------------------------------------------

    def chat(self, content: list, answer: list, think: bool, reasoning: list | None = None):
        """(tokens, is_answer) of one GLM-5 turn: prompt as megactx renders it, then the answer and <|user|>."""
        s, P = self.p.special, self.p
        prompt = [s["[gMASK]"], s["<sop>"]]
        if think:
            prompt += [s["<|system|>"]] + P["reasoning_effort"]
        prompt += [s["<|user|>"]] + content + [s["<|assistant|>"], s["<think>"]]
        reply = (reasoning or []) + [s["</think>"]] if think else [s["</think>"]]
        # Without thinking the template itself writes "<think></think>": both belong to the prompt.
        if not think:
            prompt, reply = prompt + reply, []
        reply += answer + [P.eos]
        return prompt + reply, [0] * len(prompt) + [1] * len(reply)

    def haystack(self, budget: int, needles: list) -> list:
        """Paragraphs totalling about `budget` tokens with each needle (a token list ending in "\\n") inserted
        at a uniformly random paragraph boundary. Returns the flat token list."""
        paras = self.text.run(self.rng.randrange(self.text.n), max(budget - sum(len(n) for n in needles), 0))
        paras = [list(p) for p in paras]
        for n in needles:
            paras.insert(self.rng.randint(0, len(paras)), n)
        return [t for p in paras for t in p]

    def passkey(self) -> int:
        """A number of 5-6 digits (`megactx eval niah`'s range), or with passkey_digits = (lo, hi) of a digit count
        drawn uniformly from lo..hi: longer numbers than the evaluation's teach the copy to run to the needle's
        period rather than to a typical length."""
        if self.passkey_digits is None:
            return self.rng.randint(10000, 999999)
        n = self.rng.randint(*self.passkey_digits)
        return self.rng.randint(10 ** (n - 1), 10 ** n - 1)

    # -- tasks: each returns (content, answer, reasoning) within a content budget ------------------------------

    def task_niah(self, budget):
        P, n = self.p, self.passkey()
        said = P["niah_needle"] + P.number(n)
        content = self.haystack(budget - 16, [said + P["period_nl"]]) + P["niah_question"]
        return content, said + P["period"], P["niah_reason"] + said + P["period"]

    def task_multi(self, budget):
        P = self.p
        names = self.rng.sample(NAMES, self.rng.randint(2, 6))
        keys = [self.passkey() for _ in names]
        needles = [P["multi_needle_a"] + P["name: " + m] + P["multi_is"] + P.number(k) + P["period_nl"]
                   for m, k in zip(names, keys)]
        j = self.rng.randrange(len(names))
        said = P["multi_needle_a"] + P["name: " + names[j]] + P["multi_is"] + P.number(keys[j])
        content = self.haystack(budget - 24, needles) + P["multi_question_a"] + P["name: " + names[j]] + \
            P["multi_question_b"]
        return content, said + P["period"], P["niah_reason"] + said + P["period"]

    def task_var(self, budget):
        """Variable tracking: VAR A = N. … VAR B = VAR A. … (a chain of 1-4 hops, in order, over the text)."""
        P = self.p
        names = self.rng.sample(VAR_NAMES, self.rng.randint(2, 5))
        n = self.passkey()
        lines = [P["var_prefix"] + P["var: " + names[0]] + P["var_eq"] + P.number(n) + P["period_nl"]]
        for a, b in zip(names, names[1:]):
            lines.append(P["var_prefix"] + P["var: " + b] + P["var_eq_ref"] + P["var: " + a] + P["period_nl"])
        # Keep the chain in order: split the haystack into len(lines)+1 runs.
        total = max(budget - 8 * len(lines) - 16, 0)
        parts = sorted(self.rng.random() for _ in lines)
        bounds = [0] + [int(total * x) for x in parts] + [total]
        content, start = [], self.rng.randrange(self.text.n)
        for i in range(len(lines) + 1):
            run = self.text.run(start, bounds[i + 1] - bounds[i])
            start += len(run)
            content += [t for p in run for t in p]
            if i < len(lines):
                content += lines[i]
        last = names[-1]
        content += P["var_question"] + P["var: " + last] + P["multi_question_b"]
        said = P["var_prefix"] + P["var: " + last] + P["var_answer_is"] + P.number(n)
        return content, said + P["period"], P["niah_reason"] + said + P["period"]

    def task_copy(self, budget):
        P = self.p
        target = list(self.text.para(self.rng.randrange(self.text.n)))
        while len(target) > min(300, budget // 3):  # a whole paragraph, short enough to copy
            target = list(self.text.para(self.rng.randrange(self.text.n)))
        needle = P["copy_marker"] + target
        content = self.haystack(budget - 2 * len(target) - 16, [needle]) + P["copy_question"]
        return content, target, None

    def task_facts(self, budget):
        """A `megactx eval facts` training sample (train split), as the generator laid it out; thinking off, as
        `eval facts` asks."""
        content, answer = self.facts.sample(self.facts.pick(budget, self.rng))
        return content, answer, None

    def task_continue(self, budget):
        P = self.p
        para = list(self.text.para(self.rng.randrange(self.text.n)))[: max(budget // 2, 16)]
        cut = self.rng.randint(1, max(len(para) - 1, 1))
        return P["continue_question"] + para[:cut], para[cut:], None

    # -- sequences ---------------------------------------------------------------------------------------------

    def fill_text(self, n: int) -> list:
        """n tokens of consecutive paragraphs (a document boundary marked by <|endoftext|> at the start)."""
        out = [self.p.special["<|endoftext|>"]]
        i = self.rng.randrange(self.text.n)
        while len(out) < n:
            out += list(self.text.para(i))
            i += 1
        return out[:n]

    def sequence(self, T: int):
        """tokens [T] int64, weights [T] float32 (weight of predicting each token from the ones before)."""
        kind = self.rng.choices(self.kinds, self.weights)[0]
        if kind == "text":
            toks = self.fill_text(T)
            return np.array(toks, np.int64), np.ones(T, np.float32)
        # Task length: log-uniform between T / 2^task_span_log2 (T/16 by default) and T, so short and long
        # documents both occur.
        L = int(T * 2 ** (-self.task_span_log2 * self.rng.random()))
        L = max(L, 256)
        think = self.rng.random() < self.think_frac
        content, answer, reasoning = getattr(self, "task_" + kind)(L - len(self.p["reasoning_effort"]) - 40)
        toks, is_answer = self.chat(content, answer, think and reasoning is not None, reasoning)
        toks, is_answer = toks[:T], is_answer[:T]
        prompt_weight = 0.0 if kind == "facts" else 1.0
        w = [self.answer_weight if a else prompt_weight for a in is_answer]
        if len(toks) < T:
            rest = self.fill_text(T - len(toks))
            toks += rest
            w += [1.0] * len(rest)
        return np.array(toks, np.int64), np.array(w, np.float32)

    def batch(self, B: int, T: int):
        seqs = [self.sequence(T) for _ in range(B)]
        return np.stack([s[0] for s in seqs]), np.stack([s[1] for s in seqs])


def pose_positions(rng: random.Random, T: int, max_position: int, p_skip: float = 0.5) -> np.ndarray:
    """RoPE positions for a training sequence: 0..T-1, or (with probability p_skip) 0..T-1 with up to three
    random skips inserted (positional skip-wise training, PoSE), so relative distances up to `max_position`
    occur while the sequence stays T tokens. The span is log-uniform between T and max_position."""
    pos = np.arange(T, dtype=np.int64)
    if rng.random() >= p_skip or max_position <= T:
        return pos
    span = int(T * (max_position / T) ** rng.random())
    extra = span - T
    cuts = sorted(rng.randrange(1, T) for _ in range(rng.randint(1, 3)))
    shares = sorted(rng.random() for _ in cuts)
    skips = np.diff([0] + [int(extra * s) for s in shares])
    for c, s in zip(cuts, skips):
        pos[c:] += int(s)
    return pos
