// Analytic cost of one GLM-DSA token (model-spec §2.5, §3.2, §4.3, §6; anchors §2).
//
// Counting conventions (docs/cost.md has the worked GLM-5.2 numbers):
// - One multiply-add = 2 FLOPs. A linear layer [out, in] applied to one token costs 2·out·in FLOPs.
// - Decode token at position L: the indexer of every full layer scans L cached keys (the new token's key is
//   written first, model-spec §3.2); every layer attends to min(L, index_topk) latent rows.
// - Indexer scan per candidate and full layer: q·k for every head (2·n_head_indexer·d_indexer), ReLU (1 per
//   head) and the weighted head sum (a multiply-add, 2 per head). Top-k selection, scales and RoPE are
//   comparisons/elementwise work and are not counted. Indexer projections wq_b, wk, weights_proj are counted
//   in the indexer part, on full layers only (shared layers own no indexer weights).
// - Sparse attention in the weight-absorbed form (§2.5), per selected token and head: QK over
//   d_latent = kv_lora + rope (2·d_latent) and PV over kv_lora (2·kv_lora). Softmax is not counted.
// - Dense/other: MLA projections q_a, q_b, kv_a, o_proj, the absorptions W_UK (per head nope → kv_lora) and
//   W_UV (per head kv_lora → v), dense SwiGLU (3 matrices) on dense layers, MoE router + routed experts +
//   shared experts on MoE layers, LM head. Norms, RoPE, activations and the embedding lookup are not counted.
//   These are exactly 2 FLOPs per active parameter outside the indexer (GLM-5.2: 2 · 40.10 B).
// - Prefill of L tokens: the token at position p (0-based) scans p+1 candidates and attends to
//   min(p+1, index_topk); reported as the average per token, in the same absorbed form as decode.
// - The MTP layers (num_nextn_predict_layers) are excluded from FLOPs and bytes; their KV is reported apart.
// - Bytes per decode token: every active weight once. With a quantization_config: 1 B/param (FP8 e4m3; the
//   fp32 128×128 block scales, +0.02%, are ignored), except the tensors the FP8 checkpoint keeps in BF16
//   (lm_head, MoE router gate, indexer weights_proj: 2 B, model-spec §7.2). Without one: 2 B/param (BF16).
//   KV read: one FP8 latent row per selected token per layer plus one FP8 indexer key per scanned token per
//   full layer.
// - FP8 cache rows (§6): latent = kv_lora e4m3 + one fp32 scale per 128 of kv_lora + rope bf16
//   (656 B for 512 + 64); indexer key = d_indexer e4m3 + one fp32 scale (132 B for 128).
//
// Why 782/285 and not the anchors' 772/283 GFLOP at 1M: the anchors count only 2·32·128·L per full layer
// for the indexer; here the ReLU/weighting terms (+96·L, +1.2%) and the indexer projections (+19 MFLOP per
// full layer) are counted too. The ratio moves from 2.73 to 2.74; with exactly one full layer in four it is
// 2.87, the published "2.9×".
#include "model/cost.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megactx {
namespace {

// Parameter counts on one token's path, per layer except lm_head (doubles: every figure is a product of counts
// that is only ever used in floating point).
struct LayerParams {
    double mla_proj = 0;     // q_a, q_b, kv_a, o_proj
    double absorb = 0;       // W_UK + W_UV (= kv_b_proj)
    double indexer = 0;      // wq_b + wk (FP8 in the FP8 ckpt)
    double indexer_w = 0;    // weights_proj (BF16 in the FP8 ckpt)
    double dense_mlp = 0;    // gate, up, down of the dense SwiGLU
    double moe_experts = 0;  // (experts per token + shared) · 3 matrices
    double router = 0;       // mlp.gate (BF16 in the FP8 ckpt)
    double lm_head = 0;      // (BF16 in the FP8 ckpt)
};

LayerParams layer_params(const ModelConfig& c) {
    const double d = static_cast<double>(c.hidden_size);
    const double h = static_cast<double>(c.n_head);
    LayerParams p;
    p.mla_proj = d * c.q_lora_rank                                                   // q_a: [q_lora, d]
                 + static_cast<double>(c.q_lora_rank) * h * c.qk_head_dim()          // q_b: [H·qk_head, q_lora]
                 + d * c.d_latent()                                                  // kv_a: [kv_lora + rope, d]
                 + h * c.v_head_dim * d;                                             // o_proj: [d, H·v]
    p.absorb = h * c.qk_nope_head_dim * c.kv_lora_rank                               // W_UK: per head [nope, kv_lora]
               + h * c.kv_lora_rank * c.v_head_dim;                                  // W_UV: per head [v, kv_lora]
    p.indexer = static_cast<double>(c.q_lora_rank) * c.n_head_indexer * c.d_indexer  // wq_b: [n_hi·d_i, q_lora]
                + d * c.d_indexer;                                                   // wk: [d_i, d]
    p.indexer_w = d * c.n_head_indexer;                                              // weights_proj: [n_hi, d]
    p.dense_mlp = 3.0 * d * c.intermediate_size;
    p.moe_experts = 3.0 * d * c.moe_intermediate_size * static_cast<double>(c.n_experts_per_tok + c.n_shared_experts);
    p.router = d * c.n_routed_experts;
    p.lm_head = d * c.vocab_size;
    return p;
}

// Everything that does not depend on the indexer layout, then one breakdown per count of full layers.
struct Model {
    const ModelConfig& c;
    LayerParams p;
    double n_dense = 0, n_moe = 0;
    double bf16_bytes = 2, fp8_bytes = 2;  // bytes per parameter of BF16-kept tensors / of quantized tensors
    double latent_row = 0, indexer_row = 0;

