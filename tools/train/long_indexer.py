#!/usr/bin/env python3
"""Fits a trained model's indexers to its own attention at long context (64K-1M tokens), the rest frozen.

Why: train.py trains at up to 32K tokens, where each query's top-k (512) is chosen among at most 32K keys; at 1M
there are 32 times more candidates and the needle of a retrieval prompt falls out of the top-k. Training the whole
model at 1M is out of reach (the sparse mask and the indexer's score matrix are T x T), but the indexer alone is
cheap to train there:
  - the frozen model runs once per sequence in sparse mode, as megactx runs it (each full layer's top-k chosen a
    chunk of query rows at a time, every layer attending to its group's selected keys), without gradients,
    keeping every full layer's indexer inputs and every layer's attention keys. (Not dense mode: the model was
    trained dense only at 2K-4K, and at 32K its dense attention no longer finds the needle, measured with
    --probe: 0 of 18 passkey digits right, so dense attention is no teacher there);
  - the KL of train.py's --kl-all-keys (the main attention over all causal keys, summed over heads and over the
    layers that share the indexer's selection, as the target of the indexer's softmax) is taken only at a few
    hundred query rows: every row that predicts an answer token (weighted up, as --indexer-answer-weight) and a
    random sample of the others, each against all of its causal keys ([rows, T] scores instead of [T, T]);
  - with --retrieval-weight (the shipped model's recipe), the last full layer's indexer is also fitted to the
    answer's source in the prompt (answer_source: the needle sentence) at the answer rows. At 128K-512K the main
    attention over all keys does not favour the needle either, so the KL alone changed nothing there
    (docs/demo-model.md, "Beyond the training length").
The MTP layer's indexer is left as it is (it serves drafting, not retrieval).

--probe measures what matters before and after: on seeded passkey prompts at each probe length, the share of the
needle's tokens in each full layer's top-k at the rows that predict the passkey's digits, and the model's
teacher-forced accuracy on those digits.

Usage (the GPU machine; tools/train/gpu.sh long runs it in the background like train.py):
  long_indexer.py --data DIR --model DIR --out DIR --minutes M [--lengths 131072:0.5,262144:0.5] [--probe ...]
Writes --out/train.log (JSON lines) and --out/export/ (the bf16 model directory, every --ckpt-minutes and at the
end), as train.py does.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
import tasks  # noqa: E402
import train  # noqa: E402
from model import MoE, apply_rope, rope_tables  # noqa: E402

DEV = "cuda"


@torch.no_grad()
def select_topk(idx, xn, q_lat, cos, sin, topk, chunk=512):
    """model.Indexer.forward then select(), a chunk of query rows at a time against the causal keys only, so that
    no [T, T] tensor exists: (key indices [T, k] int64, valid [T, k] bool: the key is causal). Rows with fewer
    than k causal keys keep all of them (the rest of their k slots are invalid)."""
    T = xn.shape[1]
    r = idx.rope_dim
    q = idx.wq_b(q_lat).view(1, T, idx.n_heads, idx.head_dim)
    q = torch.cat([apply_rope(q[..., :r], cos, sin), q[..., r:]], dim=-1)[0]            # [T, HI, DI]
    k = idx.k_norm(idx.wk(xn))
    k = torch.cat([apply_rope(k[..., :r], cos, sin), k[..., r:]], dim=-1)[0]            # [T, DI]
    w = (idx.weights_proj(xn).float() * idx.n_heads ** -0.5)[0]                          # [T, HI]
    kk = min(topk, T)
    chunk = max(chunk, kk)
    sel = torch.empty(T, kk, dtype=torch.int64, device=xn.device)
    for r0 in range(0, T, chunk):
        r1 = min(T, r0 + chunk)
        n = max(r1, kk)
        qk = torch.einsum("chd,td->cht", q[r0:r1], k[:n]) * idx.head_dim ** -0.5        # [c, HI, n]
        sc = torch.einsum("cht,ch->ct", F.relu(qk), w[r0:r1].to(qk.dtype)).float()
        rows = torch.arange(r0, r1, device=xn.device)
        sc = sc.masked_fill(torch.arange(n, device=xn.device)[None, :] > rows[:, None], float("-inf"))
        sel[r0:r1] = sc.topk(kk, dim=-1, sorted=False).indices
    valid = sel <= torch.arange(T, device=xn.device)[:, None]
    return sel, valid


@torch.no_grad()
def sparse_attention(att, xn, cos, sin, sel, valid, chunk=1024):
    """MLA (model.Attention, MHA form) where each query attends to its selected keys only, a chunk of rows at a
    time: (output [1, T, D], q [T, NH, d], k [T, NH, d])."""
    c = att.cfg
    T = xn.shape[1]
    nh, dn, dr, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
    q_lat = att.q_a_layernorm(att.q_a_proj(xn))
    q = att.q_b_proj(q_lat).view(1, T, nh, dn + dr)
    q = torch.cat([q[..., :dn], apply_rope(q[..., dn:], cos, sin)], dim=-1)[0]           # [T, NH, dqk]
    kv = att.kv_a_proj_with_mqa(xn)
    c_kv = att.kv_a_layernorm(kv[..., : c.kv_lora_rank])
    k_pe = apply_rope(kv[..., c.kv_lora_rank:], cos, sin)
    kvb = att.kv_b_proj(c_kv).view(1, T, nh, dn + dv)
    k = torch.cat([kvb[..., :dn], k_pe[:, :, None, :].expand(1, T, nh, dr)], dim=-1)[0]   # [T, NH, dqk]
    v = kvb[0, :, :, dn:]                                                                # [T, NH, dv]
    o = torch.empty(T, nh, dv, dtype=v.dtype, device=xn.device)
    for r0 in range(0, T, chunk):
        r1 = min(T, r0 + chunk)
        s_ = sel[r0:r1]
        logits = torch.einsum("cnd,cknd->cnk", q[r0:r1], k[s_]).float() * att.scale      # [c, NH, k]
        pr = logits.masked_fill(~valid[r0:r1, None, :], float("-inf")).softmax(-1)
        o[r0:r1] = torch.einsum("cnk,cknd->cnd", pr.to(v.dtype), v[s_])
    return att.o_proj(o.reshape(1, T, nh * dv)), q, k


@torch.no_grad()
def capture(model, ids, pos, rows, topk):
    """The frozen model over ids [1, T] in sparse mode (DSA with IndexShare, as megactx runs it). Returns
    (groups, logits at rows [R, V], cos, sin); a group per full layer: its indexer, the layer's attention input
    xn [1, T, D], q_lat at the rows [1, R, q_lora], and (q at the rows [1, NH, R, d], k [1, NH, T, d]) of every
    layer that uses the group's selection."""
    c = model.cfg
    cos, sin = rope_tables(pos, c.qk_rope_head_dim, c.rope_theta)
    x = model.model.embed_tokens(ids)
    groups, sel, valid = [], None, None
    for i in range(c.num_hidden_layers):
        layer = model.model.layers[i]
        att = layer.self_attn
        xn = layer.input_layernorm(x)
        if att.indexer is not None:
            q_lat = att.q_a_layernorm(att.q_a_proj(xn))
            sel, valid = select_topk(att.indexer, xn, q_lat, cos, sin, topk)
            groups.append({"layer": i, "indexer": att.indexer, "xn": xn, "q_lat": q_lat[:, rows], "qk": [],
                           "sel": sel[rows], "valid": valid[rows]})
        a, q, k = sparse_attention(att, xn, cos, sin, sel, valid)
        groups[-1]["qk"].append((q[rows].transpose(0, 1)[None].contiguous(), k.transpose(0, 1)[None]))
        x = x + a
        h = layer.post_attention_layernorm(x)
        x = x + (layer.mlp(h)[0] if isinstance(layer.mlp, MoE) else layer.mlp(h))
    logits = model.lm_head(model.model.norm(x[:, rows]))[0]
    return groups, logits, cos, sin


