#!/usr/bin/env python3
"""Builds tiny random GlmMoeDsa and DeepseekV32 checkpoints and their reference outputs with transformers 5.17.0.

Runs on the GPU machine (it has torch + transformers; see ../shared/docs/gpu.md), on the CPU, in fp32,
eager attention. For each variant it writes a fixture directory:

  config.json            the checkpoint's config (GLM: IndexShare given by freq/offset, pattern, explicit list or
                         none; DeepSeek-V3.2: YaRN in `rope_parameters` or in the legacy `rope_scaling`)
  model.safetensors      weights under real checkpoint names (per-expert tensors, indexer only on full layers,
                         MTP layer `model.layers.{N}`); F32, BF16, or FP8 e4m3 with 128x128 `weight_scale_inv`
  tokens.json            {"token_ids": [...]}: a sequence several times longer than index_topk
  ref_logits.npy         [T, vocab] logits at every position (transformers, fp32)
  ref_hidden.npy         [T, hidden] the last hidden state after the final norm (MTP step-0 input)
  mtp_ref_logits.npy     [T-1, vocab] MTP logits for positions 0..T-2 (input: embedding of token t+1 and
                         ref_hidden[t]); transformers has no MTP, so the layer is built from its modules
                         (model-spec §9.3; DeepSeek-V3.2's MTP layer has the same form)
  mtp_ref_hidden.npy     [T-1, hidden] MTP output after shared_head.norm

Near-ties are rejected: token sequences are redrawn until every indexer top-k boundary and every router
top-k boundary (main layers and MTP layer) has a clear gap, so a correct engine cannot pick a different set
through rounding alone.

Usage: python3 tools/reference/make_fixtures.py OUT_DIR
"""
import copy
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM, GlmMoeDsaConfig, GlmMoeDsaForCausalLM
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as DS
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as GLM

torch.set_grad_enabled(False)

BASE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=32,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=3,
    index_n_heads=8, index_head_dim=32, index_topk=8,
    max_position_embeddings=4096, rms_norm_eps=1e-5,
    rope_parameters={"rope_theta": 8000000.0, "rope_type": "default"},
    tie_word_embeddings=False, eos_token_id=[1], pad_token_id=0, bos_token_id=None,
)


class Family:
    """What differs between the two DSA families here: transformers' classes, and the indexer's RoPE layout."""

    def __init__(self, model_type, config, causal_lm, module, interleaved_indexer):
        self.model_type, self.config, self.causal_lm, self.M = model_type, config, causal_lm, module
        self.interleaved_indexer = interleaved_indexer
        prefix = "GlmMoeDsa" if module is GLM else "DeepseekV32"
        self.DecoderLayer = getattr(module, prefix + "DecoderLayer")
        self.RMSNorm = getattr(module, prefix + "RMSNorm")
        self.Indexer = getattr(module, prefix + "Indexer")
        self.Router = getattr(module, prefix + "TopkRouter")


FAMILIES = {
    "glm_moe_dsa": Family("glm_moe_dsa", GlmMoeDsaConfig, GlmMoeDsaForCausalLM, GLM, True),
    "deepseek_v32": Family("deepseek_v32", DeepseekV32Config, DeepseekV32ForCausalLM, DS, False),
}

# DeepSeek-V3.2's RoPE (its config.json: theta 1e4, YaRN factor 40 over 4096 positions, beta 32 / 1, mscale 1 / 1).
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}

# name -> (family, config overrides, how IndexShare / RoPE is written to config.json, weight dtype, seq len)
VARIANTS = {
    "freq_offset_f32": ("glm_moe_dsa", dict(index_topk_freq=4, index_skip_topk_offset=3), "freq", "f32", 80),
    "pattern_bf16": ("glm_moe_dsa", dict(index_topk_pattern="FFSFSSFS"), "pattern", "bf16", 48),
    "allfull_group_f32": ("glm_moe_dsa", dict(n_group=2, topk_group=1, rope_parameters={"rope_theta": 1000000.0,
                                                                                         "rope_type": "default"}),
                          "none", "f32", 40),
    "explicit_fp8": ("glm_moe_dsa", dict(index_topk_freq=4, index_skip_topk_offset=3), "explicit", "fp8", 72),
    # An indexer on every layer, YaRN (softmax scale × mscale²), group-limited routing as V3.2 routes (8 groups,
    # 4 kept; here 4 groups of 2, 2 kept), the MTP layer's own indexer.
    "dsv32_yarn_f32": ("deepseek_v32", dict(n_group=4, topk_group=2, rope_parameters=YARN, rms_norm_eps=1e-6),
                       "rope_parameters", "f32", 40),
    # The FP8 checkpoint with ue8m0 (power-of-two) block scales, config.json as DeepSeek ships it (legacy
    # `rope_scaling` + `rope_theta`), and an attention factor other than 1 (mscale 0.8 against mscale_all_dim 1).
    "dsv32_legacy_fp8": ("deepseek_v32", dict(rope_parameters=dict(YARN, mscale=0.8), rms_norm_eps=1e-6),
                         "rope_scaling", "fp8", 40),
}

