#!/usr/bin/env python3
"""model.py against transformers 5.17's GlmMoeDsaForCausalLM, and the fixture that checks megactx against model.py.

Runs on the GPU machine (torch + transformers; the comparisons themselves run on the CPU in fp32):

1. model.py on tools/reference/make_fixtures.py's F32 and BF16 checkpoints equals the transformers outputs
   stored with them (logits, final hidden state, MTP logits and hidden state; no transformers needed).
2. For each case (the committed fixture's config, and make_fixtures.py's BASE with IndexShare FSSSFSSS), random
   weights (randomised norms, k_norm bias and selection bias too, so those paths count), rounded to the
   dtype the checkpoint stores. Token sequences are redrawn until every indexer and router top-k boundary
   has a relative gap above 2e-4 in model.py's own scores, so rounding cannot flip a selection.
3. export.save() writes the checkpoint; transformers loads it with from_pretrained (fp32, eager); its logits
   must equal model.py's sparse-mode logits within 1e-4 of max |logit|. The MTP reference is built from
   transformers modules as tools/reference/make_fixtures.py does (transformers has no MTP).
4. Dense mode equals sparse mode on a sequence no longer than index_topk (every key selected).
5. With a GPU: model.py on the GPU in fp32 equals the CPU; bf16 autocast with grouped-GEMM experts equals the
   per-expert loop (forward and gradients), within bf16 rounding.
6. The fixture directory OUT/train_model_bf16: the exported checkpoint + tokens.json + model.py's outputs as
   ref_logits.npy, ref_hidden.npy, mtp_ref_logits.npy, mtp_ref_hidden.npy (the layout of tests/fixtures/).

Usage: python3 tools/train/check.py OUT_DIR [FIXTURES_DIR (default tests/fixtures)]
"""
import copy
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export  # noqa: E402
from model import Config, GlmMoeDsa, GroupedExperts, MoE  # noqa: E402

GAP = 2e-4

# The committed fixture: BASE's shape family, smaller so the checkpoint stays under 1 MB; two full indexers
# (IndexShare FSSSFS), one dense layer then MoE, qk head dim ≠ v head dim, the MTP layer, BF16 weights.
FIXTURE = Config(
    vocab_size=128, hidden_size=48, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=6,
    num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
    v_head_dim=24, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=2.5,
    index_n_heads=8, index_head_dim=32, index_topk=8, indexer_types=["full", "shared", "shared", "shared", "full",
                                                                        "shared"],
    first_k_dense_replace=1, rope_theta=8000000.0, max_position_embeddings=4096, num_nextn_predict_layers=1)

# make_fixtures.py's BASE (hidden 64, 8 layers, 3 dense), IndexShare one full layer in four; F32, not committed.
BASE = Config(indexer_types=["full", "shared", "shared", "shared"] * 2)

CASES = {"train_model_bf16": (FIXTURE, "bf16", 72), "base_fsss_f32": (BASE, "f32", 80)}


def randomize(model: GlmMoeDsa, seed: int, dtype: str):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            if dtype == "bf16":
                p.copy_(p.bfloat16().float())  # the values the checkpoint will hold
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


def worst_gaps(model: GlmMoeDsa, tokens):
    """Smallest top-k boundary gap of every indexer row (relative) and every router row (absolute)."""
    taps = {}
    with torch.no_grad():
        model(torch.tensor([tokens]), mode="sparse", taps=taps)
    cfg, worst = model.cfg, {"indexer": float("inf"), "router": float("inf")}
    for name, t in taps.items():
        if name.endswith("index_scores"):
            s = t[0]
            k = cfg.index_topk
            for p in range(k, s.shape[0]):  # rows with more than k candidates
                row = torch.sort(s[p, : p + 1], descending=True).values
                gap = (row[k - 1] - row[k]).item() / (1.0 + row.abs().max().item())
                worst["indexer"] = min(worst["indexer"], gap)
        elif name.endswith("router_choice"):
            c = torch.sort(t, dim=-1, descending=True).values
            k = cfg.num_experts_per_tok
            worst["router"] = min(worst["router"], (c[:, k - 1] - c[:, k]).min().item())
    return worst


