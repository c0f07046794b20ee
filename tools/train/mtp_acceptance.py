#!/usr/bin/env python3
"""Greedy acceptance of the MTP layer's one-step draft (k = 1) on held-out text, with model.py (fp32, CPU or GPU).

At position t the MTP layer sees h_t and token t+1 and guesses token t+2. In greedy speculative decoding token t+1
is the target's own choice, so only positions where the text's token t+1 equals the target's argmax count; there
the draft is accepted iff it equals the target's argmax at t+1. Attention is the model's sparse DSA.

Usage: mtp_acceptance.py MODEL_DIR --data build-train/data [--n 4] [--T 1024]
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
import tasks  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--data", default="build-train/data")
    ap.add_argument("--n", type=int, default=4, help="held-out sequences")
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=77)
    a = ap.parse_args()
    d = np.load(os.path.join(a.data, "data.npz"))
    held = tasks.Split(d["heldout_tokens"], d["heldout_offsets"])
    sampler = tasks.Sampler(held, tasks.Pieces(os.path.join(a.data, "pieces.json")), seed=a.seed)
    model = export.load(a.model).float().eval()
    accepted = counted = 0
    for _ in range(a.n):
        ids = torch.tensor([sampler.fill_text(a.T)])
        with torch.no_grad():
            out = model(ids, mode="sparse", mtp=True)
        main_next = out.logits[0].argmax(-1)     # [T]: the target's greedy token t+1
        draft = out.mtp_logits[0].argmax(-1)     # [T-1]: the draft of token t+2
        T = ids.shape[1]
        on_greedy = ids[0, 1:T - 1] == main_next[:T - 2]
        accepted += ((draft[:T - 2] == main_next[1:T - 1]) & on_greedy).sum().item()
        counted += on_greedy.sum().item()
    print(f"{a.model}: MTP k=1 greedy acceptance {accepted}/{counted} = {accepted / max(counted, 1):.3f} "
          f"({a.n} held-out sequences of {a.T} tokens)")


if __name__ == "__main__":
    main()