FP8_MAX = 448.0


def make_model(fam, overrides, seed):
    kw = dict(BASE)
    kw.update(overrides)
    cfg = fam.config(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = fam.causal_lm(cfg).float().eval()
    # Weights with O(1) activations, randomized norms and biases (HF initialises norms to 1 and the
    # router bias to 0, which would leave those paths untested).
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            fan_in = p.shape[-1]
            p.normal_(0.0, fan_in ** -0.5)
        elif "norm" in name and name.endswith("weight"):
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        else:
            p.normal_(0.0, 0.1)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.normal_(0.0, 0.1)
    return model, kw


def make_mtp(fam, model, kw, seed):
    """The MTP layer (model-spec §5.1): a decoder layer with its own full indexer and MoE, plus
    enorm/hnorm/eh_proj/shared_head.norm. Built from HF modules with a config whose layer N is full/sparse."""
    n = kw["num_hidden_layers"]
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = n + 1
    if fam.M is GLM:
        cfg.indexer_types = list(model.config.indexer_types) + ["full"]
    else:
        cfg.layer_types = list(model.config.layer_types) + ["deepseek_sparse_attention"]
    cfg.mlp_layer_types = list(model.config.mlp_layer_types) + ["sparse"]
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed + 1000)
    layer = fam.DecoderLayer(cfg, n).float().eval()
    H = kw["hidden_size"]
    mtp = torch.nn.ModuleDict(dict(
        layer=layer,
        enorm=fam.RMSNorm(H, kw["rms_norm_eps"]),
        hnorm=fam.RMSNorm(H, kw["rms_norm_eps"]),
        eh_proj=torch.nn.Linear(2 * H, H, bias=False),
        head_norm=fam.RMSNorm(H, kw["rms_norm_eps"]),
    )).float().eval()
    for name, p in mtp.named_parameters():
        if p.dim() >= 2:
            p.normal_(0.0, p.shape[-1] ** -0.5)
        elif "norm" in name and name.endswith("weight"):
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        else:
            p.normal_(0.0, 0.1)
    for name, b in mtp.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.normal_(0.0, 0.1)
    return mtp


def checkpoint_tensors(model, mtp, n_layers):
    """state dicts → real checkpoint names (per-expert tensors; MTP as model.layers.N)."""
    out = {}

    def add_layer_state(prefix, sd):
        for k, v in sd.items():
            if k.endswith("mlp.experts.gate_up_proj"):
                base = prefix + k[: -len("gate_up_proj")]
                inter = v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[f"{base}{e}.gate_proj.weight"] = v[e, :inter].clone()
                    out[f"{base}{e}.up_proj.weight"] = v[e, inter:].clone()
            elif k.endswith("mlp.experts.down_proj"):
                base = prefix + k[: -len("down_proj")]
                for e in range(v.shape[0]):
                    out[f"{base}{e}.down_proj.weight"] = v[e].clone()
            else:
                out[prefix + k] = v.clone()

    add_layer_state("", {k: v for k, v in model.state_dict().items()})
    p = f"model.layers.{n_layers}."
    add_layer_state(p, mtp["layer"].state_dict())
    out[p + "enorm.weight"] = mtp["enorm"].weight.clone()
    out[p + "hnorm.weight"] = mtp["hnorm"].weight.clone()
    out[p + "eh_proj.weight"] = mtp["eh_proj"].weight.clone()
    out[p + "shared_head.norm.weight"] = mtp["head_norm"].weight.clone()
    return out


