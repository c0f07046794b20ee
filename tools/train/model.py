"""GLM-5.2 (`glm_moe_dsa`) in PyTorch, written for training.

The forward is the one of docs model-spec (shared/docs/model-spec.md), section by section:

  §1.2  layer schedule: x += Attn(RMSNorm(x)); x += FFN(RMSNorm(x)); logits = lm_head(RMSNorm(x))
  §2    MLA with q/kv LoRA, interleaved RoPE on the last qk_rope_head_dim dims, scale 1/sqrt(qk_head_dim)
  §3    the DSA lightning indexer (full layers only): ReLU per head, weighted head sum, causal top-k per query
  §4    IndexShare: a "shared" layer reuses the top-k of the full layer before it
  §1.3  sigmoid-router MoE: bias for choosing only, optional group limit, renormalised, routed scaling,
        plus a shared expert
  §5.1  the MTP layer: eh_proj(enorm(embed(t+1)) ‖ hnorm(h_t)) → one decoder layer → shared_head.norm → lm_head

Two attention modes:
  "dense"   every query attends to all keys t ≤ p (flash SDPA, causal); the warm-up mode. The indexer still
            runs when its loss is asked for, so it learns while attention is dense.
  "sparse"  every query attends only to its layer's top-k (the DSA model itself, as megactx and transformers
            compute it). Done as SDPA with a boolean mask [B, 1, T, T]: exact and simple, but it still does
            the T×T work of dense attention (without even the causal skip). A faster kernel gathers the k
            selected keys per query (FlashMLA's sparse prefill: O(T·k) instead of O(T²)) and, for the
            backward, scatters the key/value gradients back through the same indices.

Training speed: SDPA attention, experts as grouped GEMMs (`torch._grouped_mm` in bf16 on Hopper; a loop over
experts elsewhere, e.g. fp32 checks), and `compile_layers()` for regional torch.compile (each decoder layer
compiled once; layers of the same kind share the compiled code).

Indexer training (DSA): the indexer reads detached inputs and learns from a KL loss against the main
attention's distribution (summed over heads, and over all layers the indexer serves under IndexShare),
over all causal keys in dense mode and over the selected keys in sparse mode. The router's selection bias is
updated from the measured expert loads (auxiliary-loss-free balancing), see `update_router_bias`.

Weights load and save under the Hugging Face checkpoint names (model-spec §7.1): per-expert tensors,
indexer tensors only on full layers, the MTP layer as model.layers.{num_hidden_layers}.

Shapes: B batch, T tokens, D hidden, NH heads, E routed experts, K experts per token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, asdict
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class Config:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128          # dense SwiGLU width
    moe_intermediate_size: int = 32       # each routed expert; the shared expert is n_shared_experts × this
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    q_lora_rank: int = 48
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 24
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True
    index_n_heads: int = 8
    index_head_dim: int = 32
    index_topk: int = 8
    indexer_types: list = field(default_factory=list)    # "full" / "shared" per layer; [] → all full
    mlp_layer_types: list = field(default_factory=list)  # "dense" / "sparse" per layer; [] → from first_k_dense
    first_k_dense_replace: int = 3
    rope_theta: float = 8000000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    num_nextn_predict_layers: int = 1
    tie_word_embeddings: bool = False
    bos_token_id: Optional[int] = None
    eos_token_id: list = field(default_factory=lambda: [1])
    pad_token_id: int = 0

    def __post_init__(self):
        n = self.num_hidden_layers
        if not self.indexer_types:
            self.indexer_types = ["full"] * n
        if not self.mlp_layer_types:
            self.mlp_layer_types = ["dense" if i < self.first_k_dense_replace else "sparse" for i in range(n)]
        assert len(self.indexer_types) == n and len(self.mlp_layer_types) == n
        assert self.indexer_types[0] == "full", "a shared layer reuses the top-k of an earlier full layer"
        assert self.index_head_dim >= self.qk_rope_head_dim and self.qk_rope_head_dim % 2 == 0
        assert self.num_nextn_predict_layers in (0, 1)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_hf(cls, d: dict) -> "Config":
        """From a config.json dict. IndexShare precedence as transformers 5.17 (model-spec §4.1):
        indexer_types > index_topk_pattern > index_topk_freq/index_skip_topk_offset > all full."""
        assert d.get("model_type") == "glm_moe_dsa", d.get("model_type")
        n = d["num_hidden_layers"]
        if d.get("indexer_types"):
            types = list(d["indexer_types"])
        elif d.get("index_topk_pattern"):
            types = ["full" if ch == "F" else "shared" for ch in d["index_topk_pattern"]]
        elif "index_topk_freq" in d or "index_skip_topk_offset" in d:
            freq = max(d.get("index_topk_freq") or 1, 1)
            offset = d.get("index_skip_topk_offset", 2)
            types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
        else:
            types = ["full"] * n
        rope = d.get("rope_parameters") or {}
        theta = rope.get("rope_theta", d.get("rope_theta", 8000000.0))
        assert rope.get("rope_type", "default") == "default", "only plain RoPE (no YaRN)"
        eos = d.get("eos_token_id", [1])
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k not in ("indexer_types", "rope_theta",
                                                                                 "eos_token_id")}
        kw.update(indexer_types=types, rope_theta=float(theta), eos_token_id=eos if isinstance(eos, list) else [eos])
        if not d.get("mlp_layer_types"):
            kw.pop("mlp_layer_types", None)
        return cls(**kw)

    def to_hf(self) -> dict:
        """The config.json of the checkpoint (what transformers 5.17 and megactx read)."""
        d = asdict(self)
        theta = d.pop("rope_theta")
        d.update(
            architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa",
            num_key_value_heads=self.num_attention_heads, qk_head_dim=self.qk_head_dim,
            head_dim=self.qk_rope_head_dim,  # transformers' own value; engines ignore the field
            hidden_act="silu", scoring_func="sigmoid", topk_method="noaux_tc", moe_layer_freq=1,
            attention_bias=False, attention_dropout=0.0, rope_interleave=True, indexer_rope_interleave=True,
            rope_parameters={"rope_theta": theta, "rope_type": "default"},
            index_share_for_mtp_iteration=True, initializer_range=0.02, dtype="bfloat16",
            transformers_version="5.17.0")
        return d


# ----------------------------------------------------------------------------------------------------------------
# Small pieces: RMSNorm, interleaved RoPE, SwiGLU
# ----------------------------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """model-spec §2.7: fp32 x·rsqrt(mean(x²)+eps), cast back to the input dtype, then × weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # [..., dim]
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_tables(positions, dim: int, theta: float):
    """cos, sin [T, dim/2] in fp32 (model-spec §2.4: inv_freq[i] = θ^(−2i/dim), angle = p·inv_freq)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float() / dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Interleaved (GPT-J) rotation of pairs (x[2i], x[2i+1]) by angle i, written back in place.
    x [B, T, ..., d]; cos/sin [T, d/2]. Computed in fp32, returned in x's dtype."""
    shape = x.shape
    c = cos.view(1, shape[1], *([1] * (x.dim() - 3)), -1)
    s = sin.view(1, shape[1], *([1] * (x.dim() - 3)), -1)
    xf = x.float().reshape(*shape[:-1], shape[-1] // 2, 2)
    x0, x1 = xf[..., 0], xf[..., 1]                      # [B, T, ..., d/2]
    y = torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1)
    return y.reshape(shape).to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) ⊙ up(x)): the dense MLP (layers < first_k_dense_replace) and the shared expert."""

    def __init__(self, dim: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, inter, bias=False)
        self.up_proj = nn.Linear(dim, inter, bias=False)
        self.down_proj = nn.Linear(inter, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ----------------------------------------------------------------------------------------------------------------
# DSA lightning indexer (model-spec §3)
# ----------------------------------------------------------------------------------------------------------------

class Indexer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.n_heads, self.head_dim, self.rope_dim = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        self.topk = cfg.index_topk
        self.wq_b = nn.Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(cfg.hidden_size, self.n_heads, bias=False)

    def forward(self, xn, q_lat, cos, sin):
        """xn [B, T, D] (attention input), q_lat [B, T, q_lora] → index scores [B, T(query), T(key)], −inf for
        keys after the query."""
        B, T, _ = xn.shape
        r = self.rope_dim
        q = self.wq_b(q_lat).view(B, T, self.n_heads, self.head_dim)          # [B, T, HI, DI]
        q = torch.cat([apply_rope(q[..., :r], cos, sin), q[..., r:]], dim=-1)  # RoPE on the FIRST r dims
        k = self.k_norm(self.wk(xn))                                            # [B, T, DI]
        k = torch.cat([apply_rope(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        w = self.weights_proj(xn).float() * self.n_heads ** -0.5               # [B, T, HI]
        qk = torch.einsum("bshd,btd->bsht", q, k) * self.head_dim ** -0.5      # [B, T, HI, T]
        scores = torch.einsum("bsht,bsh->bst", F.relu(qk), w.to(qk.dtype)).float()  # [B, T, T]
        causal = torch.ones(T, T, dtype=torch.bool, device=xn.device).tril()
        return scores.masked_fill(~causal, float("-inf"))

    def select(self, scores):
        """[B, T, T] scores → boolean allowed-keys mask [B, T, T]: the top-min(k, T) keys of each query's row,
        intersected with causality (rows shorter than k keep all their keys; model-spec §3.2)."""
        T = scores.shape[-1]
        idx = scores.topk(min(self.topk, T), dim=-1, sorted=False).indices     # [B, T, k]
        allowed = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, idx, True)
        return allowed & torch.ones(T, T, dtype=torch.bool, device=scores.device).tril()


# ----------------------------------------------------------------------------------------------------------------
# MLA attention (model-spec §2), MHA form for training
# ----------------------------------------------------------------------------------------------------------------

def sdpa(q, k, v, scale, mask=None):
    """q, k [B, NH, T, dqk], v [B, NH, T, dv]; mask None → causal, else boolean [B, 1, T, T] (True = attend).
    Pads the smaller head dim with zeros so flash / memory-efficient kernels apply (zeros change no dot
    product and add zero columns to the output, which are cut off)."""
    dqk, dv = q.shape[-1], v.shape[-1]
    if not hasattr(F, "scaled_dot_product_attention"):  # torch < 2.0 (Debian's, for CPU runs): the same math
        T = q.shape[-2]
        keep = torch.ones(T, T, dtype=torch.bool, device=q.device).tril() if mask is None else mask
        s = (q @ k.transpose(-1, -2)).float() * scale
        return (s.masked_fill(~keep, float("-inf")).softmax(-1).to(v.dtype) @ v)
    if dv < dqk:
        v = F.pad(v, (0, dqk - dv))
    elif dqk < dv:
        q, k = F.pad(q, (0, dv - dqk)), F.pad(k, (0, dv - dqk))
    if mask is None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return o[..., :dv]


class Attention(nn.Module):
    def __init__(self, cfg: Config, full_indexer: bool):
        super().__init__()
        self.cfg = cfg
        nh = cfg.num_attention_heads
        self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)   # transformers builds both latent norms with 1e-6
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, nh * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, 1e-6)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(nh * cfg.v_head_dim, cfg.hidden_size, bias=False)
        self.indexer = Indexer(cfg) if full_indexer else None
        self.scale = cfg.qk_head_dim ** -0.5

    def forward(self, xn, cos, sin, allowed_in, mode: str, want_index: bool, want_qk: bool, taps=None, name="",
                kv_in=None, want_kv: bool = False):
        """xn [B, T, D] → (out [B, T, D], allowed [B, T, T] or None, aux).
        allowed_in: the allowed-keys mask of the full layer before (used by a shared layer).
        kv_in: (k, v) [B, NH, T, d] of an earlier pass of this layer to attend to instead of keys computed from
        xn, over allowed_in (None: causal), with no indexer: an MTP draft step >= 1, which reads step 0's KV and
        step 0's top-k. want_kv returns this pass's (k, v) in aux["kv"]."""
        c = self.cfg
        B, T, _ = xn.shape
        nh, dn, dr, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        q_lat = self.q_a_layernorm(self.q_a_proj(xn))                          # [B, T, q_lora]
        q = self.q_b_proj(q_lat).view(B, T, nh, dn + dr)                       # [B, T, NH, dn+dr]
        q = torch.cat([q[..., :dn], apply_rope(q[..., dn:], cos, sin)], dim=-1)
        aux = {}
        if kv_in is not None:
            o = sdpa(q.transpose(1, 2), kv_in[0], kv_in[1], self.scale,
                     None if allowed_in is None else allowed_in[:, None])
            return self.o_proj(o.transpose(1, 2).reshape(B, T, nh * dv)), allowed_in, aux
        kv = self.kv_a_proj_with_mqa(xn)                                       # [B, T, kv_lora + dr]
        c_kv = self.kv_a_layernorm(kv[..., : c.kv_lora_rank])                  # [B, T, kv_lora]
        k_pe = apply_rope(kv[..., c.kv_lora_rank:], cos, sin)                  # [B, T, dr], one head shared
        kvb = self.kv_b_proj(c_kv).view(B, T, nh, dn + dv)                     # [B, T, NH, dn+dv]
        k = torch.cat([kvb[..., :dn], k_pe[:, :, None, :].expand(B, T, nh, dr)], dim=-1)  # [B, T, NH, dn+dr]
        v = kvb[..., dn:]                                                       # [B, T, NH, dv]

        allowed = allowed_in
        if self.indexer is not None and (mode == "sparse" or want_index):
            # The indexer learns only from its own loss: its inputs are cut from the graph (DSA).
            with torch.set_grad_enabled(torch.is_grad_enabled() and want_index):
                scores = self.indexer(xn.detach(), q_lat.detach(), cos, sin)   # [B, T, T]
            if mode == "sparse":
                with torch.no_grad():
                    allowed = self.indexer.select(scores)
            aux["index_scores"] = scores
            if taps is not None:
                taps[name + "index_scores"] = scores.detach()
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, NH, T, d]
        if want_qk:
            aux["qk"] = (qh.detach(), kh.detach())
        if want_kv:
            aux["kv"] = (kh, vh)
        if mode == "sparse":
            o = sdpa(qh, kh, vh, self.scale, allowed[:, None])
        else:
            o = sdpa(qh, kh, vh, self.scale)
        o = o.transpose(1, 2).reshape(B, T, nh * dv)                           # [B, T, NH·dv]
        if taps is not None:
            taps[name + "attn_out"] = o.detach()
        return self.o_proj(o), allowed, aux


# ----------------------------------------------------------------------------------------------------------------
# MoE (model-spec §1.3)
# ----------------------------------------------------------------------------------------------------------------

def _grouped_mm_fn():
    return getattr(torch, "_grouped_mm", None) or getattr(F, "grouped_mm", None)


class GroupedExperts(nn.Module):
    """E SwiGLU experts stored as gate_up_proj [E, 2I, D] (gate rows first) and down_proj [E, D, I].
    On CUDA under autocast: grouped GEMMs in bf16 (one launch per projection for all experts); otherwise (fp32,
    CPU, or use_grouped_mm = False) a loop over experts, which is exact but syncs on the expert counts."""

    use_grouped_mm = True

    def __init__(self, n: int, dim: int, inter: int):
        super().__init__()
        self.n, self.inter = n, inter
        self.gate_up_proj = nn.Parameter(torch.empty(n, 2 * inter, dim))
        self.down_proj = nn.Parameter(torch.empty(n, dim, inter))
        nn.init.normal_(self.gate_up_proj, std=dim ** -0.5)
        nn.init.normal_(self.down_proj, std=inter ** -0.5)

    def forward(self, xs, expert, counts):
        """xs [R, D] rows sorted by expert, expert [R] their expert ids, counts [E] rows per expert → [R, D]."""
        fn = _grouped_mm_fn()
        if self.use_grouped_mm and fn is not None and xs.is_cuda and torch.is_autocast_enabled():
            return self._grouped(fn, xs, expert, counts)
        outs, start = [], 0
        for e, n_e in enumerate(counts.tolist()):
            x = xs[start: start + n_e]
            h = x @ self.gate_up_proj[e].t()
            outs.append((F.silu(h[:, : self.inter]) * h[:, self.inter:]) @ self.down_proj[e].t())
            start += n_e
        return torch.cat(outs, 0)

    def _grouped(self, fn, xs, expert, counts, align: int = 16):
        """Two grouped GEMMs in bf16 (under autocast: bf16 training). Each expert's rows start at a multiple
        of `align` (zero rows between groups) as the grouped-GEMM kernels want; every shape stays static."""
        R = xs.shape[0]
        padded = (counts + align - 1) // align * align                                     # [E]
        ends = padded.cumsum(0)
        first = counts.cumsum(0) - counts                                                  # [E] first sorted row
        dest = (ends - padded)[expert] + torch.arange(R, device=xs.device) - first[expert]  # [R] padded row
        buf = xs.new_zeros(R + self.n * (align - 1), xs.shape[1], dtype=torch.bfloat16)
        buf = buf.index_copy(0, dest, xs.to(torch.bfloat16))                               # [R', D]
        offs = ends.to(torch.int32)
        h = fn(buf, self.gate_up_proj.to(torch.bfloat16).transpose(1, 2), offs=offs)       # [R', 2I]
        a = F.silu(h[:, : self.inter]) * h[:, self.inter:]                                 # [R', I]
        y = fn(a, self.down_proj.to(torch.bfloat16).transpose(1, 2), offs=offs)           # [R', D]
        return y[dest]


class Router(nn.Module):
    """mlp.gate: weight [E, D] and the selection bias e_score_correction_bias [E] (a buffer: it is set by
    load balancing, not by gradients)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size))
        nn.init.normal_(self.weight, std=cfg.hidden_size ** -0.5)
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts))