def row_scores(idx, xn, q_lat, cos, sin, rows):
    """The indexer's scores (model.Indexer.forward) at the query rows only: [R, T], -inf after each row."""
    T, R = xn.shape[1], rows.numel()
    r = idx.rope_dim
    q = idx.wq_b(q_lat).view(1, R, idx.n_heads, idx.head_dim)
    q = torch.cat([apply_rope(q[..., :r], cos[rows], sin[rows]), q[..., r:]], dim=-1)
    k = idx.k_norm(idx.wk(xn))
    k = torch.cat([apply_rope(k[..., :r], cos, sin), k[..., r:]], dim=-1)
    w = idx.weights_proj(xn[:, rows]).float() * idx.n_heads ** -0.5                 # [1, R, HI]
    qk = torch.einsum("brhd,btd->brht", q, k) * idx.head_dim ** -0.5                  # [1, R, HI, T]
    scores = torch.einsum("brht,brh->brt", F.relu(qk), w.to(qk.dtype)).float()[0]  # [R, T]
    causal = torch.arange(T, device=xn.device)[None, :] <= rows[:, None]
    return scores.masked_fill(~causal, float("-inf")), causal


@torch.no_grad()
def row_target(qks, rows, T, scale, chunk=32):
    """The main attention's distribution at the rows over all causal keys, summed over heads and layers,
    normalised: [R, T] fp32 (model.kl_to_attention's p, at some rows)."""
    R = rows.numel()
    p = torch.zeros(R, T, dtype=torch.float32, device=rows.device)
    keys = torch.arange(T, device=rows.device)
    for r0 in range(0, R, chunk):
        r1 = min(R, r0 + chunk)
        causal = keys[None, :] <= rows[r0:r1, None]
        for q, k in qks:
            s = (q[0, :, r0:r1] @ k[0].transpose(-1, -2)).float() * scale             # [NH, c, T]
            p[r0:r1] += s.masked_fill(~causal, float("-inf")).softmax(-1).sum(0)
    return p / p.sum(-1, keepdim=True)