    // Weights with no indexer: MLA + absorptions on every layer, MLP/MoE, LM head.
    double base_params() const {
        return c.n_layers * (p.mla_proj + p.absorb) + n_dense * p.dense_mlp + n_moe * (p.moe_experts + p.router) +
               p.lm_head;
    }
    double base_weight_bytes() const {
        return (c.n_layers * (p.mla_proj + p.absorb) + n_dense * p.dense_mlp + n_moe * p.moe_experts) * fp8_bytes +
               (n_moe * p.router + p.lm_head) * bf16_bytes;
    }
    // Per full layer and candidate token: q·k for every head, ReLU, weighted head sum.
    double scan_flops() const { return 2.0 * c.n_head_indexer * c.d_indexer + 3.0 * c.n_head_indexer; }
    // Per layer and selected token: QK over d_latent and PV over kv_lora, every head.
    double attend_flops() const { return 2.0 * c.n_head * (c.d_latent() + c.kv_lora_rank); }

    CostBreakdown breakdown(double n_full, double L) const {
        const double topk = static_cast<double>(c.index_topk);
        const double n_layers = static_cast<double>(c.n_layers);
        const double selected = std::min(L, topk);
        // Prefill: Σ_{p<L} (p+1) = L(L+1)/2 candidates; Σ_{p<L} min(p+1, K) selected.
        const double avg_candidates = (L + 1) / 2;
        const double avg_selected = L <= topk ? (L + 1) / 2 : (topk * (topk + 1) / 2 + (L - topk) * topk) / L;
        const double indexer_proj = 2.0 * (p.indexer + p.indexer_w);

        CostBreakdown b;
        b.n_full_layers = n_full;
        b.dense_flops = 2.0 * base_params();
        b.indexer_flops = n_full * (indexer_proj + scan_flops() * L);
        b.attention_flops = n_layers * attend_flops() * selected;
        b.decode_flops = b.dense_flops + b.indexer_flops + b.attention_flops;
        b.prefill_indexer_flops = n_full * (indexer_proj + scan_flops() * avg_candidates);
        b.prefill_attention_flops = n_layers * attend_flops() * avg_selected;
        b.prefill_flops_avg = b.dense_flops + b.prefill_indexer_flops + b.prefill_attention_flops;

        b.decode_weight_bytes = base_weight_bytes() + n_full * (p.indexer * fp8_bytes + p.indexer_w * bf16_bytes);
        b.decode_kv_bytes = n_layers * selected * latent_row + n_full * L * indexer_row;
        b.decode_bytes = b.decode_weight_bytes + b.decode_kv_bytes;
        b.kv_bytes_per_token = n_layers * latent_row + n_full * indexer_row;
        b.kv_bytes_per_seq = b.kv_bytes_per_token * L;
        return b;
    }
};

std::string gflop(double x) { return fmt::format("{:.2f}", x / 1e9); }
std::string gbyte(double x) { return fmt::format("{:.3f}", x / 1e9); }

nlohmann::json breakdown_json(const CostBreakdown& b) {
    return {{"n_full_layers", b.n_full_layers},
            {"decode_flops", b.decode_flops},
            {"decode_indexer_flops", b.indexer_flops},
            {"decode_attention_flops", b.attention_flops},
            {"decode_dense_flops", b.dense_flops},
            {"prefill_flops_avg", b.prefill_flops_avg},
            {"prefill_indexer_flops_avg", b.prefill_indexer_flops},
            {"prefill_attention_flops_avg", b.prefill_attention_flops},
            {"decode_bytes", b.decode_bytes},
            {"decode_weight_bytes", b.decode_weight_bytes},
            {"decode_kv_bytes", b.decode_kv_bytes},
            {"kv_bytes_per_token", b.kv_bytes_per_token},
            {"kv_bytes_per_seq", b.kv_bytes_per_seq}};
}

}  // namespace

