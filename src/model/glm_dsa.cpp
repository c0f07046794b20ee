// GLM-5.x forward pass (model-spec §1.2, §2.6): per layer
//   xn = RMSNorm_in(x)
//   MLA:   qr = RMSNorm(q_a(xn)); q = q_b(qr); [c | k_pe] = kv_a(xn); c = RMSNorm(c); RoPE(k_pe), RoPE(q_pe)
//          write [c | k_pe] at the token's slot
//   DSA:   full layer: indexer keys written, scores over the cached tokens, top-k slots → shared buffer
//          shared layer: reuse the buffer (IndexShare, model-spec §4)
//   attn:  q_abs = q_nope · W_UK; sparse softmax over the selected slots; · W_UV; o_proj
//   FFN:   dense SwiGLU or MoE (sigmoid router, bias for choice, renormalise, scale, shared expert)
// then final RMSNorm and the LM head.
#include "model/glm_dsa.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "model/tap.h"

namespace megactx {

namespace {

constexpr float kLatentNormEps = 1e-6f;  // q_a_layernorm / kv_a_layernorm (model-spec §2.7)
constexpr float kIndexerNormEps = 1e-6f;

std::string layer_prefix(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

MlpWeights load_mlp(const TensorStore& s, const std::string& prefix, int64_t d_model, int64_t d_ff) {
    MlpWeights m;
    m.gate = load_weight(s, prefix + "gate_proj.weight", d_ff, d_model);
    m.up = load_weight(s, prefix + "up_proj.weight", d_ff, d_model);
    m.down = load_weight(s, prefix + "down_proj.weight", d_model, d_ff);
    return m;
}

}  // namespace

GlmDsaModel::GlmDsaModel(const std::string& dir) : config_(load_config(dir)) {
    load(std::make_unique<TensorStore>(dir));
}

GlmDsaModel::GlmDsaModel(const std::string& dir, const ShardPlan& plan, int rank, Comm& comm)
    : config_(load_config(dir)) {
    set_shard(plan, rank, comm);
    load(std::make_unique<TensorStore>(dir));
}

GlmDsaModel::GlmDsaModel(const ModelConfig& config, std::unique_ptr<TensorStore> store, const ShardPlan* plan, int rank,
                         Comm* comm)
    : config_(config) {
    if (plan) {
        MEGACTX_CHECK(comm != nullptr, "tensor parallel: a shard plan needs a communicator");
        set_shard(*plan, rank, *comm);
    }
    load(std::move(store));
}

void GlmDsaModel::set_shard(const ShardPlan& plan, int rank, Comm& comm) {
    shard_plan_ = std::make_unique<ShardPlan>(plan);
    comm_ = &comm;
    // The communicator joins the ranks of this rank's pipeline stage (all of them without pipeline parallelism).
    const int64_t g = static_cast<int64_t>(plan.ranks.size()), tp = plan.options.n_gpus;
    MEGACTX_CHECK(rank >= 0 && rank < g && comm.size() == tp && comm.rank() == rank % tp,
                  "tensor parallel: rank {} of a {}-rank plan ({} a stage), communicator rank {} of {}", rank, g, tp,
                  comm.rank(), comm.size());
    MEGACTX_CHECK(!(plan.options.indexer_split && plan.options.layer_split && g > 1),
                  "tensor parallel: --indexer-split and --layer-split exclude each other (under LayerSplit only the "
                  "owner of a layer holds its indexer keys, and it runs the whole indexer)");
    shard_ = &shard_plan_->ranks[static_cast<size_t>(rank)];
}

void GlmDsaModel::load(std::unique_ptr<TensorStore> store) {
    store_ = std::move(store);
    const TensorStore& s = *store_;
    const ModelConfig& c = config_;
    rope_attention_ = c.attention_rope();
    rope_indexer_ = c.indexer_rope();
    const int64_t H = c.hidden_size;
    // The shard of this rank (tensor parallel), or everything.
    RankPlan all;
    all.heads = {0, c.n_head};
    all.dense_ff = {0, c.intermediate_size};
    all.experts = {0, c.n_routed_experts};
    all.expert_ff = {0, c.moe_intermediate_size};
    all.shared_ff = {0, c.n_shared_experts * c.moe_intermediate_size};
    all.vocab = {0, c.vocab_size};
    all.indexer_heads = {0, c.n_head_indexer};
    const RankPlan& sh = shard_ ? *shard_ : all;
    n_head_local_ = sh.heads.size();
    const auto rows = [](const Weight& w, Range r, int64_t per) {  // rows [r.begin·per, r.end·per)
        return slice_weight(w, r.begin * per, r.end * per, 0, w.cols);
    };
    const auto cols = [](const Weight& w, Range r, int64_t per) {
        return slice_weight(w, 0, w.rows, r.begin * per, r.end * per);
    };
    // SwiGLU split by intermediate columns: gate/up rows, down columns.
    const auto mlp_shard = [&](const std::string& prefix, int64_t d_ff, Range ff) {
        MlpWeights m = load_mlp(s, prefix, H, d_ff);
        m.gate = rows(m.gate, ff, 1);
        m.up = rows(m.up, ff, 1);
        m.down = cols(m.down, ff, 1);
        return m;
    };

    // Pipeline parallel: the first stage embeds, the last holds the final norm, the LM head and the MTP layers
    // (with their own embedding); a stage loads its layers only.
    const bool first_stage = !shard_ || shard_->stage == 0;
    const bool last_stage = !shard_ || shard_->stage == shard_plan_->options.pp - 1;
    const auto stage_holds = [&](int64_t layer) { return !shard_ || sh.layers.contains(layer); };
    if (first_stage || last_stage) embed_ = load_weight(s, "model.embed_tokens.weight", c.vocab_size, H);
    if (last_stage) {
        final_norm_ = load_vector(s, "model.norm.weight", H);
        if (s.has("lm_head.weight") || !c.tie_word_embeddings) {
            lm_head_ = load_weight(s, "lm_head.weight", c.vocab_size, H);
        } else {
            lm_head_ = embed_;
        }
        lm_head_ = rows(lm_head_, sh.vocab, 1);
    }

    // MTP layers are loaded when the checkpoint has them (transformers' save_pretrained drops them).
    for (int64_t m = 0; m < c.n_mtp_layers; ++m) {
        if (!s.has(layer_prefix(c.n_layers + m) + "eh_proj.weight")) break;
        ++n_mtp_loaded_;
    }
    const int64_t n_total = c.n_layers + n_mtp_loaded_;
    layers_.resize(static_cast<size_t>(n_total));
    for (int64_t i = 0; i < n_total; ++i) {
        LayerWeights& L = layers_[static_cast<size_t>(i)];
        const std::string p = layer_prefix(i);
        L.full = c.is_full(i);
        L.moe = c.is_moe(i);
        if (!stage_holds(i)) continue;  // another pipeline stage's layer
        L.input_norm = load_vector(s, p + "input_layernorm.weight", H);
        L.post_norm = load_vector(s, p + "post_attention_layernorm.weight", H);
        const std::string a = p + "self_attn.";
        L.q_a = load_weight(s, a + "q_a_proj.weight", c.q_lora_rank, H);
        L.q_a_norm = load_vector(s, a + "q_a_layernorm.weight", c.q_lora_rank);
        L.q_b = rows(load_weight(s, a + "q_b_proj.weight", c.n_head * c.qk_head_dim(), c.q_lora_rank), sh.heads,
                     c.qk_head_dim());
        L.kv_a = load_weight(s, a + "kv_a_proj_with_mqa.weight", c.d_latent(), H);
        L.kv_a_norm = load_vector(s, a + "kv_a_layernorm.weight", c.kv_lora_rank);
        L.kv_b =
            rows(load_weight(s, a + "kv_b_proj.weight", c.n_head * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
                 sh.heads, c.qk_nope_head_dim + c.v_head_dim);
        L.o = cols(load_weight(s, a + "o_proj.weight", H, c.n_head * c.v_head_dim), sh.heads, c.v_head_dim);
        if (L.full) {  // indexer tensors on shared layers, if a checkpoint ships them, are ignored
            const std::string x = a + "indexer.";
            L.indexer.wq_b = rows(load_weight(s, x + "wq_b.weight", c.n_head_indexer * c.d_indexer, c.q_lora_rank),
                                  sh.indexer_heads, c.d_indexer);
            L.indexer.wk = load_weight(s, x + "wk.weight", c.d_indexer, H);
            L.indexer.k_norm_w = load_vector(s, x + "k_norm.weight", c.d_indexer);
            L.indexer.k_norm_b = load_vector(s, x + "k_norm.bias", c.d_indexer);
            L.indexer.weights_proj =
                rows(load_weight(s, x + "weights_proj.weight", c.n_head_indexer, H), sh.indexer_heads, 1);
        }
        if (L.moe) {
            L.router = load_weight(s, p + "mlp.gate.weight", c.n_routed_experts, H);
            L.router_bias = s.has(p + "mlp.gate.e_score_correction_bias")
                                ? load_vector(s, p + "mlp.gate.e_score_correction_bias", c.n_routed_experts)
                                : std::vector<float>(static_cast<size_t>(c.n_routed_experts), 0.0f);
            // Experts another rank holds (expert parallel) stay empty: moe_experts skips them.
            L.experts.resize(static_cast<size_t>(c.n_routed_experts));
            for (int64_t e = sh.experts.begin; e < sh.experts.end; ++e) {
                L.experts[static_cast<size_t>(e)] =
                    mlp_shard(p + "mlp.experts." + std::to_string(e) + ".", c.moe_intermediate_size, sh.expert_ff);
            }
            if (c.n_shared_experts > 0) {
                L.shared_expert =
                    mlp_shard(p + "mlp.shared_experts.", c.moe_intermediate_size * c.n_shared_experts, sh.shared_ff);
                L.has_shared_expert = true;
            }
        } else {
            L.mlp = mlp_shard(p + "mlp.", c.intermediate_size, sh.dense_ff);
        }
        if (i >= c.n_layers) {
            L.enorm = load_vector(s, p + "enorm.weight", H);
            L.hnorm = load_vector(s, p + "hnorm.weight", H);
            L.head_norm = load_vector(s, p + "shared_head.norm.weight", H);
            L.eh_proj = load_weight(s, p + "eh_proj.weight", H, 2 * H);
        }
    }
}

void GlmDsaModel::check_batch(const Batch& b) const {
    MEGACTX_CHECK(b.n_tokens() > 0, "batch is empty");
    for (int64_t i = 0; i < b.n_tokens(); ++i) {
        MEGACTX_CHECK(b.tokens[i] >= 0 && b.tokens[i] < config_.vocab_size,
                      "token id {} at index {} is out of range (vocabulary size {})", b.tokens[i], i,
                      config_.vocab_size);
        MEGACTX_CHECK(b.pos[i] >= 0 && b.pos[i] < config_.max_position_embeddings,
                      "position {} exceeds the model's context (max_position_embeddings = {})", b.pos[i],
                      config_.max_position_embeddings);
    }
}

std::unique_ptr<GlmDsaModel::TierStep> GlmDsaModel::begin_tiers(Ops& ops, const BatchPlan& plan, KvCache& kv,
                                                                int64_t n) const {
    if (!kv.tiered()) return nullptr;
    MEGACTX_CHECK(!kv.tiers_dirty(), "tiered KV: blocks moved since the last KvCache::flush_tiers");
    auto t = std::make_unique<TierStep>();
    t->write_device = ops.alloc(DType::I32, {n});
    t->write_host = ops.alloc(DType::I32, {n});
    ops.kv_split_slots(plan.write_slots, kv.tier_loc(), t->write_device, t->write_host);
    t->slots = ops.alloc(DType::I32, {n, config_.index_topk});
    t->fetch = ops.alloc(DType::I32, {n * config_.index_topk});
    return t;
}

int64_t GlmDsaModel::selection_readers(int64_t i_layer) const {
    int64_t n = 1;
    if (i_layer >= config_.n_layers) return n;  // an MTP layer reads its own selection
    while (i_layer + n < config_.n_layers && !config_.is_full(i_layer + n)) ++n;
    return n;
}

void GlmDsaModel::stage_rows(Ops& ops, int64_t i_layer, KvCache& kv, const Tensor& topk, TierStep& tier) const {
    const int64_t n = topk.dim(0), k = topk.dim(1);
    if (!tier.resolved) {  // once per selection: every layer reading it finds the same rows in the same places
        KvResolveParams rp;
        rp.slots = &topk;
        rp.loc = &kv.tier_loc();
        rp.staging_base = kv.staging_base();
        rp.rows_per_pass = kv.rows_per_pass();
        rp.weight = static_cast<int32_t>(selection_readers(i_layer));
        rp.device_slots = &tier.slots;
        rp.fetch = &tier.fetch;
        rp.block_hits = &kv.tier_hits();
        ops.kv_resolve(rp);
        tier.resolved = true;
    }
    tier.ticket = -1;
    if (n > kv.rows_per_pass()) return;  // staged pass by pass in sparse_attention
    Tensor staging = row_range(kv.latent(i_layer), kv.staging_base(), kv.staging_base() + n * k);
    tier.ticket = ops.kv_fetch_rows_async(kv.host_latent(i_layer), tier.fetch, staging);
}

void GlmDsaModel::sparse_attention(Ops& ops, int64_t i_layer, KvCache& kv, const Tensor& topk, TierStep* tier,
                                   SparseMlaParams sp) const {
    if (!tier) {
        sp.slots = &topk;
        ops.sparse_mla(sp);
        return;
    }
    MEGACTX_CHECK(tier->resolved, "tiered KV: layer {} attends before stage_rows", i_layer);
    const int64_t n = topk.dim(0), k = topk.dim(1), R = kv.rows_per_pass();
    if (tier->ticket >= 0) {  // one pass, staged by stage_rows
        ops.kv_fetch_wait(tier->ticket);
        sp.slots = &tier->slots;
        ops.sparse_mla(sp);
        return;
    }
    Tensor& pool = kv.latent(i_layer);
    sp.plan_rows = n;
    const SparseMlaParams whole = sp;
    for (int64_t r0 = 0; r0 < n; r0 += R) {  // the staging rows hold R query rows' selections at a time
        const int64_t r1 = std::min(n, r0 + R);
        Tensor staging = row_range(pool, kv.staging_base(), kv.staging_base() + (r1 - r0) * k);
        ops.kv_fetch_rows(kv.host_latent(i_layer), row_range(tier->fetch, r0 * k, r1 * k), staging);
        const Tensor q = row_range(*whole.q, r0, r1), slots = row_range(tier->slots, r0, r1);
        Tensor out = row_range(*whole.out, r0, r1);
        sp.q = &q;
        sp.slots = &slots;
        sp.out = &out;
        ops.sparse_mla(sp);
    }
}

void GlmDsaModel::attention(Ops& ops, int64_t i_layer, const Tensor& xn, const BatchPlan& plan, KvCache& kv,
                            Tensor& topk, bool run_indexer, TierStep* tier, Tensor& out) const {
    const ModelConfig& c = config_;
    const LayerWeights& L = layers_[static_cast<size_t>(i_layer)];
    const int64_t n = xn.dim(0), n_head = n_head_local_, r = c.kv_lora_rank;

    // LayerSplit (design.md §6): only the owner of this layer's KV stores the row, runs the indexer and the
    // sparse attention (for every rank's heads); the others send their queries and receive their heads' output.
    const int owner = kv_owner(i_layer);
    const bool holds_kv = owner < 0 || owner == comm_->rank();

    // the token's cache row [RMSNorm(c) | RoPE(k_pe)], normalised, rotated and stored in one fused op
    if (holds_kv) {
        Tensor kv_a = ops.alloc(DType::F32, {n, c.d_latent()});  // [n, kv_lora_rank + rope] raw
        ops.linear(xn, L.kv_a, kv_a);
        if (tier) {  // each row goes to the pool its block lives in
            ops.latent_cache_write(kv_a, L.kv_a_norm, kLatentNormEps, plan.pos, rope_attention_, tier->write_device,
                                   kv.latent(i_layer));
            ops.latent_cache_write(kv_a, L.kv_a_norm, kLatentNormEps, plan.pos, rope_attention_, tier->write_host,
                                   kv.host_latent(i_layer));
        } else {
            ops.latent_cache_write(kv_a, L.kv_a_norm, kLatentNormEps, plan.pos, rope_attention_, plan.write_slots,
                                   kv.latent(i_layer));
        }
        tap(ops, kv_a, "kv_a_raw", i_layer);
        // Tiered KV, a layer that reads an earlier layer's selection: its host rows are gathered now, after its
        // own new rows are stored (one of them may be selected), under the query projections below.
        if (tier && !run_indexer) stage_rows(ops, i_layer, kv, topk, *tier);
    }

    // q latent (also the indexer's query input) and the per-head query
    Tensor qa = ops.alloc(DType::F32, {n, c.q_lora_rank});
    ops.linear(xn, L.q_a, qa);
    Tensor qr = ops.alloc(DType::F32, {n, c.q_lora_rank});  // [n, q_lora_rank]
    ops.rms_norm(qa, L.q_a_norm, kLatentNormEps, qr);
    Tensor q = ops.alloc(DType::F32, {n, n_head, c.qk_head_dim()});  // [n, n_head, nope | rope]
    ops.linear(qr, L.q_b, q);
    ops.rope(q, c.qk_nope_head_dim, plan.pos, rope_attention_);
    tap(ops, qr, "q_latent", i_layer);
    tap(ops, q, "q", i_layer);

    // DSA indexer on full layers; shared layers keep `topk` from the last full layer
    if (run_indexer && holds_kv) {
        const IndexerWeights& X = L.indexer;
        const int64_t n_ih = X.weights_proj.rows;  // indexer heads of this rank (all unless split by heads)
        Tensor iq = ops.alloc(DType::F32, {n, n_ih, c.d_indexer});  // [n, n_ih, d_indexer]
        ops.linear(qr, X.wq_b, iq);
        ops.rope(iq, 0, plan.pos, rope_indexer_);                 // RoPE on the first qk_rope_head_dim dims
        Tensor ik_raw = ops.alloc(DType::F32, {n, c.d_indexer});  // [n, d_indexer] before LayerNorm and RoPE
        ops.linear(xn, X.wk, ik_raw);
        ops.indexer_cache_write(ik_raw, X.k_norm_w, X.k_norm_b, kIndexerNormEps, plan.pos, rope_indexer_,
                                plan.write_slots, kv.indexer_keys(i_layer), c.indexer_hadamard);
        Tensor gates = ops.alloc(DType::F32, {n, n_ih});  // [n, n_ih]
        ops.linear(xn, X.weights_proj, gates);
        IndexerTopkParams ip;
        ip.q = &iq;
        ip.weights = &gates;
        ip.keys = &kv.indexer_keys(i_layer);
        ip.map = plan.map;
        ip.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.d_indexer));
        ip.head_scale = 1.0f / std::sqrt(static_cast<float>(c.n_head_indexer));
        ip.topk = c.index_topk;
        ip.hadamard = c.indexer_hadamard;
        ip.out_slots = &topk;
        if (n_ih < c.n_head_indexer) {  // split by heads: each rank's scores are a partial sum over its heads
            ip.reduce_scores = [this](float* scores, int64_t count) {
                Tensor view;
                view.data = scores;
                view.dtype = DType::F32;
                view.shape = {count};
                comm_->all_reduce_sum(view);
            };
        }
        ops.indexer_topk(ip);
        if (tier) {  // a new selection: resolved, and this layer's host rows gathered under the q absorption
            tier->resolved = false;
            stage_rows(ops, i_layer, kv, topk, *tier);
        }
        tap(ops, iq, "indexer_q", i_layer);
        tap(ops, ik_raw, "indexer_k_raw", i_layer);
        tap(ops, gates, "indexer_gates", i_layer);
    }
    if (run_indexer && owner >= 0) {
        comm_->broadcast(topk, owner);  // every rank keeps the IndexShare buffer
        // Tiered KV: a rank holding later layers of this group resolves the new selection in its own tiers.
        if (tier && !holds_kv) tier->resolved = false;
    }

