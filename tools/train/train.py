#!/usr/bin/env python3
"""Trains the demo model (tools/train/model.py) on the GPU machine, against a wall-clock budget.

Recipe (docs/demo-model.md says why):
  1. dense warm-up (the first --dense-frac of the time): every layer attends to all causal keys; each full
     layer's indexer learns, by KL, the attention distribution of the layers it serves (itself and the shared
     layers after it), and the MTP layer's indexer its own layer's;
  2. sparse training: every layer attends only to its full layer's top-k (index_topk), the indexers keep
     learning on the selected keys;
  throughout: next-token CE, the MTP layer's CE on the token after next (weight --mtp-weight; with --mtp-steps N
  also its later draft steps, each on the token one further, reusing step 0's KV and top-k), answer tokens of
  the chat tasks weighted up, the router's selection bias balanced from the expert loads, RoPE positions with
  random skips (PoSE) so distances up to --max-position are seen at 2K-8K tokens, and a context length that grows
  with the progress (--lengths).
The learning rate warms up over the first 2% of the time and decays by a cosine to 10% at the end; progress is
elapsed time / budget, so a run of any length ends annealed.

Writes to --out: train.log (one JSON line per log step), ckpt.safetensors (fp32 weights under the checkpoint
names plus the step and the router biases) and export/ (the bf16 Hugging Face directory megactx loads, without
the tokenizer files), both every --ckpt-minutes and at the end. --resume continues from a ckpt.safetensors (weights
only: the optimizer starts fresh, with a short warm-up).

Usage: train.py --data DIR --out DIR --minutes M [--size demo] [--resume CKPT]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import sys
import threading
import queue
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
import tasks  # noqa: E402
from model import Config, GlmMoeDsa, GroupedExperts  # noqa: E402


def demo_config(vocab_size: int, specials: dict, index_all_layers: bool = False) -> Config:
    """The shipped model: 8 layers (IndexShare FSSSFSSS: a full indexer every fourth layer), hidden 256, MLA
    with q/kv LoRA, 8 routed experts (top-2) plus a shared one, one MTP layer; about 14 M parameters."""
    n = 8
    types = ["full"] * n if index_all_layers else ["full", "shared", "shared", "shared"] * 2
    return Config(vocab_size=vocab_size, hidden_size=256, intermediate_size=768, moe_intermediate_size=192,
                  num_hidden_layers=n, num_attention_heads=4, q_lora_rank=128, kv_lora_rank=64,
                  qk_nope_head_dim=48, qk_rope_head_dim=16, v_head_dim=64, n_routed_experts=8,
                  num_experts_per_tok=2, n_shared_experts=1, index_n_heads=4, index_head_dim=32, index_topk=256,
                  indexer_types=types, first_k_dense_replace=1, rope_theta=8000000.0,
                  max_position_embeddings=1048576, tie_word_embeddings=False,
                  eos_token_id=[specials["<|endoftext|>"], specials["<|user|>"], specials["<|observation|>"]],
                  pad_token_id=specials["<|endoftext|>"], bos_token_id=None)


def smoke_config(vocab_size: int, specials: dict) -> Config:
    """A few-layer model for checking the training loop on a CPU."""
    return Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                  num_hidden_layers=4, num_attention_heads=2, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                  qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, index_n_heads=2,
                  index_head_dim=16, index_topk=32, indexer_types=["full", "shared", "shared", "full"],
                  first_k_dense_replace=1, max_position_embeddings=1048576,
                  eos_token_id=[specials["<|endoftext|>"], specials["<|user|>"]], pad_token_id=specials["<|endoftext|>"])


SIZES = {"demo": lambda v, s: demo_config(v, s), "demo-allfull": lambda v, s: demo_config(v, s, True),
         "smoke": smoke_config}


DEV = "cuda"


def autocast():
    """bf16 autocast on the GPU (fp32 master weights); plain fp32 elsewhere."""
    if DEV != "cuda":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.bfloat16)


def weighted_ce(logits, targets, weights):
    """logits [B, T, V], targets [B, T], weights [B, T] → Σ w·CE / Σ w (fp32)."""
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1), reduction="none")
    w = weights.reshape(-1)
    return (ce * w).sum() / w.sum().clamp_min(1e-6)


class Batches:
    """A background thread that draws batches (tokens, weights, positions) ahead of the GPU."""

    def __init__(self, sampler: tasks.Sampler, seed: int, max_position: int, depth: int = 6):
        self.sampler, self.rng, self.max_position = sampler, random.Random(seed), max_position
        self.q = queue.Queue(maxsize=depth)
        self.shape = None
        self.plan = None
        self.lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True).start()

    def set_shape(self, B, T):
        with self.lock:
            self.shape = (B, T)

    def follow_plan(self, shapes):
        """Draw batches in the order of `shapes` (an iterator of (B, T)) instead of the last set_shape, so a
        length that changes every step wastes no batch drawn ahead."""
        with self.lock:
            self.plan = iter(shapes)

    def _run(self):
        while True:
            with self.lock:
                shape = next(self.plan) if self.plan is not None else self.shape
            if shape is None:
                time.sleep(0.01)
                continue
            B, T = shape
            ids, w = self.sampler.batch(B, T)
            pos = tasks.pose_positions(self.rng, T, self.max_position)
            ids, w = torch.from_numpy(ids), torch.from_numpy(w)
            if DEV == "cuda":
                ids, w = ids.pin_memory(), w.pin_memory()
            self.q.put((shape, ids, w, torch.from_numpy(pos)))

    def get(self, B, T):
        while True:
            shape, ids, w, pos = self.q.get()
            if shape == (B, T):
                return ids.to(DEV, non_blocking=True), w.to(DEV, non_blocking=True), pos.to(DEV)


def lr_at(progress, base, warm=0.02, floor=0.1):
    if progress < warm:
        return base * progress / warm
    p = (progress - warm) / (1 - warm)
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(p, 1.0))))


def length_at(progress, lengths):
    """The context length schedule: --lengths "2048:0.4,4096:0.35,8192:0.25" are (T, share of the time)."""
    acc = 0.0
    for T, share in lengths:
        acc += share
        if progress < acc:
            return T
    return lengths[-1][0]


def save_ckpt(model, path, step):
    t = {k: v.float() for k, v in model.checkpoint_state().items()}
    export.write_safetensors(path, t, {"format": "pt", "step": str(step)})


def save_export(model, out):
    """out/export: the bf16 model directory, replaced whole, so that a reader (gpu.sh follow, which brings it back
    after every checkpoint) never sees half a file. A run cut short is resumed from it (--resume)."""
    tmp, final = os.path.join(out, "export.tmp"), os.path.join(out, "export")
    shutil.rmtree(tmp, ignore_errors=True)
    export.save(model, tmp, dtype="bf16")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)


@torch.no_grad()
def evaluate(model, heldout: tasks.Split, pieces: tasks.Pieces, T=2048, n_seq=16, mode="sparse", n=8):
    """Held-out perplexity (plain text, positions 0..T-1) and greedy passkey accuracy on short prompts."""
    model.eval()
    s = tasks.Sampler(heldout, pieces, seed=1234)
    ids = torch.tensor(np.stack([np.array(s.fill_text(T), np.int64) for _ in range(n_seq)])).to(DEV)
    nll = 0.0
    for i in range(0, n_seq, 4):
        with autocast():
            out = model(ids[i:i + 4], mode=mode, mtp=False)
        nll += F.cross_entropy(out.logits[:, :-1].float().reshape(-1, out.logits.shape[-1]),
                               ids[i:i + 4, 1:].reshape(-1), reduction="sum").item()
    ppl = math.exp(nll / (n_seq * (T - 1)))
    res = {"heldout_ppl": ppl}
    for L in (1024, 4096) if n else ():
        correct = 0
        for j in range(n):
            content, answer, _ = s.task_niah(L - 40)
            toks, is_ans = s.chat(content, answer, False)
            prompt = toks[: is_ans.index(1)]
            want = toks[len(prompt):]
            cur = torch.tensor([prompt]).to(DEV)
            for _ in range(len(want)):
                with autocast():
                    out = model(cur, mode=mode, mtp=False)
                nxt = out.logits[0, -1].argmax().item()
                cur = torch.cat([cur, torch.tensor([[nxt]]).to(DEV)], 1)
            correct += cur[0, len(prompt):].tolist() == want
        res[f"passkey_{L}"] = correct / n
    model.train()
    return res


def run_log(out: str, t_start: float):
    """say(d): d with the seconds since t_start, as a JSON line on stdout and appended to out/train.log."""
    os.makedirs(out, exist_ok=True)
    log = open(os.path.join(out, "train.log"), "a")

    def say(d):
        d["t"] = round(time.time() - t_start, 1)
        line = json.dumps(d)
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()
    return say


def load_data(data_dir: str):
    """prepare.py's output → (pieces, train split, heldout split)."""
    data = np.load(os.path.join(data_dir, "data.npz"))
    pieces = tasks.Pieces(os.path.join(data_dir, "pieces.json"))
    return (pieces, tasks.Split(data["train_tokens"], data["train_offsets"]),
            tasks.Split(data["heldout_tokens"], data["heldout_offsets"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, required=True, help="wall-clock budget, data loading included")
    ap.add_argument("--size", default="demo", choices=sorted(SIZES))
    ap.add_argument("--resume", default="")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--tokens-per-step", type=int, default=65536)
    ap.add_argument("--micro-tokens", type=int, default=32768)
    ap.add_argument("--dense-frac", type=float, default=0.35)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--mtp-steps", type=int, default=1,
                    help="MTP draft steps trained (the later ones reuse step 0's KV and top-k, as the engine does)")
    ap.add_argument("--indexer-weight", type=float, default=1.0)
    ap.add_argument("--lengths", default="2048:0.45,4096:0.35,8192:0.2")
    ap.add_argument("--length-order", default="schedule", choices=["schedule", "random"],
                    help="schedule: --lengths in order, each for its share of the time; random: each step draws "
                         "its length with the shares as weights (the whole mix throughout)")
    ap.add_argument("--task-span-log2", type=float, default=4.0,
                    help="a task spans between T / 2^N and T tokens (log-uniform), the rest of the sequence is text")
    ap.add_argument("--passkey-digits", default="",
                    help='digit counts of the tasks\' numbers, "LO:HI" drawn uniformly (default: 10000-999999)')
    ap.add_argument("--index-topk", type=int, default=0, help="override the size's index_topk (0: keep)")
    ap.add_argument("--max-position", type=int, default=1048576)
    ap.add_argument("--ckpt-minutes", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run (fp32, no autocast)")
    ap.add_argument("--mix", default="",
                    help='sample kinds and weights, e.g. "text:0.25,niah:0.2,facts:0.35,multi:0.1,copy:0.1"')
    ap.add_argument("--indexer-only", action="store_true",
                    help="train only the indexers (the rest frozen, dense attention, no LM loss): DSA's warm-up stage")
    ap.add_argument("--kl-all-keys", action="store_true",
                    help="the indexer's KL target is the attention over all causal keys, in sparse mode too")
    ap.add_argument("--indexer-answer-weight", type=float, default=1.0,
                    help="weight of answer positions (relative to 1) in the indexer's KL")
    ap.add_argument("--eval-samples", type=int, default=8)
    a = ap.parse_args()
    global DEV
    DEV = a.device
    t_start = time.time()
    budget = a.minutes * 60
    say = run_log(a.out, t_start)
    torch.manual_seed(a.seed)
    if DEV == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    pieces, train, heldout = load_data(a.data)
    vocab = pieces.vocab_size
    cfg = SIZES[a.size](vocab, pieces.special)
    if a.index_topk:
        cfg.index_topk = a.index_topk
    model = GlmMoeDsa(cfg).to(DEV).train()
    if a.resume:
        model.load_checkpoint_state(export.read_safetensors(a.resume))
    n_params = sum(p.numel() for p in model.parameters())
    lengths = [(int(x.split(":")[0]), float(x.split(":")[1])) for x in a.lengths.split(",")]
    say({"event": "start", "params": n_params, "config": cfg.to_hf(), "args": vars(a),
         "train_tokens": int(train.offsets[-1]), "heldout_tokens": int(heldout.offsets[-1])})

    if a.indexer_only:
        for n, p in model.named_parameters():
            p.requires_grad_(".indexer." in n)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in params if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in params if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), **({"fused": True} if DEV == "cuda" else {}))
    digits = tuple(int(x) for x in a.passkey_digits.split(":")) if a.passkey_digits else None
    sampler = tasks.Sampler(train, pieces, seed=a.seed + 1, task_span_log2=a.task_span_log2, passkey_digits=digits,
                            facts=tasks.Facts.load(a.data))
    if a.mix:
        sampler.set_mix(a.mix)
    batches = Batches(sampler, a.seed + 2, a.max_position)
    ckpt = os.path.join(a.out, "ckpt.safetensors")

    def step_shape(T):  # (micro-batch size, micro-batches per step) at length T
        micro_B = max(a.micro_tokens // T, 1)
        return micro_B, max(a.tokens_per_step // (micro_B * T), 1)

    if a.length_order == "random":
        length_rng = random.Random(a.seed + 3)
        step_T = length_rng.choices([t for t, _ in lengths], [w for _, w in lengths], k=1_000_000)
        batches.follow_plan((step_shape(T)[0], T) for T in step_T for _ in range(step_shape(T)[1]))
    step, tokens, last_ckpt, last_log = 0, 0, time.time(), time.time()
    sums = {}
    while True:
        progress = (time.time() - t_start) / budget
        if progress >= 1.0:
            break
        T = step_T[step] if a.length_order == "random" else length_at(progress, lengths)
        mode = "dense" if progress < a.dense_frac or a.indexer_only else "sparse"
        micro_B, n_micro = step_shape(T)
        batches.set_shape(micro_B, T)
        lr = lr_at(progress, a.lr)
        for g in opt.param_groups:
            g["lr"] = lr
        loads_acc = None
        for _ in range(n_micro):
            ids, w, pos = batches.get(micro_B, T)
            # The indexer's KL weighs the queries that predict answer tokens (position t predicts t+1).
            qw = None
            if a.indexer_answer_weight != 1.0:
                qw = torch.ones_like(w)
                qw[:, :-1] = torch.where(w[:, 1:] > 1.0, a.indexer_answer_weight, 1.0)
            with autocast():
                out = model(ids, mode=mode, mtp=a.mtp_weight > 0 and not a.indexer_only,
                            indexer_loss=a.indexer_weight > 0, positions=pos, kl_all_keys=a.kl_all_keys,
                            query_weights=qw, mtp_steps=a.mtp_steps)
            if a.indexer_only:
                loss, parts = out.indexer_loss, {"indexer": out.indexer_loss.detach()}
            else:
                loss = weighted_ce(out.logits[:, :-1], ids[:, 1:], w[:, 1:])
                parts = {"lm": loss.detach()}
                if out.mtp_logits is not None:
                    mtp = weighted_ce(out.mtp_logits[:, :-1], ids[:, 2:], w[:, 2:])
                    loss = loss + a.mtp_weight * mtp
                    parts["mtp"] = mtp.detach()
                for j, lg in enumerate(out.mtp_step_logits, start=1):
                    mj = weighted_ce(lg[:, :-1], ids[:, 2 + j:], w[:, 2 + j:])
                    loss = loss + a.mtp_weight * mj
                    parts[f"mtp{j + 1}"] = mj.detach()
                if out.indexer_loss is not None:
                    loss = loss + a.indexer_weight * out.indexer_loss
                    parts["indexer"] = out.indexer_loss.detach()
            (loss / n_micro).backward()
            loads = [l.float() for l in out.loads]
            loads_acc = loads if loads_acc is None else [x + y for x, y in zip(loads_acc, loads)]
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + v
            sums["n"] = sums.get("n", 0) + 1
        gn = torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if not a.indexer_only:
            model.update_router_bias(loads_acc)
        step += 1
        tokens += n_micro * micro_B * T
        if time.time() - last_log > 20 or step == 1:
            n = sums.pop("n")
            rec = {k: round(float(v) / n, 4) for k, v in sums.items()}
            sums = {}
            imb = max((l.max() / l.mean()).item() for l in loads_acc)
            say({"step": step, "tokens": tokens, "T": T, "mode": mode, "lr": round(lr, 6), "gnorm": round(gn.item(), 3),
                 "expert_max_over_mean": round(imb, 2), **rec,
                 "tok_per_s": round(tokens / (time.time() - t_start))})
            last_log = time.time()
        if time.time() - last_ckpt > a.ckpt_minutes * 60:
            save_ckpt(model, ckpt, step)
            save_export(model, a.out)
            last_ckpt = time.time()
            say({"event": "ckpt", "step": step})
    save_ckpt(model, ckpt, step)
    save_export(model, a.out)
    say({"event": "done", "step": step, "tokens": tokens})
    for mode in ("dense", "sparse"):
        say({"event": "eval", "mode": mode, **evaluate(model, heldout, pieces, mode=mode, n=a.eval_samples,
                                                       T=min(2048, lengths[0][0]), n_seq=4 if DEV == "cpu" else 16)})
    say({"event": "exit"})


if __name__ == "__main__":
    main()