CostReport compute_cost(const ModelConfig& c, int64_t context) {
    MEGACTX_CHECK(c.model_type == "glm_moe_dsa" || c.model_type == "deepseek_v32",
                  "cost: model_type '{}' is not supported (expected glm_moe_dsa or deepseek_v32)", c.model_type);
    MEGACTX_CHECK(context >= 1, "cost: --context must be at least 1, got {}", context);
    MEGACTX_CHECK(static_cast<int64_t>(c.layer_full.size()) == c.n_layers &&
                      static_cast<int64_t>(c.layer_moe.size()) == c.n_layers,
                  "cost: config has an unresolved layer layout");

    Model m{c, layer_params(c)};
    for (int64_t i = 0; i < c.n_layers; ++i) (c.is_moe(i) ? m.n_moe : m.n_dense) += 1;
    const bool fp8 = !c.quant_method.empty();
    m.fp8_bytes = fp8 ? 1 : 2;
    m.latent_row = static_cast<double>(c.kv_lora_rank + 4 * ((c.kv_lora_rank + 127) / 128) + 2 * c.qk_rope_head_dim);
    m.indexer_row = static_cast<double>(c.d_indexer + 4);

    CostReport r;
    r.model_type = c.model_type;
    r.context = context;
    r.n_layers = c.n_layers;
    r.n_full_layers = c.n_full_layers();
    r.n_mtp_layers = c.n_mtp_layers;
    r.index_topk = c.index_topk;
    r.indexer_source = c.indexer_source;
    r.active_params = m.base_params() + r.n_full_layers * (m.p.indexer + m.p.indexer_w);
    r.fp8_weights = fp8;
    r.quant_method = c.quant_method;
    r.latent_row_bytes = m.latent_row;
    r.indexer_row_bytes = m.indexer_row;
    r.kv_bytes_per_token_mtp = static_cast<double>(c.n_mtp_layers) * (m.latent_row + m.indexer_row);

    const double L = static_cast<double>(context);
    r.index_share = m.breakdown(static_cast<double>(r.n_full_layers), L);
    r.all_full = m.breakdown(static_cast<double>(c.n_layers), L);
    r.quarter = m.breakdown(static_cast<double>(c.n_layers) / 4, L);
    r.decode_ratio = r.all_full.decode_flops / r.index_share.decode_flops;
    r.prefill_ratio = r.all_full.prefill_flops_avg / r.index_share.prefill_flops_avg;
    r.quarter_decode_ratio = r.all_full.decode_flops / r.quarter.decode_flops;
    r.quarter_prefill_ratio = r.all_full.prefill_flops_avg / r.quarter.prefill_flops_avg;
    return r;
}