QUANTIZED = ("q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight", "o_proj.weight",
             "indexer.wq_b.weight", "indexer.wk.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight")


def fp8_quantize(w, pow2=False):
    """128x128 block quantization as in GLM-5.2-FP8: W = W8 * scale_inv[i//128, j//128]; pow2: the scales rounded
    up to powers of two (DeepSeek-V3.2's ue8m0)."""
    rows, cols = w.shape
    br, bc = (rows + 127) // 128, (cols + 127) // 128
    scale = torch.empty(br, bc, dtype=torch.float32)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    deq = torch.empty_like(w)
    for i in range(br):
        for j in range(bc):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s = blk.abs().max().clamp(min=1e-12) / FP8_MAX
            if pow2:
                s = torch.exp2(torch.ceil(torch.log2(s)))
            qb = (blk / s).to(torch.float8_e4m3fn)
            scale[i, j] = s
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = qb
            deq[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = qb.float() * s
    return q, scale, deq


def round_weights(tensors, dtype, pow2=False):
    """Returns (tensors to save, dequantized fp32 values the reference must use)."""
    save, ref = {}, {}
    for k, v in tensors.items():
        if k.endswith("e_score_correction_bias"):
            save[k], ref[k] = v.float().contiguous(), v.float()
        elif dtype == "f32":
            save[k], ref[k] = v.float().contiguous(), v.float()
        elif dtype == "bf16" or not k.endswith(QUANTIZED) or "mlp.gate.weight" in k:
            b = v.to(torch.bfloat16).contiguous()
            save[k], ref[k] = b, b.float()
        else:
            q, s, deq = fp8_quantize(v.float(), pow2)
            save[k] = q.contiguous()
            save[k[: -len(".weight")] + ".weight_scale_inv"] = s.contiguous()
            ref[k] = deq
    return save, ref


def load_ref_values(model, mtp, ref, n_layers):
    """Puts the (rounded / dequantized) checkpoint values back into the in-memory modules."""
    msd = model.state_dict()
    p = f"model.layers.{n_layers}."
    for k in list(msd.keys()):
        if k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            E = msd[k].shape[0]
            msd[k] = torch.stack([torch.cat([ref[f"{base}{e}.gate_proj.weight"], ref[f"{base}{e}.up_proj.weight"]])
                                  for e in range(E)])
        elif k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            msd[k] = torch.stack([ref[f"{base}{e}.down_proj.weight"] for e in range(msd[k].shape[0])])
        else:
            msd[k] = ref[k]
    model.load_state_dict(msd)
    lsd = mtp["layer"].state_dict()
    for k in list(lsd.keys()):
        if k.endswith("mlp.experts.gate_up_proj"):
            base = p + k[: -len("gate_up_proj")]
            lsd[k] = torch.stack([torch.cat([ref[f"{base}{e}.gate_proj.weight"], ref[f"{base}{e}.up_proj.weight"]])
                                  for e in range(lsd[k].shape[0])])
        elif k.endswith("mlp.experts.down_proj"):
            base = p + k[: -len("down_proj")]
            lsd[k] = torch.stack([ref[f"{base}{e}.down_proj.weight"] for e in range(lsd[k].shape[0])])
        else:
            lsd[k] = ref[p + k]
    mtp["layer"].load_state_dict(lsd)
    mtp["enorm"].weight.copy_(ref[p + "enorm.weight"])
    mtp["hnorm"].weight.copy_(ref[p + "hnorm.weight"])
    mtp["eh_proj"].weight.copy_(ref[p + "eh_proj.weight"])
    mtp["head_norm"].weight.copy_(ref[p + "shared_head.norm.weight"])


class Margins:
    """Records the smallest top-k boundary gap of every indexer and router call."""

    def __init__(self, fam):
        self.fam = fam
        self.worst = {"indexer": float("inf"), "router": float("inf")}

    def indexer_hook(self, module, args, kwargs, output):
        hs, q_resid, pe, mask = args[0], args[1], args[2], args[3]
        cos, sin = pe
        B, S, _ = hs.shape
        q = module.wq_b(q_resid).view(B, S, module.n_heads, module.head_dim)
        q_rot, q_pass = torch.split(q, [module.qk_rope_head_dim, module.head_dim - module.qk_rope_head_dim], -1)
        k = module.k_norm(module.wk(hs)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [module.qk_rope_head_dim, module.head_dim - module.qk_rope_head_dim], -1)
        if self.fam.interleaved_indexer:
            q_rot, k_rot = self.fam.M.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        else:
            q_rot, k_rot = self.fam.M.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], -1)
        k = torch.cat([k_rot, k_pass], -1).squeeze(2)
        scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * module.softmax_scale)
        w = module.weights_proj(hs).float() * module.n_heads ** -0.5
        idx = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)[0]  # [S, S]
        kk = module.index_topk
        for p in range(S):
            row = idx[p, : p + 1]
            if row.numel() <= kk:
                continue
            s = torch.sort(row, descending=True).values
            gap = (s[kk - 1] - s[kk]).item() / (1.0 + s.abs().max().item())
            self.worst["indexer"] = min(self.worst["indexer"], gap)

    def router_hook(self, module, args, output):
        x = args[0].reshape(-1, module.hidden_dim).float()
        s = torch.sigmoid(x @ module.weight.float().t())
        c = s + module.e_score_correction_bias
        if module.num_group > 1:
            g = c.view(-1, module.num_group, module.num_experts // module.num_group).topk(2, -1)[0].sum(-1)
            gs = torch.sort(g, -1, descending=True).values
            if module.topk_group < module.num_group:
                gap = (gs[:, module.topk_group - 1] - gs[:, module.topk_group]).min().item()
                self.worst["router"] = min(self.worst["router"], gap)
            keep = torch.zeros_like(g).scatter_(1, g.topk(module.topk_group, -1)[1], 1)
            mask = keep.unsqueeze(-1).expand(-1, module.num_group, module.num_experts // module.num_group)
            c = c.masked_fill(~mask.reshape(-1, module.num_experts).bool(), float("-inf"))
        cs = torch.sort(c, -1, descending=True).values
        gap = (cs[:, module.top_k - 1] - cs[:, module.top_k]).min().item()
        self.worst["router"] = min(self.worst["router"], gap)


def run_reference(model, mtp, tokens, n_layers):
    ids = torch.tensor([tokens])
    captured = {}

    def grab_mask(module, args, kwargs):
        captured["mask"] = kwargs["attention_mask"]

    h = model.model.layers[0].register_forward_pre_hook(grab_mask, with_kwargs=True)
    out = model(input_ids=ids, use_cache=False)
    h.remove()
    logits = out.logits[0]
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state  # after the final norm
    # MTP over positions 0..T-2: token t+1's embedding with the hidden state of t, at position t.
    T = len(tokens)
    e = model.model.embed_tokens(ids[:, 1:])
    hprev = hidden[:, : T - 1]
    u = mtp["eh_proj"](torch.cat([mtp["enorm"](e), mtp["hnorm"](hprev)], dim=-1))
    pos = torch.arange(T - 1).unsqueeze(0)
    pe = model.model.rotary_emb(u, position_ids=pos)
    mask = captured["mask"][:, :, : T - 1, : T - 1]
    out = mtp["layer"](u, attention_mask=mask, position_ids=pos, position_embeddings=pe, use_cache=False)
    u = out[0] if isinstance(out, tuple) else out  # GLM's layer also returns its top-k
    mtp_hidden = mtp["head_norm"](u)
    mtp_logits = model.lm_head(mtp_hidden)
    return logits, hidden[0], mtp_logits[0], mtp_hidden[0]


def write_config(model, kw, how, dtype, path):
    cfg = model.config.to_dict()
    # Keep only what a real checkpoint's config.json has; IndexShare written the way the variant says.
    for k in ("indexer_types", "index_topk_freq", "index_skip_topk_offset", "index_topk_pattern", "layer_types"):
        cfg.pop(k, None)
    if how == "rope_scaling":  # as DeepSeek's own config.json: `rope_theta` beside a legacy `rope_scaling`
        rp = dict(cfg.pop("rope_parameters"))
        cfg["rope_theta"] = rp.pop("rope_theta")
        rp["type"] = rp.pop("rope_type")
        cfg["rope_scaling"] = rp
    if how == "freq":
        cfg["index_topk_freq"], cfg["index_skip_topk_offset"] = kw["index_topk_freq"], kw["index_skip_topk_offset"]
    elif how == "pattern":
        cfg["index_topk_pattern"] = kw["index_topk_pattern"]
    elif how == "explicit":
        cfg["indexer_types"] = list(model.config.indexer_types)
    cfg["num_nextn_predict_layers"] = 1
    if cfg["model_type"] == "glm_moe_dsa":
        cfg["head_dim"] = 192  # the legacy field real configs carry; engines must ignore it
    if dtype == "fp8":
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]}
        if cfg["model_type"] == "deepseek_v32":
            cfg["quantization_config"]["scale_fmt"] = "ue8m0"
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, default=str)