def draw_tokens(model, T, seed):
    rng = np.random.default_rng(seed)
    for attempt in range(500):
        tokens = [int(t) for t in rng.integers(2, model.cfg.vocab_size, size=T)]
        w = worst_gaps(model, tokens)
        if w["indexer"] > GAP and w["router"] > GAP:
            return tokens, attempt, w
    raise SystemExit("no token sequence without near-ties found")


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def transformers_reference(ckpt_dir, model: GlmMoeDsa, tokens):
    """Logits from from_pretrained(ckpt_dir) and MTP outputs from transformers modules (make_fixtures.py)."""
    sys.path.insert(0, os.path.join(HERE, "..", "reference"))
    import make_fixtures as mf
    from transformers import GlmMoeDsaForCausalLM

    c = model.cfg
    # no_grad: make_mtp initialises its modules in place, and the GPU checks of an earlier case turn grad on.
    with torch.no_grad():
        hf = GlmMoeDsaForCausalLM.from_pretrained(ckpt_dir, dtype=torch.float32, attn_implementation="eager")
        hf.eval()
        assert list(hf.config.indexer_types) == list(c.indexer_types), hf.config.indexer_types
        kw = dict(num_hidden_layers=c.num_hidden_layers, hidden_size=c.hidden_size, rms_norm_eps=c.rms_norm_eps)
        mtp = mf.make_mtp(hf, kw, seed=0)
        ref = {k: v.float() for k, v in export.read_safetensors(os.path.join(ckpt_dir, "model.safetensors")).items()}
        mf.load_ref_values(hf, mtp, ref, c.num_hidden_layers)  # the MTP layer's weights (the main ones are loaded)
        logits, hidden, mtp_logits, mtp_hidden = mf.run_reference(hf, mtp, tokens, c.num_hidden_layers)
    return dict(logits=logits, hidden=hidden, mtp_logits=mtp_logits, mtp_hidden=mtp_hidden)


def gpu_checks(model: GlmMoeDsa, tokens, cpu_logits):
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    m = copy.deepcopy(model).to(dev)
    ids = torch.tensor([tokens], device=dev)
    with torch.no_grad():
        out = m(ids, mode="sparse")  # fp32: the experts take the exact per-expert loop
    print(f"  GPU fp32 vs CPU fp32: logits max rel diff {rel(out.logits[0].cpu(), cpu_logits):.2e}")
    # bf16 autocast: grouped-GEMM experts against the per-expert loop, forward and gradients.
    res, grouped_calls, plain = {}, [], GroupedExperts._grouped

    def counted(self, *args, **kw):
        grouped_calls.append(1)
        return plain(self, *args, **kw)

    GroupedExperts._grouped = counted
    for grouped in (True, False):
        GroupedExperts.use_grouped_mm = grouped
        m.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _, out = m.loss(ids.repeat(2, 1), mode="sparse")
        loss.backward()
        moe = next(l.mlp for l in m.model.layers if isinstance(l.mlp, MoE))
        res[grouped] = (out.logits.detach().float(), moe.experts.gate_up_proj.grad.clone(), loss.item())
        if grouped:
            n_grouped = len(grouped_calls)
    GroupedExperts.use_grouped_mm, GroupedExperts._grouped = True, plain
    (lg, gg, l1), (ll, gl, l2) = res[True], res[False]
    # At these tiny widths (one k-tile) both kernels may sum in the same order and agree bit for bit.
    print(f"  bf16 grouped-GEMM ({n_grouped} calls) vs loop experts ({len(grouped_calls) - n_grouped} grouped "
          f"calls): logits {rel(lg, ll):.2e}, expert grad {rel(gg, gl):.2e}, loss {l1:.6f} vs {l2:.6f}")
    if n_grouped == 0 or len(grouped_calls) != n_grouped:
        return False
    return rel(lg, ll) < 3e-2 and rel(gg, gl) < 5e-2