def kl_rows(scores, causal, p, weights):
    logq = scores.log_softmax(-1).masked_fill(~causal, 0.0)
    kl = (torch.xlogy(p, p) - p * logq).sum(-1)
    return (kl * weights).sum() / weights.sum()


def find(seq: list, sub: list) -> int:
    """First index of the token list sub in seq (-1 if absent)."""
    a = np.asarray(seq)
    n = len(sub)
    for i in np.flatnonzero(a[: len(a) - n + 1] == sub[0]):
        if a[i: i + n].tolist() == sub:
            return int(i)
    return -1


def niah_sample(sampler: tasks.Sampler, T: int):
    """A passkey prompt of about T tokens with its answer: (tokens, answer rows [positions predicting an answer
    digit], the needle sentence's span (start, end), its digits' span)."""
    P = sampler.p
    content, answer, _ = sampler.task_niah(T - 40)
    toks, is_ans = sampler.chat(content, answer, False)
    start = is_ans.index(1)
    n_tok = len(answer) - len(P["niah_needle"]) - len(P["period"])       # the number's tokens
    digits = start + len(P["niah_needle"])                               # first digit token of the answer
    rows = list(range(digits - 1, digits - 1 + n_tok))                   # rows that predict the digits
    said = answer[: len(answer) - len(P["period"])]                      # "The passkey is N"
    at = find(toks[:start], said)                                        # the needle: said + ".\n"
    assert at >= 0
    return toks, rows, (at, at + len(said) + len(P["period_nl"])), (at + len(P["niah_needle"]), at + len(said))


@torch.no_grad()
def probe(model, sampler_seed, text, pieces, lengths, n, topk, say=None):
    """Per length, at the rows that predict the passkey's digits, in each full layer's top-k: the share of the
    needle sentence's tokens (needle), of its digit tokens (digits) and the share of rows that hold every digit
    token (all_digits); and the sparse model's teacher-forced digit accuracy."""
    out = []
    for T in lengths:
        s = tasks.Sampler(text, pieces, seed=sampler_seed + T)
        rec = {"T": T, "n": n, "digit_acc": 0.0}
        per = {}
        for _ in range(n):
            toks, rows, (a, b), (da, db) = niah_sample(s, T)
            ids = torch.tensor([toks], device=DEV)
            pos = torch.arange(len(toks), device=DEV)
            rws = torch.tensor(rows, device=DEV)
            with train.autocast():
                groups, logits, cos, sin = capture(model, ids, pos, rws, topk)
                for g in groups:
                    top = g["sel"].masked_fill(~g["valid"], -1)                         # [R, k]
                    hit = ((top >= a) & (top < b)).sum(-1).float() / (b - a)            # [R]
                    dig = ((top >= da) & (top < db)).sum(-1).float() / (db - da)
                    d = per.setdefault(g["layer"], {"needle": 0.0, "digits": 0.0, "all_digits": 0.0})
                    d["needle"] += hit.mean().item() / n
                    d["digits"] += dig.mean().item() / n
                    d["all_digits"] += (dig == 1).float().mean().item() / n
            want = torch.tensor([toks[r + 1] for r in rows], device=DEV)
            rec["digit_acc"] += (logits.argmax(-1) == want).float().mean().item() / n
            del groups
        rec["layers"] = {f"L{k}": {kk: round(vv, 3) for kk, vv in v.items()} for k, v in per.items()}
        rec["digit_acc"] = round(rec["digit_acc"], 3)
        out.append(rec)
        if say is not None:
            say({"event": "probe_length", **rec})
    return out


