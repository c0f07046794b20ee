#!/usr/bin/env python3
"""The reference the shipped model's test compares megactx with: model.py's fp32 logits on the committed
checkpoint (models/glm-demo) for a window of held-out text.

Writes OUT/tokens.json ({"token_ids": [...], "positions": [...], "mtp_row": r, "mtp_steps": S}),
OUT/ref_logits.npy (float32, [len(positions), vocab]: the logits at those positions only, so the file stays
small) and OUT/ref_mtp_chain_logits.npy ([S, vocab]: the MTP layer's draft steps 0..S-1 at row r, as the
engine's draft loop runs them, step j >= 1 over step 0's KV and top-k). The window is
index_topk tokens long by default: every key is then selected, because the trained indexers' ReLU scores are
exactly 0 for many keys and exact ties at the top-k boundary have no specified order (model-spec §9); the sparse
selection itself is checked on the random fixtures, and on this model end to end by the NIAH test. The window
is the first, from --start on, whose router choices have no near-ties (check.py's worst_gaps), so that fp32
rounding cannot flip an expert choice between model.py and megactx.

Usage: ship_reference.py --model models/glm-demo --data build-train/data --out tests/data/glm_demo_ref
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
from check import GAP, worst_gaps  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="prepare.py's directory (data.npz: the held-out tokens)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=0, help="sequence length (default: index_topk)")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--mtp-steps", type=int, default=3, help="MTP draft steps in the chain reference")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = export.load(a.model).eval()
    held = np.load(os.path.join(a.data, "data.npz"))["heldout_tokens"]
    T = a.tokens or model.cfg.index_topk
    for start in range(a.start, len(held) - T, T):
        tokens = [int(t) for t in held[start: start + T]]
        gaps = worst_gaps(model, tokens)
        print(f"held-out tokens {start}..{start + T}: worst gaps indexer {gaps['indexer']:.2e} "
              f"router {gaps['router']:.2e}")
        if gaps["router"] > GAP and (T <= model.cfg.index_topk or gaps["indexer"] > GAP):
            break
    else:
        raise SystemExit("no window without near-ties")
    with torch.no_grad():
        out = model(torch.tensor([tokens]), mode="sparse", mtp=True, mtp_steps=a.mtp_steps)
    logits = out.logits[0].float()
    # The MTP draft chain at one row r: step j reads token r+1+j (the window's own tokens stand for the drafts)
    # and predicts r+2+j; the last row whose chain has all its input tokens in the window.
    r = T - 1 - a.mtp_steps
    chain = [out.mtp_logits[0, r]] + [lg[0, r] for lg in out.mtp_step_logits]
    positions = sorted(set(list(range(0, T, 23)) + list(range(T - 4, T))))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokens.json"), "w") as f:
        json.dump({"token_ids": tokens, "positions": positions, "heldout_start": start, "mtp_row": r,
                   "mtp_steps": a.mtp_steps}, f)
    np.save(os.path.join(a.out, "ref_logits.npy"), logits[positions].numpy())
    np.save(os.path.join(a.out, "ref_mtp_chain_logits.npy"), torch.stack(chain).float().numpy())
    print(f"wrote {a.out}: {T} tokens, logits at {len(positions)} positions, max |logit| "
          f"{logits.abs().max().item():.3f}")


if __name__ == "__main__":
    main()