    // absorbed sparse MLA over exactly the selected slots
    Tensor q_lat = ops.alloc(DType::F32, {n, n_head, c.d_latent()});  // [n, n_head, kv_lora_rank + rope]
    ops.mla_absorb_q(q, L.kv_b, c.qk_nope_head_dim, c.v_head_dim, q_lat);
    Tensor lat = ops.alloc(DType::F32, {n, n_head, r});  // [n, n_head, kv_lora_rank]
    SparseMlaParams sp;
    sp.cache = holds_kv ? &kv.latent(i_layer) : nullptr;
    sp.slots = &topk;  // (tiered: sparse_attention reads the resolved rows instead)
    sp.d_v = r;
    sp.scale = c.attention_softmax_scale();  // qk_head_dim^-0.5, times mscale² under YaRN
    if (owner < 0) {
        sp.q = &q_lat;
        sp.out = &lat;
        sparse_attention(ops, i_layer, kv, topk, tier, sp);
    } else {
        Tensor q_all = ops.alloc(DType::F32, {n, c.n_head, c.d_latent()});  // [n, n_head (all ranks), d_latent]
        comm_->all_gather_cols(q_lat, q_all);
        Tensor lat_all = ops.alloc(DType::F32, {n, c.n_head, r});  // [n, n_head (all ranks), kv_lora_rank]
        if (holds_kv) {
            sp.q = &q_all;
            sp.out = &lat_all;
            sparse_attention(ops, i_layer, kv, topk, tier, sp);
        }
        comm_->broadcast(lat_all, owner);
        Tensor all_2d = lat_all, mine_2d = lat;  // [n, heads · r] views: this rank's heads are a column range
        all_2d.shape = {n, c.n_head * r};
        mine_2d.shape = {n, n_head * r};
        ops.slice_cols(all_2d, shard_->heads.begin * r, mine_2d);
    }
    tap(ops, topk, "topk_slots", i_layer);
    tap(ops, lat, "attn_latent", i_layer);
    Tensor o = ops.alloc(DType::F32, {n, n_head * c.v_head_dim});  // [n, n_head · v_head_dim]
    ops.mla_expand_v(lat, L.kv_b, c.qk_nope_head_dim, c.v_head_dim, o);
    ops.linear(o, L.o, out);
    all_reduce(out);  // tensor parallel: each rank's heads contribute a partial o_proj
    tap(ops, out, "attn_out", i_layer);
}

void GlmDsaModel::layer_forward(Ops& ops, int64_t i_layer, Tensor& x, const BatchPlan& plan, KvCache& kv, Tensor& topk,
                                bool run_indexer, TierStep* tier) const {
    const ModelConfig& c = config_;
    const LayerWeights& L = layers_[static_cast<size_t>(i_layer)];
    const int64_t n = x.dim(0), H = c.hidden_size;
    Tensor xn = ops.alloc(DType::F32, {n, H});
    ops.rms_norm(x, L.input_norm, c.rms_norm_eps, xn);
    Tensor attn = ops.alloc(DType::F32, {n, H});
    attention(ops, i_layer, xn, plan, kv, topk, run_indexer, tier, attn);
    Tensor h = ops.alloc(DType::F32, {n, H});
    ops.add_rms_norm(x, attn, L.post_norm, c.rms_norm_eps, h);  // x = x + attn; h = RMSNorm(x)
    Tensor y = ops.alloc(DType::F32, {n, H});
    if (L.moe) {
        MoeRouteParams rp;
        rp.n_group = c.n_group;
        rp.topk_group = c.topk_group;
        rp.top_k = c.n_experts_per_tok;
        rp.norm_topk_prob = c.norm_topk_prob;
        rp.routed_scaling_factor = c.routed_scaling_factor;
        Tensor ids = ops.alloc(DType::I32, {n, rp.top_k});
        Tensor w = ops.alloc(DType::F32, {n, rp.top_k});
        ops.moe_route(h, L.router, L.router_bias, rp, ids, w);
        tap(ops, ids, "moe_ids", i_layer);
        tap(ops, w, "moe_weights", i_layer);
        ops.moe_experts(h, ids, w, L.experts, y);
        if (L.has_shared_expert) {
            Tensor ys = ops.alloc(DType::F32, {n, H});
            ops.swiglu_mlp(h, L.shared_expert, ys);
            ops.add(y, ys);
        }
    } else {
        ops.swiglu_mlp(h, L.mlp, y);
    }
    all_reduce(y);  // tensor / expert parallel: partial sums over columns or experts
    tap(ops, y, "ffn_out", i_layer);
    ops.add(x, y);
    tap(ops, x, "residual", i_layer);
}

ForwardResult GlmDsaModel::finish(Ops& ops, const Tensor& x, const std::vector<float>& norm, const BatchPlan& plan,
                                  Tensor topk) const {
    const int64_t n = x.dim(0), H = config_.hidden_size;
    ForwardResult r;
    r.hidden = ops.alloc(DType::F32, {n, H});
    ops.rms_norm(x, norm, config_.rms_norm_eps, r.hidden);
    tap(ops, r.hidden, "hidden");
    const auto n_rows = static_cast<int64_t>(plan.logit_rows.size());
    r.logits = ops.alloc(DType::F32, {n_rows, config_.vocab_size});
    if (n_rows > 0) {
        Tensor rows = ops.alloc(DType::F32, {n_rows, H});
        ops.gather_rows(r.hidden, plan.logit_rows_dev, rows);
        if (lm_head_.rows == config_.vocab_size) {
            ops.linear(rows, lm_head_, r.logits);
        } else {  // tensor parallel: this rank's vocabulary rows, then every rank's
            Tensor part = ops.alloc(DType::F32, {n_rows, lm_head_.rows});
            ops.linear(rows, lm_head_, part);
            comm_->all_gather_cols(part, r.logits);
        }
        tap(ops, r.logits, "logits");
    }
    r.topk = std::move(topk);
    return r;
}

Range GlmDsaModel::kv_layers() const { return shard_ ? shard_->kv_layers : Range{0, config_.n_layers_total()}; }

int64_t GlmDsaModel::kv_bytes_per_token_max(KvFormat format) const {
    if (!shard_plan_) return kv_bytes_per_token(config_, format);
    int64_t most = 0;
    for (const RankPlan& r : shard_plan_->ranks)
        most = std::max(most, kv_bytes_per_token(config_, format, r.kv_layers));
    return most;
}

int GlmDsaModel::kv_owner(int64_t i_layer) const {
    if (!shard_plan_ || !shard_plan_->options.layer_split || comm_->size() == 1) return -1;
    for (const RankPlan& r : shard_plan_->ranks)  // this stage's ranks; the owner as a communicator rank
        if (r.stage == shard_->stage && r.kv_layers.contains(i_layer))
            return static_cast<int>(r.rank % shard_plan_->options.n_gpus);
    MEGACTX_FAIL("LayerSplit: no rank holds layer {}", i_layer);
}

void GlmDsaModel::all_reduce(Tensor& t) const {
    if (comm_ && comm_->size() > 1) comm_->all_reduce_sum(t);
}

ForwardResult GlmDsaModel::forward(Ops& ops, const Batch& batch, KvCache& kv) const {
    check_batch(batch);  // before the followers start: a bad batch must not leave them waiting in a collective
    if (!followers_) return forward_local(ops, batch, kv);
    return lead([&] { followers_->begin_forward(batch, kv); }, [&] { return forward_local(ops, batch, kv); });
}

ForwardResult GlmDsaModel::lead(const std::function<void()>& start, const std::function<ForwardResult()>& local) const {
    start();
    ForwardResult r;
    try {
        r = local();
    } catch (...) {
        const std::exception_ptr mine = std::current_exception();
        const bool follower_first = followers_->abort(mine);  // followers waiting for rank 0 would wait forever
        try {
            followers_->end_forward();
        } catch (...) {
            if (follower_first) throw;  // the cause; rank 0 only saw the abort
        }
        std::rethrow_exception(mine);
    }
    followers_->end_forward();
    return r;
}

ForwardResult GlmDsaModel::forward_local(Ops& ops, const Batch& batch, KvCache& kv) const {
    if (pipe_) return forward_stage(ops, batch, kv);
    Tap::instance().begin_forward();
    const BatchPlan plan(ops, batch);
    const int64_t n = batch.n_tokens();
    Tensor x = ops.alloc(DType::F32, {n, config_.hidden_size});  // [n, hidden] residual stream
    ops.embedding(plan.tokens, embed_, x);
    Tensor topk = ops.alloc(DType::I32, {n, config_.index_topk});  // the IndexShare buffer
    const std::unique_ptr<TierStep> tier = begin_tiers(ops, plan, kv, n);
    for (int64_t l = 0; l < config_.n_layers; ++l) {
        layer_forward(ops, l, x, plan, kv, topk, layers_[static_cast<size_t>(l)].full, tier.get());
    }
    return finish(ops, x, final_norm_, plan, std::move(topk));
}

std::vector<Range> micro_batches(int64_t n_tokens, int64_t n_stages) {
    const int64_t m = std::max<int64_t>(1, std::min(n_tokens, n_stages));
    std::vector<Range> out;
    for (int64_t i = 0; i < m; ++i) out.push_back({n_tokens * i / m, n_tokens * (i + 1) / m});
    return out;
}

ForwardResult GlmDsaModel::forward_stage(Ops& ops, const Batch& batch, KvCache& kv) const {
    const ParallelOptions& o = shard_plan_->options;
    const int64_t tp = o.n_gpus, stage = shard_->stage, H = config_.hidden_size, K = config_.index_topk;
    const int me = static_cast<int>(shard_->rank);
    const int prev = static_cast<int>(shard_->rank - tp), next = static_cast<int>(shard_->rank + tp);
    const bool first = stage == 0, last = stage == o.pp - 1;
    const Range layers{shard_->layers.begin, std::min(shard_->layers.end, config_.n_layers)};  // decoder layers
    // The IndexShare buffer travels with the hidden states when a stage starts with a shared layer.
    const bool topk_in = !first && !layers_[static_cast<size_t>(layers.begin)].full;
    const bool topk_out = !last && !layers_[static_cast<size_t>(layers.end)].full;
    const std::vector<Range> parts = micro_batches(batch.n_tokens(), o.pp);
    const auto logit_rows = [&](Range r) { return count_logit_rows(batch, r); };
    std::vector<float> host;
    std::vector<int32_t> host_topk;
    for (const Range part : parts) {
        const Batch mb = slice_batch(batch, part.begin, part.end);
        const BatchPlan plan(ops, mb);
        const int64_t n = mb.n_tokens();
        Tensor x = ops.alloc(DType::F32, {n, H});
        Tensor topk = ops.alloc(DType::I32, {n, K});
        host.resize(static_cast<size_t>(n * H));
        host_topk.resize(static_cast<size_t>(n * K));
        if (first) {
            ops.embedding(plan.tokens, embed_, x);
        } else {
            pipe_->recv(prev, host.data(), host.size() * sizeof(float));
            ops.upload(host.data(), x);
            if (topk_in) {
                pipe_->recv(prev, host_topk.data(), host_topk.size() * sizeof(int32_t));
                ops.upload(host_topk.data(), topk);
            }
        }
        // A host tier: each stage resolves the selections its own layers read in its own tiers (rank 0's block
        // moves are replayed on every rank, as under LayerSplit).
        const std::unique_ptr<TierStep> tier = begin_tiers(ops, plan, kv, n);
        for (int64_t l = layers.begin; l < layers.end; ++l)
            layer_forward(ops, l, x, plan, kv, topk, layers_[static_cast<size_t>(l)].full, tier.get());
        if (!last) {
            ops.download(x, host.data());
            pipe_->send(next, host.data(), host.size() * sizeof(float));
            if (topk_out) {
                ops.download(topk, host_topk.data());
                pipe_->send(next, host_topk.data(), host_topk.size() * sizeof(int32_t));
            }
        } else {
            const ForwardResult r = finish(ops, x, final_norm_, plan, topk);
            if (shard_->rank == stage * tp) send_result(ops, r, batch.want_hidden);  // every rank of it holds them
        }
    }
    ForwardResult result;
    if (me == 0) {  // the engine's rank: every micro-batch's results, in batch order
        std::vector<int64_t> rows, sizes;
        for (const Range part : parts) {
            rows.push_back(logit_rows(part));
            sizes.push_back(part.size());
        }
        result = receive_result(ops, rows, sizes, batch.want_hidden);
    }
    pipe_->flush();
    return result;
}

int64_t count_logit_rows(const Batch& b, Range r) {
    if (b.want_logits.empty()) return r.size();
    int64_t k = 0;
    for (int64_t i = r.begin; i < r.end; ++i) k += b.want_logits[static_cast<size_t>(i)] ? 1 : 0;
    return k;
}

void GlmDsaModel::send_result(Ops& ops, const ForwardResult& r, bool hidden) const {
    const auto send = [&](const Tensor& t) {
        std::vector<uint8_t> bytes(static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
        if (!bytes.empty()) ops.download(t, bytes.data());
        pipe_->send(0, bytes.data(), bytes.size());
    };
    send(r.logits);
    if (hidden) {
        send(r.hidden);
        send(r.topk);
    }
}

ForwardResult GlmDsaModel::receive_result(Ops& ops, const std::vector<int64_t>& logit_rows,
                                          const std::vector<int64_t>& tokens, bool hidden) const {
    const ParallelOptions& o = shard_plan_->options;
    const int from = static_cast<int>((o.pp - 1) * o.n_gpus);  // the last stage's first rank
    const int64_t V = config_.vocab_size, H = config_.hidden_size, K = config_.index_topk;
    int64_t n_rows = 0, n = 0;
    for (size_t i = 0; i < tokens.size(); ++i) n_rows += logit_rows[i], n += tokens[i];
    std::vector<float> logits(static_cast<size_t>(n_rows * V)), hid(hidden ? static_cast<size_t>(n * H) : 0);
    std::vector<int32_t> topk(hidden ? static_cast<size_t>(n * K) : 0);
    int64_t at_row = 0, at_token = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {  // per micro-batch: its logits, then its hidden rows and top-k
        pipe_->recv(from, logits.data() + at_row * V, static_cast<size_t>(logit_rows[i] * V) * sizeof(float));
        if (hidden) {
            pipe_->recv(from, hid.data() + at_token * H, static_cast<size_t>(tokens[i] * H) * sizeof(float));
            pipe_->recv(from, topk.data() + at_token * K, static_cast<size_t>(tokens[i] * K) * sizeof(int32_t));
        }
        at_row += logit_rows[i];
        at_token += tokens[i];
    }
    ForwardResult r;
    r.logits = ops.alloc(DType::F32, {n_rows, V});
    if (!logits.empty()) ops.upload(logits.data(), r.logits);
    if (hidden) {
        r.hidden = ops.alloc(DType::F32, {n, H});
        r.topk = ops.alloc(DType::I32, {n, K});
        if (n > 0) {
            ops.upload(hid.data(), r.hidden);
            ops.upload(topk.data(), r.topk);
        }
    }
    return r;
}

ForwardResult GlmDsaModel::mtp_forward(Ops& ops, const Batch& batch, const Tensor& hidden_in, KvCache& kv,
                                       const Tensor* reuse_topk, const Tensor* tokens) const {
    MEGACTX_CHECK(has_mtp(), "{}: the checkpoint has no MTP layer (model.layers.{}.*)", store_->dir(),
                  config_.n_layers);
    check_batch(batch);
    const int64_t n = batch.n_tokens(), H = config_.hidden_size;
    MEGACTX_CHECK(hidden_in.dtype == DType::F32 && hidden_in.dim(0) == n && hidden_in.dim(1) == H,
                  "mtp_forward: hidden_in must be [{}, {}] f32", n, H);
    MEGACTX_CHECK(!tokens || (tokens->dtype == DType::I32 && tokens->numel() == n),
                  "mtp_forward: tokens must be [{}] int32", n);
    MEGACTX_CHECK(!reuse_topk || (reuse_topk->dtype == DType::I32 && reuse_topk->dim(0) == n &&
                                  reuse_topk->dim(1) == config_.index_topk),
                  "mtp_forward: reuse_topk must be [{}, {}] int32", n, config_.index_topk);
    if (!followers_) return mtp_forward_local(ops, batch, hidden_in, kv, reuse_topk, tokens);
    // Tensor parallel: the followers take rank 0's inputs through host memory (every rank's MTP layer is
    // sharded like the decoder layers, and its collectives meet theirs).
    RankFollowers::MtpInputs in;
    in.hidden.resize(static_cast<size_t>(n * H));
    ops.download(hidden_in, in.hidden.data());
    if (reuse_topk) {
        in.reuse_topk.resize(static_cast<size_t>(reuse_topk->numel()));
        ops.download(*reuse_topk, in.reuse_topk.data());
    }
    if (tokens) {
        in.tokens.resize(static_cast<size_t>(n));
        ops.download(*tokens, in.tokens.data());
    }
    return lead([&] { followers_->begin_mtp_forward(batch, kv, in); },
                [&] { return mtp_forward_local(ops, batch, hidden_in, kv, reuse_topk, tokens); });
}

ForwardResult GlmDsaModel::mtp_forward_local(Ops& ops, const Batch& batch, const Tensor& hidden_in, KvCache& kv,
                                             const Tensor* reuse_topk, const Tensor* tokens) const {
    if (pipe_ && shard_->stage != shard_plan_->options.pp - 1) {
        // Pipeline stages: the MTP layer is the last stage's; rank 0 receives its results, the others idle.
        ForwardResult r;
        if (shard_->rank == 0) r = receive_result(ops, {count_logit_rows(batch, {0, batch.n_tokens()})},
                                                  {batch.n_tokens()}, true);
        pipe_->flush();
        return r;
    }
    Tap::instance().begin_forward();
    const BatchPlan plan(ops, batch);
    const int64_t n = batch.n_tokens(), H = config_.hidden_size, i_mtp = config_.n_layers;
    const LayerWeights& L = layers_[static_cast<size_t>(i_mtp)];
    Tensor e = ops.alloc(DType::F32, {n, H});
    ops.embedding(tokens ? *tokens : plan.tokens, embed_, e);
    Tensor en = ops.alloc(DType::F32, {n, H});
    ops.rms_norm(e, L.enorm, config_.rms_norm_eps, en);
    Tensor hn = ops.alloc(DType::F32, {n, H});
    ops.rms_norm(hidden_in, L.hnorm, config_.rms_norm_eps, hn);
    Tensor eh = ops.alloc(DType::F32, {n, 2 * H});  // [n, 2·hidden]: embedding first, hidden second
    ops.concat_cols(en, hn, eh);
    Tensor x = ops.alloc(DType::F32, {n, H});
    ops.linear(eh, L.eh_proj, x);

    Tensor topk = reuse_topk ? *reuse_topk : ops.alloc(DType::I32, {n, config_.index_topk});
    // Without reuse the MTP layer runs its own indexer (it is always full); with reuse it keeps step 0's top-k.
    const std::unique_ptr<TierStep> tier = begin_tiers(ops, plan, kv, n);
    layer_forward(ops, i_mtp, x, plan, kv, topk, reuse_topk == nullptr, tier.get());
    ForwardResult r = finish(ops, x, L.head_norm, plan, std::move(topk));
    if (pipe_ && shard_->rank % shard_plan_->options.n_gpus == 0) {  // the last stage's first rank, to rank 0
        send_result(ops, r, true);
        pipe_->flush();
    }
    return r;
}

}  // namespace megactx
