#include "parallel/shard_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kv/kv_format.h"

namespace megactx {

namespace {

// Equal parts of n over g ranks; `what` names the dimension when it does not divide.
Range even_split(int64_t n, int64_t g, int64_t r, const char* what) {
    MEGACTX_CHECK(n % g == 0, "sharding plan: {} = {} does not divide by {} GPUs", what, n, g);
    return {r * (n / g), (r + 1) * (n / g)};
}

// LM-head vocabulary rows: equal parts when the vocabulary divides (the logits are all-gathered in equal
// pieces), else the whole head on every rank.
Range vocab_split(int64_t n, int64_t g, int64_t r) {
    return n % g == 0 ? Range{r * (n / g), (r + 1) * (n / g)} : Range{0, n};
}

double latent_bytes(const ModelConfig& c) {
    return static_cast<double>(fp8_latent_row_bytes(c.kv_lora_rank, c.qk_rope_head_dim));
}
double indexer_bytes(const ModelConfig& c) { return static_cast<double>(c.d_indexer + 4); }
double layer_kv_bytes(const ModelConfig& c, int64_t l) {
    return latent_bytes(c) + (c.is_full(l) ? indexer_bytes(c) : 0.0);
}

// Contiguous groups of the layers in `layers`, one per rank, minimising the largest group's KV bytes per token
// (binary search on the bound, greedy fill).
std::vector<Range> layer_groups(const ModelConfig& c, Range layers, int64_t g) {
    const int64_t n = layers.size();
    MEGACTX_CHECK(n >= g, "sharding plan: LayerSplit needs at least one layer per GPU ({} layers, {} GPUs)", n, g);
    std::vector<double> b(static_cast<size_t>(n));
    double total = 0, largest = 0;
    for (int64_t l = 0; l < n; ++l) {
        b[static_cast<size_t>(l)] = layer_kv_bytes(c, layers.begin + l);
        total += b[static_cast<size_t>(l)];
        largest = std::max(largest, b[static_cast<size_t>(l)]);
    }
    auto fill = [&](double cap, std::vector<Range>* out) {
        int64_t groups = 0, l = 0;
        while (l < n) {
            const int64_t begin = l;
            double sum = 0;
            // leave at least one layer for every remaining group
            while (l < n && sum + b[static_cast<size_t>(l)] <= cap && n - l > g - groups - 1)
                sum += b[static_cast<size_t>(l++)];
            if (l == begin) return false;
            if (out) out->push_back({layers.begin + begin, layers.begin + l});
            ++groups;
        }
        return groups <= g;
    };
    double lo = std::max(largest, total / static_cast<double>(g)), hi = total;
    for (int i = 0; i < 60 && hi - lo > 0.5; ++i) {
        const double mid = 0.5 * (lo + hi);
        (fill(mid, nullptr) ? hi : lo) = mid;
    }
    std::vector<Range> groups;
    fill(hi, &groups);
    while (static_cast<int64_t>(groups.size()) < g)
        groups.push_back({layers.end, layers.end});  // cannot happen when n >= g
    return groups;
}

// The layers of each pipeline stage: the decoder layers by count, the extra ones to the stages before the last
// (which also holds the LM head), the MTP layers on the last stage.
std::vector<Range> stage_layers(const ModelConfig& c, int64_t pp) {
    MEGACTX_CHECK(
        pp >= 1 && pp <= c.n_layers,
        "sharding plan: --pipeline-parallel-size must be 1..{} (one decoder layer per stage at least), got {}",
        c.n_layers, pp);
    std::vector<int64_t> count(static_cast<size_t>(pp), c.n_layers / pp);
    for (int64_t i = 0; i < c.n_layers % pp; ++i) ++count[static_cast<size_t>(pp >= 2 ? pp - 2 - i % (pp - 1) : 0)];
    std::vector<Range> stages;
    int64_t begin = 0;
    for (int64_t s = 0; s < pp; ++s) {
        const int64_t end = begin + count[static_cast<size_t>(s)] + (s == pp - 1 ? c.n_mtp_layers : 0);
        stages.push_back({begin, end});
        begin = end;
    }
    return stages;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// GiB with one decimal, or two significant digits below 1 GiB (test models); `up` rounds up, for a size that must
// suffice.
std::string gib(double bytes, bool up = false) {
    const double g = bytes / kGiB;
    const int decimals = g >= 1.0 ? 1 : 1 - static_cast<int>(std::floor(std::log10(g)));
    const double step = std::pow(10.0, -decimals);
    return fmt::format("{:.{}f}", up ? std::ceil(g / step) * step : g, decimals);
}

double max_weight_bytes(const ShardPlan& plan) {
    double w = 0;
    for (const RankPlan& r : plan.ranks) w = std::max(w, r.weight_bytes);
    return w;
}

}  // namespace

ShardPlan make_shard_plan(const ModelConfig& c, const ParallelOptions& o) {
    const int64_t g = o.n_gpus;
    MEGACTX_CHECK(g >= 1 && g <= 1024, "sharding plan: --tensor-parallel-size must be 1..1024, got {}", g);
    ShardPlan plan;
    plan.options = o;
    for (int64_t l = 0; l < c.n_layers_total(); ++l) plan.kv_bytes_per_token_total += layer_kv_bytes(c, l);
    const std::vector<Range> stages = stage_layers(c, o.pp);
    const double lin = c.quant_method == "fp8" ? 1.0 : 2.0;  // bytes per linear weight (FP8 checkpoints: e4m3)
    const double H = static_cast<double>(c.hidden_size);
    for (int64_t stage = 0; stage < o.pp; ++stage) {
        const Range layers = stages[static_cast<size_t>(stage)];
        const std::vector<Range> groups = o.layer_split ? layer_groups(c, layers, g) : std::vector<Range>{};
        const bool first = stage == 0, last = stage == o.pp - 1;
        for (int64_t r = 0; r < g; ++r) {
            RankPlan p;
            p.rank = stage * g + r;
            p.stage = stage;
            p.layers = layers;
            p.heads = even_split(c.n_head, g, r, "num_attention_heads");
            p.indexer_heads =
                o.indexer_split ? even_split(c.n_head_indexer, g, r, "index_n_heads") : Range{0, c.n_head_indexer};
            p.dense_ff = even_split(c.intermediate_size, g, r, "intermediate_size");
            if (o.expert_parallel) {
                p.experts = even_split(c.n_routed_experts, g, r, "n_routed_experts");
                p.expert_ff = {0, c.moe_intermediate_size};
            } else {
                p.experts = {0, c.n_routed_experts};
                p.expert_ff = even_split(c.moe_intermediate_size, g, r, "moe_intermediate_size");
            }
            p.shared_ff = even_split(c.n_shared_experts * c.moe_intermediate_size, g, r,
                                     "n_shared_experts · moe_intermediate_size");
            p.vocab = last ? vocab_split(c.vocab_size, g, r) : Range{0, 0};
            p.kv_layers = o.layer_split ? groups[static_cast<size_t>(r)] : layers;
            for (int64_t l = p.kv_layers.begin; l < p.kv_layers.end; ++l) p.kv_bytes_per_token += layer_kv_bytes(c, l);

            // Weights: embedding (bf16, replicated; on the first stage, and on the last for its MTP layers), LM head
            // (bf16, vocabulary rows, last stage), then the stage's layers (decoder, MTP).
            const bool embedding = first || (last && c.n_mtp_layers > 0);
            double w =
                2.0 * (static_cast<double>(embedding ? c.vocab_size : 0) + static_cast<double>(p.vocab.size())) * H;
            const double h = static_cast<double>(p.heads.size());
            for (int64_t l = layers.begin; l < layers.end; ++l) {
                w += lin * (static_cast<double>(c.q_lora_rank) * H +                                         // q_a
                            h * static_cast<double>(c.qk_head_dim() * c.q_lora_rank) +                       // q_b
                            static_cast<double>(c.d_latent()) * H +                                          // kv_a
                            h * static_cast<double>((c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank) +  // kv_b
                            H * h * static_cast<double>(c.v_head_dim));                                      // o
                if (c.is_full(l)) {
                    const double ih = static_cast<double>(p.indexer_heads.size());
                    w += lin * (ih * static_cast<double>(c.d_indexer * c.q_lora_rank) +  // wq_b
                                static_cast<double>(c.d_indexer) * H) +                  // wk
                         2.0 * ih * H;                                                   // weights_proj (bf16)
                }
                if (c.is_moe(l)) {
                    w += 2.0 * static_cast<double>(c.n_routed_experts) * H;  // router (bf16, replicated)
                    w += lin * 3.0 * H *
                         (static_cast<double>(p.experts.size() * p.expert_ff.size()) +
                          static_cast<double>(p.shared_ff.size()));
                } else {
                    w += lin * 3.0 * H * static_cast<double>(p.dense_ff.size());
                }
                if (l >= c.n_layers) w += 2.0 * 2.0 * H * H;  // MTP eh_proj (bf16, replicated)
            }
            p.weight_bytes = w;
            plan.ranks.push_back(p);
        }
    }
    return plan;
}

NodeCapacity node_capacity(const ShardPlan& plan, double gpu_bytes, int64_t context) {
    NodeCapacity cap;
    cap.gpu_bytes = gpu_bytes;
    cap.context = context;
    cap.min_free_bytes = std::numeric_limits<double>::infinity();
    double tokens = std::numeric_limits<double>::infinity();
    for (const RankPlan& r : plan.ranks) {
        const double free_bytes = std::max(0.0, gpu_bytes - r.weight_bytes);
        cap.min_free_bytes = std::min(cap.min_free_bytes, free_bytes);
        if (r.kv_bytes_per_token > 0) tokens = std::min(tokens, free_bytes / r.kv_bytes_per_token);
    }
    cap.kv_tokens = std::isfinite(tokens) ? std::floor(tokens) : 0.0;
    cap.sequences_at_context = context > 0 ? static_cast<int64_t>(cap.kv_tokens / static_cast<double>(context)) : 0;
    return cap;
}

void check_weights_fit(const ModelConfig& c, const ShardPlan& plan, double gpu_bytes) {
    const double need = max_weight_bytes(plan);
    if (need <= gpu_bytes) return;
    const ParallelOptions& o = plan.options;
    std::string fits;
    for (int64_t g = 1; g <= 1024 && fits.empty(); g *= 2) {
        if (g <= o.n_gpus) continue;
        for (const bool ep : {o.expert_parallel, true}) {
            ParallelOptions more = o;
            more.n_gpus = g;
            more.expert_parallel = ep;
            double w = 0;
            try {
                w = max_weight_bytes(make_shard_plan(c, more));
            } catch (const Error&) {
                continue;  // a dimension does not divide by g
            }
            if (w <= gpu_bytes) {
                fits = fmt::format("--tensor-parallel-size {}{} ({} GiB of weights per GPU)", g,
                                   ep && !o.expert_parallel ? " --expert-parallel" : "", gib(w));
                break;
            }
        }
    }
    if (fits.empty()) fits = "no power-of-two --tensor-parallel-size up to 1024 (heads, columns or experts run out)";
    // Or more pipeline stages at this tensor-parallel size (stages on other nodes).
    for (int64_t pp = o.pp * 2; pp <= c.n_layers; pp *= 2) {
        ParallelOptions more = o;
        more.pp = pp;
        double w = 0;
        try {
            w = max_weight_bytes(make_shard_plan(c, more));
        } catch (const Error&) {
            break;  // fewer layers per stage than LayerSplit's GPUs: more stages cannot help either
        }
        if (w <= gpu_bytes) {
            fits += fmt::format(", or --pipeline-parallel-size {} ({} GiB of weights per GPU, {} GPUs)", pp, gib(w),
                                pp * o.n_gpus);
            break;
        }
    }
    const std::string at =
        o.pp > 1 ? fmt::format("{} --pipeline-parallel-size {}", o.n_gpus, o.pp) : fmt::format("{}", o.n_gpus);
    MEGACTX_FAIL(
        "sharding plan: the weights do not fit: {} GiB per GPU at --tensor-parallel-size {}, {} GiB more than "
        "--gpu-memory-gib {:g}; what fits: {}, or --gpu-memory-gib {} or more for the weights alone",
        gib(need), at, gib(need - gpu_bytes), gpu_bytes / kGiB, fits, gib(need, true));
}

std::string format_shard_plan(const ModelConfig& c, const ShardPlan& plan, double gpu_bytes, int64_t context) {
    const ParallelOptions& o = plan.options;
    const std::string gpus = o.pp > 1 ? fmt::format(
                                            "{} pipeline stages of {} GPUs ({} GPUs; a stage holds a contiguous "
                                            "group of layers, its weights and its KV)",
                                            o.pp, o.n_gpus, o.pp * o.n_gpus)
                                      : fmt::format("{} GPUs", o.n_gpus);
    std::string s =
        fmt::format("{}: tensor parallel over attention heads and MLP columns, {}, indexer {}, KV {}\n", gpus,
                    o.expert_parallel ? "expert parallel MoE" : "MoE experts split by columns",
                    o.indexer_split ? "split by heads" : "replicated",
                    o.layer_split ? "LayerSplit (contiguous layer groups)"
                                  : (o.pp > 1 ? "replicated on every GPU of a stage"
                                              : "replicated on every GPU (MLA latent rows are shared by all heads)"));
    s += fmt::format("{:>4}  {:>5}  {:>9}  {:>11}  {:>11}  {:>11}  {:>13}  {:>11}  {:>10}  {:>14}\n", "rank", "stage",
                     "layers", "heads", "idx heads", "experts", "expert cols", "KV layers", "weights", "KV B/token");
    for (const RankPlan& r : plan.ranks) {
        s += fmt::format("{:>4}  {:>5}  {:>9}  {:>11}  {:>11}  {:>11}  {:>13}  {:>11}  {:>6.1f} GiB  {:>14.0f}\n",
                         r.rank, r.stage, fmt::format("{}-{}", r.layers.begin, r.layers.end - 1),
                         fmt::format("{}-{}", r.heads.begin, r.heads.end - 1),
                         fmt::format("{}-{}", r.indexer_heads.begin, r.indexer_heads.end - 1),
                         fmt::format("{}-{}", r.experts.begin, r.experts.end - 1),
                         fmt::format("{}-{}", r.expert_ff.begin, r.expert_ff.end - 1),
                         fmt::format("{}-{}", r.kv_layers.begin, r.kv_layers.end - 1), r.weight_bytes / kGiB,
                         r.kv_bytes_per_token);
    }
    s += fmt::format("KV per token, whole model (FP8, {} layers incl. MTP): {:.0f} B\n", c.n_layers_total(),
                     plan.kv_bytes_per_token_total);
    ParallelOptions other = o;
    other.layer_split = !o.layer_split;
    std::vector<ShardPlan> plans = {plan};
    std::string alt_error;
    try {
        plans.push_back(make_shard_plan(c, other));
    } catch (const Error& e) {
        alt_error = e.what();  // LayerSplit with fewer layers per stage than GPUs
    }
    const std::string where = o.pp > 1 ? fmt::format("over the {} stages", o.pp) : std::string("per node");
    for (const ShardPlan& p : plans) {
        const NodeCapacity cap = node_capacity(p, gpu_bytes, context);
        s += fmt::format(
            "{:<18} {:.1f} GiB per GPU, {:.1f} GiB left for KV on the tightest GPU: {:.0f} tokens of KV "
            "{} = {} sequences of {} tokens\n",
            p.options.layer_split ? "with LayerSplit:" : "without LayerSplit:", gpu_bytes / kGiB,
            cap.min_free_bytes / kGiB, cap.kv_tokens, where, cap.sequences_at_context, context);
    }
    if (!alt_error.empty()) s += fmt::format("with LayerSplit:   not possible: {}\n", alt_error);
    return s;
}

}  // namespace megactx