std::string format_cost(const CostReport& r, bool as_json) {
    const std::string weights =
        r.fp8_weights ? fmt::format(
                            "FP8 (quantization_config quant_method '{}'): 1 B/param, block scales ignored; "
                            "lm_head, router gate, indexer weights_proj BF16: 2 B/param",
                            r.quant_method)
                      : std::string("BF16 (no quantization_config): 2 B/param");
    if (as_json) {
        nlohmann::json j = {{"model_type", r.model_type},
                            {"context", r.context},
                            {"n_layers", r.n_layers},
                            {"n_full_layers", r.n_full_layers},
                            {"n_mtp_layers_excluded", r.n_mtp_layers},
                            {"index_topk", r.index_topk},
                            {"indexer_source", r.indexer_source},
                            {"active_params", r.active_params},
                            {"weights", weights},
                            {"latent_row_bytes", r.latent_row_bytes},
                            {"indexer_row_bytes", r.indexer_row_bytes},
                            {"kv_bytes_per_token_mtp", r.kv_bytes_per_token_mtp},
                            {"index_share", breakdown_json(r.index_share)},
                            {"all_full", breakdown_json(r.all_full)},
                            {"one_in_four", breakdown_json(r.quarter)},
                            {"decode_ratio", r.decode_ratio},
                            {"prefill_ratio", r.prefill_ratio},
                            {"one_in_four_decode_ratio", r.quarter_decode_ratio},
                            {"one_in_four_prefill_ratio", r.quarter_prefill_ratio}};
        return j.dump(2) + "\n";
    }

    const CostBreakdown& s = r.index_share;
    const CostBreakdown& f = r.all_full;
    std::string out;
    auto line = [&out](const std::string& name, const std::string& a, const std::string& b, const std::string& x) {
        out += fmt::format("{:<42}{:>14}{:>14}{:>12}\n", name, a, b, x);
    };
    auto ratio = [](double a, double b) { return fmt::format("{:.2f}x", a / b); };
    out += fmt::format("megactx cost: {}, {} layers ({} with a full indexer, from {}), context L = {}\n", r.model_type,
                       r.n_layers, r.n_full_layers, r.indexer_source, r.context);
    out += fmt::format(
        "conventions: multiply-add = 2 FLOPs; decode token at position L scans L indexer keys per full layer and "
        "attends to min(L, {}) = {} tokens per layer;\n"
        "  MTP layers ({}) excluded from FLOPs and bytes; G = 1e9\n",
        r.index_topk, std::min<int64_t>(r.context, r.index_topk), r.n_mtp_layers);
    out += fmt::format("weights: {}\n", weights);
    out += fmt::format("active parameters per token: {:.2f} B (excl. embedding and MTP; IndexShare layout)\n\n",
                       r.active_params / 1e9);
    line("", "IndexShare", "all-full", "ratio");
    line("full-indexer layers", fmt::format("{}", r.n_full_layers), fmt::format("{}", r.n_layers), "");
    line("decode GFLOP/token", gflop(s.decode_flops), gflop(f.decode_flops), ratio(f.decode_flops, s.decode_flops));
    line("  indexer", gflop(s.indexer_flops), gflop(f.indexer_flops), "");
    line("  sparse attention", gflop(s.attention_flops), gflop(f.attention_flops), "");
    line("  dense/other", gflop(s.dense_flops), gflop(f.dense_flops), "");
    line("prefill GFLOP/token (avg over L)", gflop(s.prefill_flops_avg), gflop(f.prefill_flops_avg),
         ratio(f.prefill_flops_avg, s.prefill_flops_avg));
    line("  indexer", gflop(s.prefill_indexer_flops), gflop(f.prefill_indexer_flops), "");
    line("  sparse attention", gflop(s.prefill_attention_flops), gflop(f.prefill_attention_flops), "");
    line("  dense/other", gflop(s.dense_flops), gflop(f.dense_flops), "");
    line("decode GB read/token", gbyte(s.decode_bytes), gbyte(f.decode_bytes), ratio(f.decode_bytes, s.decode_bytes));
    line("  weights", gbyte(s.decode_weight_bytes), gbyte(f.decode_weight_bytes), "");
    line("  KV (latent rows + indexer keys)", gbyte(s.decode_kv_bytes), gbyte(f.decode_kv_bytes), "");
    auto bytes = [](double x) { return fmt::format("{}", static_cast<int64_t>(x)); };
    line(fmt::format("KV bytes/token ({} B latent, {} B indexer)", bytes(r.latent_row_bytes),
                     bytes(r.indexer_row_bytes)),
         bytes(s.kv_bytes_per_token), bytes(f.kv_bytes_per_token), ratio(f.kv_bytes_per_token, s.kv_bytes_per_token));
    line("KV GB per sequence of L tokens", gbyte(s.kv_bytes_per_seq), gbyte(f.kv_bytes_per_seq), "");
    out += fmt::format("\nMTP layers ({}): +{} B KV per token, excluded from everything above\n", r.n_mtp_layers,
                       bytes(r.kv_bytes_per_token_mtp));
    out += fmt::format(
        "with exactly one full layer in four ({} of {}): decode {} GFLOP, ratio {:.2f}x; prefill ratio {:.2f}x\n",
        r.quarter.n_full_layers, r.n_layers, gflop(r.quarter.decode_flops), r.quarter_decode_ratio,
        r.quarter_prefill_ratio);
    return out;
}

}  // namespace megactx
