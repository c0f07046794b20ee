#include "io/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"

namespace megactx {

using json = nlohmann::json;

int64_t ModelConfig::n_full_layers() const {
    int64_t n = 0;
    for (bool f : layer_full) n += f;
    return n;
}

namespace {

bool is_pow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// Per-layer lists are allocated while parsing, so the layer counts get a sane bound (GLM-5.x has 78 + 1).
constexpr int64_t kMaxLayers = 4096;

// Field readers: absent or null → fallback (or an error when required); wrong type → an error naming the field.
struct Reader {
    const json& j;
    const std::string& source;

    const json* find(const char* key) const {
        const auto it = j.find(key);
        return it == j.end() || it->is_null() ? nullptr : &*it;
    }
    int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt, int64_t min = 1,
                    int64_t max = int64_t{1} << 40) const {
        const json* v = find(key);
        if (!v) {
            MEGACTX_CHECK(fallback.has_value(), "{}: missing field '{}'", source, key);
            return *fallback;
        }
        MEGACTX_CHECK(v->is_number_integer(), "{}: field '{}' must be an integer, got {}", source, key, v->dump());
        const int64_t x = v->get<int64_t>();
        MEGACTX_CHECK(x >= min && x <= max, "{}: field '{}' = {} is out of range [{}, {}]", source, key, x, min, max);
        return x;
    }
    double number(const char* key, double fallback) const {
        const json* v = find(key);
        if (!v) return fallback;
        MEGACTX_CHECK(v->is_number(), "{}: field '{}' must be a number, got {}", source, key, v->dump());
        const double x = v->get<double>();
        MEGACTX_CHECK(std::isfinite(x), "{}: field '{}' must be finite", source, key);
        return x;
    }
    bool boolean(const char* key, bool fallback) const {
        const json* v = find(key);
        if (!v) return fallback;
        MEGACTX_CHECK(v->is_boolean(), "{}: field '{}' must be true or false, got {}", source, key, v->dump());
        return v->get<bool>();
    }
    std::string string(const char* key, const std::string& fallback) const {
        const json* v = find(key);
        if (!v) return fallback;
        MEGACTX_CHECK(v->is_string(), "{}: field '{}' must be a string, got {}", source, key, v->dump());
        return v->get<std::string>();
    }
};

void resolve_rope(const Reader& r, ModelConfig& c) {
    RopeConfig& rc = c.rope;
    double theta = r.number("rope_theta", 10000.0);
    // transformers 5 writes `rope_parameters` (theta inside); older configs `rope_scaling` beside `rope_theta`.
    const json* p = r.find("rope_parameters");
    const char* field = "rope_parameters";
    if (!p) {
        p = r.find("rope_scaling");
        field = "rope_scaling";
    }
    if (p) {
        MEGACTX_CHECK(p->is_object(), "{}: field '{}' must be an object or null", r.source, field);
        const Reader rp{*p, r.source};
        theta = rp.number("rope_theta", theta);
        rc.type = rp.string("rope_type", rp.string("type", "default"));
        if (rc.type == "yarn") {
            rc.factor = rp.number("factor", 0.0);
            MEGACTX_CHECK(rc.factor > 0, "{}: {}.factor must be positive for YaRN", r.source, field);
            rc.original_max_position_embeddings =
                rp.integer("original_max_position_embeddings", c.max_position_embeddings);
            // transformers: `beta_fast or 32`, `beta_slow or 1`
            rc.beta_fast = rp.number("beta_fast", 0.0);
            if (rc.beta_fast == 0) rc.beta_fast = 32.0;
            rc.beta_slow = rp.number("beta_slow", 0.0);
            if (rc.beta_slow == 0) rc.beta_slow = 1.0;
            rc.mscale = rp.number("mscale", 0.0);
            rc.mscale_all_dim = rp.number("mscale_all_dim", 0.0);
            rc.attention_factor = rp.number("attention_factor", 0.0);
            MEGACTX_CHECK(rc.attention_factor >= 0, "{}: {}.attention_factor must not be negative", r.source, field);
            rc.truncate = rp.boolean("truncate", true);
        }
    }
    MEGACTX_CHECK(rc.type == "default" || rc.type == "yarn",
                  "{}: rope type '{}' is not supported (megactx supports 'default' and 'yarn')", r.source, rc.type);
    MEGACTX_CHECK(theta > 0, "{}: rope_theta must be positive", r.source);
    rc.theta = static_cast<float>(theta);
}

// transformers' yarn_get_mscale
double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

Rope make_rope(const ModelConfig& c, bool interleaved) {
    const RopeConfig& rc = c.rope;
    const int64_t dim = c.qk_rope_head_dim, half = dim / 2;
    Rope rope = Rope::plain(rc.theta, dim, interleaved);
    if (rc.type != "yarn") return rope;
    // transformers' _compute_yarn_parameters, step by step in the same precision: the frequency tables in fp32,
    // the correction range in double.
    const double pi = 3.14159265358979323846;
    auto correction_dim = [&](double rotations) {
        return (static_cast<double>(dim) *
                std::log(static_cast<double>(rc.original_max_position_embeddings) / (rotations * 2 * pi))) /
               (2 * std::log(static_cast<double>(rc.theta)));
    };
    double low = correction_dim(rc.beta_fast), high = correction_dim(rc.beta_slow);
    if (rc.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    const float factor = static_cast<float>(rc.factor);
    for (int64_t i = 0; i < half; ++i) {
        const float pos_freq = std::pow(rc.theta, static_cast<float>(2 * i) / static_cast<float>(dim));
        const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (factor * pos_freq);
        const float ramp =
            std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
        const float extrapolation_factor = 1.0f - ramp;
        rope.inv_freq[static_cast<size_t>(i)] =
            interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
    double attention_factor = rc.attention_factor;
    if (attention_factor == 0) {
        attention_factor = rc.mscale != 0 && rc.mscale_all_dim != 0
                               ? yarn_mscale(rc.factor, rc.mscale) / yarn_mscale(rc.factor, rc.mscale_all_dim)
                               : yarn_mscale(rc.factor, 1.0);
    }
    rope.scale = static_cast<float>(attention_factor);
    return rope;
}

void resolve_indexer_types(const Reader& r, ModelConfig& c) {
    const size_t n = static_cast<size_t>(c.n_layers);
    c.layer_full.assign(n, true);
    if (const json* types = r.find("indexer_types")) {
        MEGACTX_CHECK(types->is_array() && types->size() == n,
                      "{}: invalid indexer pattern: 'indexer_types' must be a list of {} entries (one per layer)",
                      r.source, n);
        for (size_t i = 0; i < n; ++i) {
            const json& t = (*types)[i];
            MEGACTX_CHECK(t.is_string() && (t == "full" || t == "shared"),
                          "{}: invalid indexer pattern: indexer_types[{}] = {} (expected \"full\" or \"shared\")",
                          r.source, i, t.dump());
            c.layer_full[i] = t == "full";
        }
        c.indexer_source = "indexer_types";
    } else if (const json* pattern = r.find("index_topk_pattern")) {
        MEGACTX_CHECK(pattern->is_string(), "{}: invalid indexer pattern: 'index_topk_pattern' must be a string of F/S",
                      r.source);
        const std::string p = pattern->get<std::string>();
        MEGACTX_CHECK(p.size() == n, "{}: invalid indexer pattern: index_topk_pattern has {} letters for {} layers",
                      r.source, p.size(), n);
        for (size_t i = 0; i < n; ++i) {
            MEGACTX_CHECK(p[i] == 'F' || p[i] == 'S',
                          "{}: invalid indexer pattern: index_topk_pattern[{}] = '{}' (expected 'F' or 'S')", r.source,
                          i, p[i]);
            c.layer_full[i] = p[i] == 'F';
        }
        c.indexer_source = "index_topk_pattern";
    } else if (r.find("index_topk_freq") || r.find("index_skip_topk_offset")) {
        const int64_t freq = std::max<int64_t>(r.integer("index_topk_freq", 1, 0), 1);
        const int64_t offset = r.integer("index_skip_topk_offset", 2, 0);
        for (size_t i = 0; i < n; ++i) {
            c.layer_full[i] = std::max<int64_t>(static_cast<int64_t>(i) - offset + 1, 0) % freq == 0;
        }
        c.indexer_source = "index_topk_freq/index_skip_topk_offset";
    } else {
        c.indexer_source = "default (all layers full)";
    }
    MEGACTX_CHECK(n == 0 || c.layer_full[0],
                  "{}: invalid indexer pattern: layer 0 is 'shared' but a shared layer reuses the top-k of an earlier "
                  "full layer",
                  r.source);
}

void resolve_mlp_types(const Reader& r, ModelConfig& c) {
    const size_t n = static_cast<size_t>(c.n_layers);
    c.layer_moe.assign(n, false);
    if (const json* types = r.find("mlp_layer_types")) {
        MEGACTX_CHECK(types->is_array() && types->size() == n, "{}: 'mlp_layer_types' must be a list of {} entries",
                      r.source, n);
        for (size_t i = 0; i < n; ++i) {
            const json& t = (*types)[i];
            MEGACTX_CHECK(t.is_string() && (t == "dense" || t == "sparse"),
                          "{}: mlp_layer_types[{}] = {} (expected \"dense\" or \"sparse\")", r.source, i, t.dump());
            c.layer_moe[i] = t == "sparse";
        }
        return;
    }
    const int64_t first_dense = r.integer("first_k_dense_replace", 3, 0);
    const int64_t freq = r.integer("moe_layer_freq", 1);
    for (size_t i = 0; i < n; ++i) {
        c.layer_moe[i] = static_cast<int64_t>(i) >= first_dense && static_cast<int64_t>(i) % freq == 0;
    }
}

}  // namespace

Rope ModelConfig::attention_rope() const { return make_rope(*this, true); }
Rope ModelConfig::indexer_rope() const { return make_rope(*this, indexer_rope_interleave); }

float ModelConfig::attention_softmax_scale() const {
    double scale = std::pow(static_cast<double>(qk_head_dim()), -0.5);
    if (rope.type != "default" && rope.mscale_all_dim != 0) {
        const double m = yarn_mscale(rope.factor, rope.mscale_all_dim);
        scale *= m * m;
    }
    return static_cast<float>(scale);
}

ModelConfig parse_config_json(const std::string& text, const std::string& source) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        MEGACTX_FAIL("{}: not valid JSON: {}", source, e.what());
    }
    MEGACTX_CHECK(j.is_object(), "{}: must be a JSON object", source);
    Reader r{j, source};
    ModelConfig c;
    c.model_type = r.string("model_type", "");
    MEGACTX_CHECK(!c.model_type.empty(), "{}: missing field 'model_type'", source);
    const bool deepseek = c.model_type == "deepseek_v32";
    MEGACTX_CHECK(c.model_type == "glm_moe_dsa" || deepseek,
                  "{}: model_type '{}' is not supported (megactx runs 'glm_moe_dsa': GLM-5, GLM-5.1, GLM-5.2, and "
                  "'deepseek_v32': DeepSeek-V3.2)",
                  source, c.model_type);

