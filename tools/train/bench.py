#!/usr/bin/env python3
"""Training throughput of model.py on one GPU: tokens/s of a full step (forward + backward + fused AdamW +
router-bias update) under bf16 autocast with fp32 weights, on random tokens.

Every step computes the three losses a training run uses: next-token CE, the MTP CE (token t+2) and the
indexer's KL loss. Sizes: "100m" (vocab 32768, hidden 512, 8 layers, 16 experts top-2) and "15m" (vocab
16384, hidden 256, 4 layers, 8 experts top-2); contexts 2K and 8K at 32K tokens a step; attention dense or
sparse (top-512); eager or with compile_layers().

Usage: python3 tools/train/bench.py [--deadline SECONDS] [--only SIZE] [--compiled-only | --eager-only]
"""
import argparse
import statistics
import sys
import time
import os

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, GlmMoeDsa, GroupedExperts  # noqa: E402

SIZES = {
    "100m": Config(vocab_size=32768, hidden_size=512, intermediate_size=1536, moe_intermediate_size=256,
                   num_hidden_layers=8, num_attention_heads=8, q_lora_rank=256, kv_lora_rank=128,
                   qk_nope_head_dim=48, qk_rope_head_dim=16, v_head_dim=64, n_routed_experts=16,
                   num_experts_per_tok=2, n_shared_experts=1, index_n_heads=4, index_head_dim=64, index_topk=512,
                   indexer_types=["full", "shared", "shared", "shared"] * 2, first_k_dense_replace=1,
                   max_position_embeddings=16384),
    "15m": Config(vocab_size=16384, hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
                  num_hidden_layers=4, num_attention_heads=4, q_lora_rank=128, kv_lora_rank=64,
                  qk_nope_head_dim=48, qk_rope_head_dim=16, v_head_dim=64, n_routed_experts=8,
                  num_experts_per_tok=2, n_shared_experts=1, index_n_heads=4, index_head_dim=32, index_topk=512,
                  indexer_types=["full", "shared", "shared", "shared"], first_k_dense_replace=1,
                  max_position_embeddings=16384),
}
TOKENS_PER_STEP = 32768


def probe_grouped_mm():
    """Grouped-GEMM experts must run forward and backward here; otherwise fall back to the loop."""
    from model import GroupedExperts as G
    try:
        g = G(4, 64, 32).cuda()
        xs = torch.randn(40, 64, device="cuda", requires_grad=True)
        counts = torch.tensor([10, 0, 20, 10], device="cuda")
        expert = torch.repeat_interleave(torch.arange(4, device="cuda"), counts)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = g(xs, expert, counts)
        y.float().sum().backward()
        G.use_grouped_mm = False
        ref = g(xs.detach(), expert, counts)
        G.use_grouped_mm = True
        err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
        print(f"grouped-GEMM experts: forward+backward ok, rel diff vs fp32 loop {err:.2e}")
        return err < 3e-2
    except Exception as e:  # noqa: BLE001
        G.use_grouped_mm = False
        print(f"grouped-GEMM experts unavailable ({type(e).__name__}: {e}); using the per-expert loop")
        return False


def run(size, T, mode, compiled, steps=8, warmup=2):
    cfg = SIZES[size]
    B = TOKENS_PER_STEP // T
    torch.manual_seed(0)
    model = GlmMoeDsa(cfg).cuda().train()
    n_params = sum(p.numel() for p in model.parameters())
    if compiled:
        model.compile_layers()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    ids = [torch.randint(0, cfg.vocab_size, (B, T), device="cuda") for _ in range(2)]
    torch.cuda.reset_peak_memory_stats()

    def step(i):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, parts, out = model.loss(ids[i % 2], mode=mode)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.update_router_bias(out.loads)
        return parts

    t0 = time.time()
    for i in range(warmup):
        parts = step(i)
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    times = []
    for i in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        parts = step(i)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1000)
    med = statistics.median(times)
    res = dict(size=size, params_m=n_params / 1e6, T=T, B=B, mode=mode, compiled=compiled, step_ms=med * 1000,
               spread_ms=(max(times) - min(times)) * 1000, tok_s=B * T / med, warm_s=warm_s,
               peak_gib=torch.cuda.max_memory_allocated() / 2**30,
               loss=" ".join(f"{k}={v.item():.3f}" for k, v in parts.items()))
    del model, opt
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deadline", type=float, default=540.0, help="stop starting new configs after this many s")
    ap.add_argument("--only", default=None)
    ap.add_argument("--compiled-only", action="store_true")
    ap.add_argument("--eager-only", action="store_true")
    args = ap.parse_args()
    start = time.time()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {TOKENS_PER_STEP} tokens a step, "
          f"bf16 autocast, fused AdamW")
    probe_grouped_mm()
    compiled_opts = [False, True]
    if args.compiled_only:
        compiled_opts = [True]
    if args.eager_only:
        compiled_opts = [False]
    rows = []
    for compiled in compiled_opts:
        # Compiling costs tens of seconds a config: the size that matters for training comes first.
        sizes = [args.only] if args.only else (["100m", "15m"] if compiled else ["15m", "100m"])
        for size in sizes:
            for T in (2048, 8192):
                for mode in ("dense", "sparse"):
                    if time.time() - start > args.deadline:
                        print(f"skipped (deadline): {size} T={T} {mode} compiled={compiled}")
                        continue
                    torch._dynamo.reset()
                    try:
                        r = run(size, T, mode, compiled)
                    except Exception as e:  # noqa: BLE001
                        print(f"FAILED {size} T={T} {mode} compiled={compiled}: {type(e).__name__}: {e}")
                        torch.cuda.empty_cache()
                        continue
                    rows.append(r)
                    print("{size} ({params_m:.1f}M) T={T} B={B} {mode} compiled={compiled}: {step_ms:.1f} ms/step "
                          "(spread {spread_ms:.1f}), {tok_s:,.0f} tok/s, warm-up {warm_s:.1f} s, peak "
                          "{peak_gib:.1f} GiB, {loss}".format(**r), flush=True)
    print("\n| size | params | context | batch | attention | compile | ms/step | tokens/s | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| {size} | {params_m:.1f}M | {T} | {B} | {mode} | {c} | {step_ms:.1f} | {tok_s:,.0f} | "
              "{peak_gib:.1f} |".format(c="yes" if r["compiled"] else "no", **r))


if __name__ == "__main__":
    main()