def run_case(name, cfg, dtype, T, out_root):
    seed = sum(map(ord, name))
    torch.manual_seed(seed)
    model = GlmMoeDsa(cfg).eval()
    randomize(model, seed, dtype)
    tokens, attempt, gaps = draw_tokens(model, T, seed)
    with torch.no_grad():
        out = model(torch.tensor([tokens]), mode="sparse")
        dense = model(torch.tensor([tokens[: cfg.index_topk]]), mode="dense", mtp=False).logits
        sparse = model(torch.tensor([tokens[: cfg.index_topk]]), mode="sparse", mtp=False).logits
    mine = dict(logits=out.logits[0], hidden=out.hidden[0], mtp_logits=out.mtp_logits[0],
                mtp_hidden=out.mtp_hidden[0])
    layout = "".join("F" if t == "full" else "S" for t in cfg.indexer_types)
    print(f"{name}: indexer_types {layout}, {dtype}, {T} tokens (draw {attempt}), worst gaps "
          f"indexer {gaps['indexer']:.2e} router {gaps['router']:.2e}, max |logit| "
          f"{mine['logits'].abs().max().item():.3f}")
    print(f"  dense vs sparse with every key selected ({cfg.index_topk} tokens): {rel(dense, sparse):.2e}")

    d = os.path.join(out_root, name)
    export.save(model, d, dtype)
    again = export.load(d).eval()
    with torch.no_grad():
        print(f"  export.load round trip: logits max rel diff "
              f"{rel(again(torch.tensor([tokens])).logits[0], mine['logits']):.2e}")
    with open(os.path.join(d, "tokens.json"), "w") as f:
        json.dump({"token_ids": tokens}, f)
    for key, fname in (("logits", "ref_logits"), ("hidden", "ref_hidden"), ("mtp_logits", "mtp_ref_logits"),
                       ("mtp_hidden", "mtp_ref_hidden")):
        np.save(os.path.join(d, fname + ".npy"), mine[key].float().numpy())

    ok = True
    hf = transformers_reference(d, model, tokens)
    for key in ("logits", "hidden", "mtp_logits", "mtp_hidden"):
        r = rel(mine[key], hf[key])
        ok &= r <= 1e-4
        print(f"  model.py vs transformers 5.17 {key}: max rel diff {r:.2e}")
    torch.set_grad_enabled(True)
    if torch.cuda.is_available():
        try:
            ok &= gpu_checks(model, tokens, mine["logits"])
        except Exception as e:  # noqa: BLE001  (report and go on: the fixture is written already)
            print(f"  GPU checks FAILED: {type(e).__name__}: {e}")
            ok = False
    return ok


def against_stored_fixtures(fixtures_dir):
    """model.py on make_fixtures.py's checkpoints against the transformers outputs stored beside them (F32 and
    BF16 ones: IndexShare from freq/offset, from a pattern, all full with group-limited routing)."""
    ok = True
    for name in ("freq_offset_f32", "pattern_bf16", "allfull_group_f32"):
        d = os.path.join(fixtures_dir, name)
        model = export.load(d).eval()
        with open(os.path.join(d, "tokens.json")) as f:
            tokens = json.load(f)["token_ids"]
        with torch.no_grad():
            out = model(torch.tensor([tokens]), mode="sparse")
        diffs = []
        for key, fname in (("logits", "ref_logits"), ("hidden", "ref_hidden"), ("mtp_logits", "mtp_ref_logits"),
                           ("mtp_hidden", "mtp_ref_hidden")):
            r = rel(getattr(out, key)[0], torch.from_numpy(np.load(os.path.join(d, fname + ".npy"))))
            ok &= r <= 1e-4
            diffs.append(f"{key} {r:.2e}")
        print(f"tests/fixtures/{name} (transformers 5.17 outputs): model.py max rel diff " + ", ".join(diffs))
    return ok


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else "check-out"
    import transformers
    print("torch", torch.__version__, "transformers", transformers.__version__)
    ok = against_stored_fixtures(sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "..", "tests",
                                                                                      "fixtures"))
    for name, (cfg, dtype, T) in CASES.items():
        ok &= run_case(name, cfg, dtype, T, out_root)
    print("CHECK", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