    c.vocab_size = r.integer("vocab_size");
    c.hidden_size = r.integer("hidden_size");
    c.intermediate_size = r.integer("intermediate_size");
    c.moe_intermediate_size = r.integer("moe_intermediate_size");
    c.n_layers = r.integer("num_hidden_layers", std::nullopt, 1, kMaxLayers);
    c.n_head = r.integer("num_attention_heads");
    const int64_t n_kv_head = r.integer("num_key_value_heads", c.n_head);
    MEGACTX_CHECK(n_kv_head == c.n_head, "{}: num_key_value_heads ({}) must equal num_attention_heads ({}) for MLA",
                  source, n_kv_head, c.n_head);
    MEGACTX_CHECK(r.find("q_lora_rank"), "{}: missing field 'q_lora_rank' (models without a q LoRA are not supported)",
                  source);
    c.q_lora_rank = r.integer("q_lora_rank");
    c.kv_lora_rank = r.integer("kv_lora_rank");
    c.qk_nope_head_dim = r.integer("qk_nope_head_dim");
    c.qk_rope_head_dim = r.integer("qk_rope_head_dim");
    c.v_head_dim = r.integer("v_head_dim");
    // `head_dim` is a legacy field that disagrees with the real head sizes (model-spec §1.1): ignored.
    c.n_routed_experts = r.integer("n_routed_experts");
    c.n_experts_per_tok = r.integer("num_experts_per_tok");
    c.n_shared_experts = r.integer("n_shared_experts", 0, 0);
    c.n_group = r.integer("n_group", 1);
    c.topk_group = r.integer("topk_group", 1);
    c.routed_scaling_factor = static_cast<float>(r.number("routed_scaling_factor", 1.0));
    c.norm_topk_prob = r.boolean("norm_topk_prob", true);
    c.rms_norm_eps = static_cast<float>(r.number("rms_norm_eps", 1e-5));
    c.max_position_embeddings = r.integer("max_position_embeddings");
    c.n_head_indexer = r.integer("index_n_heads");
    c.d_indexer = r.integer("index_head_dim");
    c.index_topk = r.integer("index_topk");
    c.n_mtp_layers = r.integer("num_nextn_predict_layers", 0, 0, kMaxLayers);
    c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
    // DeepSeek-V3.2's MTP layer runs its own indexer at every draft step; GLM-5.2's draft steps share step 0's.
    c.mtp_index_share = r.boolean("index_share_for_mtp_iteration", !deepseek);
    resolve_rope(r, c);
    if (const json* q = r.find("quantization_config")) {
        MEGACTX_CHECK(q->is_object(), "{}: field 'quantization_config' must be an object", source);
        c.quant_method = Reader{*q, source}.string("quant_method", "unknown");
    }