def build(name, out_root):
    family, overrides, how, dtype, T = VARIANTS[name]
    fam = FAMILIES[family]
    seed = sum(map(ord, name))
    model, kw = make_model(fam, overrides, seed)
    n = kw["num_hidden_layers"]
    mtp = make_mtp(fam, model, kw, seed)
    save, ref = round_weights(checkpoint_tensors(model, mtp, n), dtype, pow2=family == "deepseek_v32")
    load_ref_values(model, mtp, ref, n)

    margins = Margins(fam)
    hooks = []
    for mod in list(model.modules()) + list(mtp.modules()):
        if isinstance(mod, fam.Indexer):
            hooks.append(mod.register_forward_hook(margins.indexer_hook, with_kwargs=True))
        if isinstance(mod, fam.Router):
            hooks.append(mod.register_forward_hook(margins.router_hook))
    rng = np.random.default_rng(seed)
    for attempt in range(500):
        tokens = [int(t) for t in rng.integers(2, kw["vocab_size"], size=T)]
        margins.worst = {"indexer": float("inf"), "router": float("inf")}
        res = run_reference(model, mtp, tokens, n)
        if margins.worst["indexer"] > 2e-4 and margins.worst["router"] > 2e-4:
            break
    else:
        raise SystemExit(f"{name}: no sequence without near-ties found")
    for h in hooks:
        h.remove()
    logits, hidden, mtp_logits, mtp_hidden = res
    types = getattr(model.config, "indexer_types", None) or ["full"] * n
    print(f"{name}: attempt {attempt}, worst relative gaps {margins.worst}, indexer_types "
          f"{''.join('F' if t == 'full' else 'S' for t in types)}, |logits|max "
          f"{logits.abs().max().item():.3f}")

    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    save_file(save, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    write_config(model, kw, how, dtype, os.path.join(d, "config.json"))
    with open(os.path.join(d, "tokens.json"), "w") as f:
        json.dump({"token_ids": tokens}, f)
    np.save(os.path.join(d, "ref_logits.npy"), logits.float().numpy())
    np.save(os.path.join(d, "ref_hidden.npy"), hidden.float().numpy())
    np.save(os.path.join(d, "mtp_ref_logits.npy"), mtp_logits.float().numpy())
    np.save(os.path.join(d, "mtp_ref_hidden.npy"), mtp_hidden.float().numpy())

    # The checkpoint must load in transformers under these names and give the same logits (checks the
    # writer: names, per-expert split, IndexShare resolution from config.json).
    if dtype != "fp8":
        loaded = fam.causal_lm.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        if fam.M is GLM:
            assert list(loaded.config.indexer_types) == list(model.config.indexer_types), (
                name, loaded.config.indexer_types, model.config.indexer_types)
        l2 = loaded(input_ids=torch.tensor([tokens]), use_cache=False).logits[0]
        diff = (l2 - logits).abs().max().item()
        print(f"{name}: from_pretrained reload max |diff| = {diff:.3e}")
        assert diff < 1e-5 * logits.abs().max().item(), diff
        # HF's own decode path (KV cache, one token at a time) agrees with its prefill.
        past, steps = None, []
        for t in tokens:
            o = loaded(input_ids=torch.tensor([[t]]), past_key_values=past, use_cache=True)
            past = o.past_key_values
            steps.append(o.logits[0, -1])
        dd = (torch.stack(steps) - logits).abs().max().item()
        print(f"{name}: transformers decode vs prefill max |diff| = {dd:.3e}")


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else "fixtures"
    import transformers
    print("transformers", transformers.__version__, "torch", torch.__version__)
    for name in (sys.argv[2:] or VARIANTS):
        build(name, out_root)


if __name__ == "__main__":
    main()