class MoE(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.gate = Router(cfg)
        self.experts = GroupedExperts(cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.shared_experts = SwiGLU(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)

    def route(self, x):
        """x [N, D] → expert ids [N, K], weights [N, K] (fp32), biased choice scores [N, E]."""
        c = self.cfg
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = F.linear(x.float(), self.gate.weight.float())             # [N, E], router GEMM in fp32
        s = torch.sigmoid(logits)
        choice = s + self.gate.e_score_correction_bias                          # for choosing only
        if c.n_group > 1:
            N, E = choice.shape
            g = choice.view(N, c.n_group, E // c.n_group).topk(2, dim=-1).values.sum(-1)   # [N, G]
            keep = torch.zeros_like(g, dtype=torch.bool).scatter_(1, g.topk(c.topk_group, dim=-1).indices, True)
            choice = choice.masked_fill(~keep.repeat_interleave(E // c.n_group, dim=1), float("-inf"))
        idx = choice.topk(c.num_experts_per_tok, dim=-1, sorted=False).indices   # [N, K]
        w = s.gather(1, idx)                                                     # unbiased scores
        if c.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * c.routed_scaling_factor, choice

    def forward(self, x, taps=None, name=""):
        """x [B, T, D] → (y [B, T, D], tokens per expert [E])."""
        shape = x.shape
        xf = x.reshape(-1, shape[-1])                                            # [N, D]
        idx, w, choice = self.route(xf)
        if taps is not None:
            taps[name + "router_choice"] = choice.detach()
        K = idx.shape[1]
        flat = idx.reshape(-1)                                                   # [N·K]
        order = torch.sort(flat, stable=True).indices                            # rows grouped by expert
        token = order // K                                                       # source token of each row
        counts = torch.zeros(self.cfg.n_routed_experts, dtype=torch.int64, device=x.device)
        counts = counts.scatter_add_(0, flat, torch.ones_like(flat))             # [E]
        y = self.experts(xf[token], flat[order], counts)                         # [N·K, D]
        y = y.float() * w.reshape(-1)[order, None]
        routed = torch.zeros(xf.shape, dtype=torch.float32, device=x.device).index_add_(0, token, y)
        out = routed.to(x.dtype).view(shape) + self.shared_experts(x)
        return out, counts.detach()


# ----------------------------------------------------------------------------------------------------------------
# Decoder layer, MTP layer, model
# ----------------------------------------------------------------------------------------------------------------

class DecoderLayer(nn.Module):
    def __init__(self, cfg: Config, full_indexer: bool, moe: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, full_indexer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if moe else SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, allowed_in, mode: str, want_index: bool, want_qk: bool, taps=None, name="",
                kv_in=None, want_kv: bool = False):
        """x [B, T, D] → (x [B, T, D], allowed mask for the next layer, aux); kv_in/want_kv as Attention's."""
        a, allowed, aux = self.self_attn(self.input_layernorm(x), cos, sin, allowed_in, mode, want_index, want_qk,
                                         taps, name, kv_in, want_kv)
        x = x + a
        h = self.post_attention_layernorm(x)
        if isinstance(self.mlp, MoE):
            m, aux["load"] = self.mlp(h, taps, name)
        else:
            m = self.mlp(h)
        x = x + m
        if taps is not None:
            taps[name + "out"] = x.detach()
        return x, allowed, aux


class SharedHead(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MtpLayer(DecoderLayer):
    """model.layers.{N}: a decoder layer with its own full indexer and an MoE, plus enorm/hnorm/eh_proj and
    shared_head.norm (model-spec §5.1). Embedding and LM head are the main model's."""

    def __init__(self, cfg: Config):
        super().__init__(cfg, full_indexer=True, moe=True)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.shared_head = SharedHead(cfg)

    def combine(self, e, h):
        """embedding of token t+1 [B, T, D], final-norm hidden of t [B, T, D] → layer input [B, T, D]
        (embedding first, hidden second)."""
        return self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h)], dim=-1))


class Backbone(nn.Module):
    """`model.*` in the checkpoint: embed_tokens, layers (N decoder layers, then the MTP layer), norm."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        layers = [DecoderLayer(cfg, cfg.indexer_types[i] == "full", cfg.mlp_layer_types[i] == "sparse")
                  for i in range(cfg.num_hidden_layers)]
        if cfg.num_nextn_predict_layers:
            layers.append(MtpLayer(cfg))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class Output:
    logits: torch.Tensor                         # [B, T, V]
    hidden: torch.Tensor                         # [B, T, D] after the final norm (MTP input)
    mtp_logits: Optional[torch.Tensor] = None    # [B, T-1, V]: position t predicts token t+2
    mtp_hidden: Optional[torch.Tensor] = None    # [B, T-1, D] after shared_head.norm
    mtp_step_logits: list = field(default_factory=list)  # step j >= 1: [B, T-1-j, V], position t predicts t+2+j
    indexer_loss: Optional[torch.Tensor] = None  # mean KL over full layers (and the MTP layer)
    loads: list = field(default_factory=list)    # tokens per expert [E] of every MoE layer, in order


class GlmMoeDsa(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self):
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("norm.bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                nn.init.normal_(p, std=p.shape[1] ** -0.5)
        nn.init.normal_(self.model.embed_tokens.weight, std=1.0)

    @property
    def n_layers(self):
        return self.cfg.num_hidden_layers

    def compile_layers(self, **kw):
        """Regional torch.compile: each decoder layer's forward is compiled; layers of one kind share code."""
        for layer in self.model.layers:
            layer.compile(**kw)

    def forward(self, input_ids, mode: str = "sparse", mtp: bool = True, indexer_loss: bool = False,
                taps: Optional[dict] = None, positions: Optional[torch.Tensor] = None,
                kl_all_keys: bool = False, query_weights: Optional[torch.Tensor] = None,
                mtp_steps: int = 1) -> Output:
        """input_ids [B, T]; positions [T] (increasing; default 0..T-1), the RoPE positions of every row.
        mode "sparse" (DSA) or "dense" (all causal keys). The indexer loss compares with the attention over the
        selected keys in sparse mode, or over all causal keys when kl_all_keys (a key the indexer missed then
        still teaches it); query_weights [B, T] weigh the queries in it (default: all equal).
        mtp_steps > 1 also runs the MTP layer's later draft steps as megactx's draft loop does: step j at row t
        reads token t+1+j and step j-1's hidden state (after shared_head.norm), sits at position p_t + j and
        attends to step 0's KV over step 0's selection (index_share_for_mtp_iteration); it predicts t+2+j."""
        assert mode in ("sparse", "dense")
        c = self.cfg
        B, T = input_ids.shape
        if positions is None:
            positions = torch.arange(T, device=input_ids.device)
        cos, sin = rope_tables(positions, c.qk_rope_head_dim, c.rope_theta)
        x = self.model.embed_tokens(input_ids)                                   # [B, T, D]
        allowed, loads, groups = None, [], []   # groups: (index scores, allowed, [(q, k) of every layer served])
        for i in range(c.num_hidden_layers):
            layer = self.model.layers[i]
            name = f"layer{i}." if taps is not None else ""  # (a constant name keeps one compiled graph per kind)
            x, allowed, aux = layer(x, cos, sin, allowed, mode, indexer_loss, indexer_loss, taps, name)
            if "index_scores" in aux:
                groups.append([aux["index_scores"], allowed, []])
            if indexer_loss:
                groups[-1][2].append(aux["qk"])
            if "load" in aux:
                loads.append(aux["load"])
        h = self.model.norm(x)                                                   # [B, T, D]
        out = Output(logits=self.lm_head(h), hidden=h, loads=loads)
        if mtp and c.num_nextn_predict_layers:
            layer = self.model.layers[c.num_hidden_layers]
            # Position t gets embed(token t+1) and h_t. The last position has no next token: it is fed its own
            # token and dropped, so every layer keeps the shape [B, T] (causality keeps it out of t < T-1).
            nxt = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], dim=1)
            u = layer.combine(self.model.embed_tokens(nxt), h)
            u, m_allowed, aux = layer(u, cos, sin, None, mode, indexer_loss, indexer_loss, taps,
                                      "mtp." if taps is not None else "", want_kv=mtp_steps > 1)
            mh_full = layer.shared_head.norm(u)                                  # [B, T, D]
            mh = mh_full[:, :-1]                                                 # [B, T-1, D]
            out.mtp_hidden, out.mtp_logits = mh, self.lm_head(mh)
            load = aux["load"]
            for j in range(1, mtp_steps):
                # Row t reads token t+1+j (the last rows, past the end, repeat the last token and are dropped).
                nxt = torch.cat([input_ids[:, 1 + j:], input_ids[:, -1:].expand(B, 1 + j)], dim=1)
                cj, sj = rope_tables(positions + j, c.qk_rope_head_dim, c.rope_theta)
                u = layer.combine(self.model.embed_tokens(nxt), mh_full)
                u, _, aux_j = layer(u, cj, sj, m_allowed, mode, False, False, kv_in=aux["kv"])
                mh_full = layer.shared_head.norm(u)
                out.mtp_step_logits.append(self.lm_head(mh_full[:, :-1 - j]))
                load = load + aux_j["load"]
            out.loads.append(load)
            if indexer_loss:
                groups.append([aux["index_scores"], m_allowed, [aux["qk"]]])
        if indexer_loss:
            losses = [kl_to_attention(s, None if kl_all_keys else a, qks, c.qk_head_dim ** -0.5, query_weights)
                      for s, a, qks in groups]
            out.indexer_loss = torch.stack(losses).mean()
        return out

    def loss(self, input_ids, mode="sparse", mtp_weight=0.3, indexer_weight=1.0):
        """Next-token CE + mtp_weight · MTP CE (token t+2 at position t) + indexer_weight · indexer KL."""
        out = self.forward(input_ids, mode=mode, mtp=mtp_weight > 0, indexer_loss=indexer_weight > 0)
        V = self.cfg.vocab_size
        lm = F.cross_entropy(out.logits[:, :-1].reshape(-1, V).float(), input_ids[:, 1:].reshape(-1))
        total, parts = lm, {"lm": lm.detach()}
        if out.mtp_logits is not None:
            mtp = F.cross_entropy(out.mtp_logits[:, :-1].reshape(-1, V).float(), input_ids[:, 2:].reshape(-1))
            total, parts["mtp"] = total + mtp_weight * mtp, mtp.detach()
        if out.indexer_loss is not None:
            total, parts["indexer"] = total + indexer_weight * out.indexer_loss, out.indexer_loss.detach()
        return total, parts, out

    @torch.no_grad()
    def update_router_bias(self, loads, rate: float = 1e-3):
        """Auxiliary-loss-free balancing: raise the selection bias of under-loaded experts, lower the over-loaded."""
        moe = [l.mlp for l in self.model.layers if isinstance(l.mlp, MoE)]
        for m, load in zip(moe, loads):
            load = load.float()
            m.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)

    # ------------------------------------------------------------------------------------------------------------
    # Checkpoint names (model-spec §7.1)
    # ------------------------------------------------------------------------------------------------------------

    def checkpoint_state(self) -> dict:
        """state dict under the Hugging Face checkpoint names: experts split into per-expert tensors."""
        out = {}
        for k, v in self.state_dict().items():
            if k.endswith("mlp.experts.gate_up_proj"):
                base, inter = k[: -len("gate_up_proj")], v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[f"{base}{e}.gate_proj.weight"] = v[e, :inter]
                    out[f"{base}{e}.up_proj.weight"] = v[e, inter:]
            elif k.endswith("mlp.experts.down_proj"):
                base = k[: -len("down_proj")]
                for e in range(v.shape[0]):
                    out[f"{base}{e}.down_proj.weight"] = v[e]
            else:
                out[k] = v
        return out

    @torch.no_grad()
    def load_checkpoint_state(self, tensors: dict):
        """Inverse of checkpoint_state; every tensor of the model must be there, and nothing else (tensors of
        a layer that the model does not have, such as indexer weights on shared layers, are an error)."""
        sd = self.state_dict()
        used = set()
        for k, v in sd.items():
            if k.endswith("mlp.experts.gate_up_proj"):
                base = k[: -len("gate_up_proj")]
                names = [(f"{base}{e}.gate_proj.weight", f"{base}{e}.up_proj.weight") for e in range(v.shape[0])]
                val = torch.stack([torch.cat([tensors[g], tensors[u]]) for g, u in names])
                used.update(n for pair in names for n in pair)
            elif k.endswith("mlp.experts.down_proj"):
                base = k[: -len("down_proj")]
                names = [f"{base}{e}.down_proj.weight" for e in range(v.shape[0])]
                val = torch.stack([tensors[n] for n in names])
                used.update(names)
            else:
                val = tensors[k]
                used.add(k)
            assert val.shape == v.shape, (k, tuple(val.shape), tuple(v.shape))
            v.copy_(val.to(v.dtype))
        extra = sorted(set(tensors) - used)
        assert not extra, f"tensors the model does not have: {extra[:5]}"