    MEGACTX_CHECK(r.string("hidden_act", "silu") == "silu", "{}: hidden_act '{}' is not supported (expected 'silu')",
                  source, r.string("hidden_act", ""));
    MEGACTX_CHECK(r.string("scoring_func", "sigmoid") == "sigmoid",
                  "{}: scoring_func '{}' is not supported (expected 'sigmoid')", source, r.string("scoring_func", ""));
    MEGACTX_CHECK(!r.boolean("attention_bias", false), "{}: attention_bias = true is not supported", source);
    MEGACTX_CHECK(r.boolean("rope_interleave", true), "{}: rope_interleave = false is not supported", source);
    // GLM sets indexer_rope_interleave; DeepSeek-V3.2's indexer rotates half-split pairs (transformers'
    // DeepseekV32Indexer: apply_rotary_pos_emb, not the interleaved form of its attention).
    c.indexer_rope_interleave = r.boolean("indexer_rope_interleave", !deepseek);
    // DeepSeek's reference has no unrotated FP8 indexer path (rotate_activation before act_quant); GLM's
    // reference engines (vLLM, transformers) quantise without it.
    // (The transform needs a power-of-two index_head_dim: V3.2's is 128; a test model with another keeps it off.)
    c.indexer_hadamard = deepseek && is_pow2(c.d_indexer);
    MEGACTX_CHECK(c.qk_rope_head_dim % 2 == 0, "{}: qk_rope_head_dim must be even", source);
    MEGACTX_CHECK(c.d_indexer >= c.qk_rope_head_dim, "{}: index_head_dim ({}) must be at least qk_rope_head_dim ({})",
                  source, c.d_indexer, c.qk_rope_head_dim);
    MEGACTX_CHECK(c.n_experts_per_tok <= c.n_routed_experts,
                  "{}: num_experts_per_tok ({}) exceeds n_routed_experts ({})", source, c.n_experts_per_tok,
                  c.n_routed_experts);
    MEGACTX_CHECK(c.n_routed_experts % c.n_group == 0, "{}: n_routed_experts ({}) must be divisible by n_group ({})",
                  source, c.n_routed_experts, c.n_group);
    MEGACTX_CHECK(c.topk_group <= c.n_group, "{}: topk_group ({}) exceeds n_group ({})", source, c.topk_group,
                  c.n_group);
    MEGACTX_CHECK(c.n_group == 1 || c.n_routed_experts / c.n_group >= 2,
                  "{}: group-limited routing needs at least 2 experts per group", source);
    MEGACTX_CHECK(c.n_experts_per_tok <= c.topk_group * (c.n_routed_experts / c.n_group),
                  "{}: num_experts_per_tok ({}) exceeds the experts in topk_group groups", source, c.n_experts_per_tok);