def answer_source(toks: list, ans: list, longest: int = 16, shortest: int = 5):
    """Where the answer comes from: the longest suffix (at most `longest` tokens) of the answer without its last
    two tokens (the period and the end of turn) that occurs in the prompt, as (start, end), or None. For the
    passkey tasks that is the needle sentence without its period ("The passkey for Ann is 123456")."""
    if not ans:
        return None
    first, last = ans[0] + 1, ans[-1] + 1                  # the answer's tokens are toks[first..last]
    core = toks[first: last - 1]
    for n in range(min(longest, len(core)), shortest - 1, -1):
        at = find(toks[: first], core[len(core) - n:])
        if at >= 0:
            return at, at + n
    return None


def train_sample(sampler: tasks.Sampler, rng: random.Random, T: int, n_random: int, answer_weight: float):
    """A long training sequence (a retrieval task over the whole length, the rest text), its KL rows (every row
    that predicts an answer token, weight answer_weight, and n_random other rows, weight 1) and the answer's
    source in the prompt (answer_source) or None."""
    toks, w = sampler.sequence(T)
    ans = np.flatnonzero(w[1:] > 1.0).tolist()
    others = sorted(set(rng.randrange(T // 16, T) for _ in range(n_random)) - set(ans))
    rows = ans + others
    weights = [answer_weight] * len(ans) + [1.0] * len(others)
    return toks, rows, weights, answer_source(toks.tolist(), ans)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True, help="the model directory to start from")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, required=True, help="training time (probes not counted)")
    ap.add_argument("--lengths", default="65536:0.2,131072:0.3,262144:0.3,524288:0.15,1048576:0.05",
                    help="T:weight, drawn per sequence")
    ap.add_argument("--mix", default="niah:0.35,multi:0.3,var:0.25,text:0.1")
    ap.add_argument("--task-span-log2", type=float, default=1.0)
    ap.add_argument("--random-rows", type=int, default=192)
    ap.add_argument("--answer-weight", type=float, default=50.0)
    ap.add_argument("--retrieval-weight", type=float, default=0.0,
                    help="weight of the last full layer's indexer likelihood of the answer's source at the answer "
                         "rows (the needle of a passkey task), added to the KL")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--accum", type=int, default=2, help="sequences per optimizer step")
    ap.add_argument("--pose", type=float, default=0.3,
                    help="share of sequences whose positions get random skips up to --max-position")
    ap.add_argument("--max-position", type=int, default=1048576)
    ap.add_argument("--probe", default="32768,131072,262144,1048576")
    ap.add_argument("--probe-samples", type=int, default=3)
    ap.add_argument("--ckpt-minutes", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    global DEV
    DEV = train.DEV = a.device
    say = train.run_log(a.out, time.time())
    torch.manual_seed(a.seed)
    if DEV == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    pieces, text, _ = train.load_data(a.data)
    model = export.load(a.model, DEV).eval()
    for n, p in model.named_parameters():
        p.requires_grad_(".indexer." in n and not n.startswith(f"model.layers.{model.cfg.num_hidden_layers}."))
    params = [p for p in model.parameters() if p.requires_grad]
    say({"event": "start", "args": vars(a), "indexer_params": sum(p.numel() for p in params)})
    probe_lengths = [int(x) for x in a.probe.split(",")] if a.probe else []
    topk = model.cfg.index_topk
    if probe_lengths:
        say({"event": "probe", "when": "before",
             "results": probe(model, 9000, text, pieces, probe_lengths, a.probe_samples, topk, say)})

    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sampler = tasks.Sampler(text, pieces, seed=a.seed + 1, task_span_log2=a.task_span_log2,
                            facts=tasks.Facts.load(a.data))
    sampler.set_mix(a.mix)
    rng = random.Random(a.seed + 2)
    lengths = [(int(x.split(":")[0]), float(x.split(":")[1])) for x in a.lengths.split(",")]
    scale = model.cfg.qk_head_dim ** -0.5
    budget, t_train = a.minutes * 60, time.time()
    step, seqs, tokens, last_log, last_ckpt, sums = 0, 0, 0, time.time(), time.time(), {}
    while (time.time() - t_train) < budget:
        progress = (time.time() - t_train) / budget
        lr = a.lr * min(1.0, progress / 0.03) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        for _ in range(a.accum):
            T = rng.choices([t for t, _ in lengths], [w for _, w in lengths])[0]
            toks, rows, weights, source = train_sample(sampler, rng, T, a.random_rows, a.answer_weight)
            pos = tasks.pose_positions(rng, T, a.max_position, p_skip=a.pose)
            ids = torch.from_numpy(toks)[None].to(DEV)
            pos = torch.from_numpy(pos).to(DEV)
            rws = torch.tensor(rows, device=DEV)
            wts = torch.tensor(weights, device=DEV)
            ans = wts > 1.0
            with train.autocast():
                groups, _, cos, sin = capture(model, ids, pos, rws, topk)
                loss = 0.0
                for g in groups:
                    p = row_target(g["qk"], rws, T, scale)
                    sc, causal = row_scores(g["indexer"], g["xn"], g["q_lat"], cos, sin, rws)
                    kl = kl_rows(sc, causal, p, wts)
                    loss = loss + kl / len(groups)
                    sums["kl"] = sums.get("kl", 0.0) + kl.item() / len(groups)
                    if source is not None and a.retrieval_weight > 0 and g is groups[-1]:
                        # The answer rows' indexer mass on the answer's source (the needle), as a likelihood.
                        logq = sc[ans].log_softmax(-1)
                        ret = -logq[:, source[0]:source[1]].logsumexp(-1).mean()
                        loss = loss + a.retrieval_weight * ret
                        sums["retrieval"] = sums.get("retrieval", 0.0) + ret.item()
                        sums["retrieval_n"] = sums.get("retrieval_n", 0) + 1
                    with torch.no_grad():  # the answer rows' own KL, and their target's mass in the top-k
                        if ans.any():
                            top = sc[ans].topk(min(topk, T), dim=-1).indices
                            covered = p[ans].gather(-1, top).sum(-1).mean().item()
                            sums[f"L{g['layer']}_answer_mass_in_topk"] = \
                                sums.get(f"L{g['layer']}_answer_mass_in_topk", 0.0) + covered
                            sums[f"L{g['layer']}_answer_n"] = sums.get(f"L{g['layer']}_answer_n", 0) + 1
            (loss / a.accum).backward()
            del groups
            sums["n"] = sums.get("n", 0) + 1
            seqs += 1
            tokens += T
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if time.time() - last_log > 30 or step == 1:
            rec = {"step": step, "seqs": seqs, "tokens": tokens, "lr": round(lr, 6), "gnorm": round(gn.item(), 3),
                   "kl": round(sums["kl"] / sums["n"], 4), "tok_per_s": round(tokens / (time.time() - t_train))}
            if sums.get("retrieval_n"):
                rec["retrieval"] = round(sums["retrieval"] / sums["retrieval_n"], 4)
            for k in [k for k in sums if k.endswith("_mass_in_topk")]:
                n = sums[k.replace("_mass_in_topk", "_n")]
                rec[k] = round(sums[k] / n, 3)
            say(rec)
            sums, last_log = {}, time.time()
        if time.time() - last_ckpt > a.ckpt_minutes * 60:
            train.save_export(model, a.out)
            last_ckpt = time.time()
            say({"event": "ckpt", "step": step})
    train.save_export(model, a.out)
    say({"event": "done", "step": step, "seqs": seqs, "tokens": tokens})
    if probe_lengths:
        say({"event": "probe", "when": "after",
             "results": probe(model, 9000, text, pieces, probe_lengths, a.probe_samples, topk, say)})
    say({"event": "exit"})


if __name__ == "__main__":
    main()