def kl_to_attention(index_scores, allowed, qks, scale, query_weights=None, chunk: int = 1024):
    """Indexer loss (DSA): KL(p ‖ softmax(index scores)) per query, averaged, where p is the main attention's
    distribution over the allowed keys, summed over heads and over the layers that use this indexer's
    selection, normalised. index_scores [B, T, T] (with grad); allowed [B, T, T] bool, the selected keys in
    sparse mode, None (all causal keys) in dense mode; qks: [(q, k)] with q, k [B, NH, T, dqk] (detached)."""
    B, T, _ = index_scores.shape
    if allowed is None:
        allowed = torch.ones(T, T, dtype=torch.bool, device=index_scores.device).tril().expand(B, T, T)
    with torch.no_grad():
        p = torch.zeros(B, T, T, dtype=torch.float32, device=index_scores.device)
        for q0 in range(0, T, chunk):
            q1 = min(T, q0 + chunk)
            m = allowed[:, None, q0:q1]                                          # [B, 1, c, T]
            for q, k in qks:
                s = (q[:, :, q0:q1] @ k.transpose(-1, -2)).float() * scale       # [B, NH, c, T]
                p[:, q0:q1] += s.masked_fill(~m, float("-inf")).softmax(-1).sum(1)
        p = p / p.sum(-1, keepdim=True)
    logq = index_scores.float().masked_fill(~allowed, float("-inf")).log_softmax(-1).masked_fill(~allowed, 0.0)
    kl = (torch.xlogy(p, p) - p * logq).sum(-1)                                  # [B, T]
    if query_weights is None:
        return kl.mean()
    w = query_weights.float()
    return (kl * w).sum() / w.sum().clamp_min(1e-6)