    if (const json* eos = r.find("eos_token_id")) {
        if (eos->is_number_integer()) {
            c.eos_token_ids.push_back(eos->get<int64_t>());
        } else {
            MEGACTX_CHECK(eos->is_array(), "{}: field 'eos_token_id' must be an integer or a list", source);
            for (const auto& e : *eos) {
                MEGACTX_CHECK(e.is_number_integer(), "{}: field 'eos_token_id' must hold integers", source);
                c.eos_token_ids.push_back(e.get<int64_t>());
            }
        }
    }
    resolve_indexer_types(r, c);
    resolve_mlp_types(r, c);
    return c;
}

ModelConfig load_config(const std::string& path) {
    namespace fs = std::filesystem;
    std::string file = path;
    if (fs::is_directory(path)) file = (fs::path(path) / "config.json").string();
    std::ifstream in(file);
    MEGACTX_CHECK(in.good(), "{}: missing config.json (cannot open)", file);
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_config_json(ss.str(), file);
}

std::optional<bool> parse_indexer_hadamard(const std::string& value) {
    if (value == "auto") return std::nullopt;
    if (value == "on") return true;
    if (value == "off") return false;
    MEGACTX_FAIL("--indexer-hadamard '{}': expected auto, on or off", value);
}

void override_indexer_hadamard(ModelConfig& c, std::optional<bool> on) {
    if (!on) return;
    MEGACTX_CHECK(!*on || is_pow2(c.d_indexer),
                  "--indexer-hadamard on: index_head_dim {} is not a power of two (the Walsh–Hadamard transform needs "
                  "one)",
                  c.d_indexer);
    c.indexer_hadamard = *on;
}

}  // namespace megactx
