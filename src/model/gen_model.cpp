#include "model/gen_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/gen_tokenizer.h"

namespace megactx {

using json = nlohmann::json;

namespace {

// splitmix64: each tensor gets its own stream from (seed, name), so values do not depend on write order.
struct Rng {
    static constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += kGamma);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform() { return static_cast<float>((next() >> 40) + 0.5) / static_cast<float>(1 << 24); }
    float normal() {
        const float u1 = uniform(), u2 = uniform();
        return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    }
};

uint64_t hash_name(const std::string& s, uint64_t seed) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return h;
}

struct Writer {
    uint64_t seed;
    DType linear_dtype;
    std::vector<TensorToWrite> tensors;
    bool values = true;  // false: names, dtypes and shapes only (model_tensors' plan)

    static std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
        std::vector<uint8_t> out(v.size() * dtype_size(t));
#pragma omp parallel for schedule(static) if (v.size() >= (1u << 20))
        for (size_t i = 0; i < v.size(); ++i) {
            if (t == DType::F32) {
                std::memcpy(out.data() + 4 * i, &v[i], 4);
            } else {
                const uint16_t h = f32_to_bf16(v[i]);
                std::memcpy(out.data() + 2 * i, &h, 2);
            }
        }
        return out;
    }
    // Value i uses draws 2i and 2i+1 of the tensor's stream; splitmix64's state after k draws is s0 + k·gamma,
    // so chunks start their own generator at the right place and the result does not depend on the threads.
    std::vector<float> random(const std::string& name, int64_t n, float mean, float std) const {
        const uint64_t s0 = hash_name(name, seed);
        std::vector<float> v(static_cast<size_t>(n));
        constexpr int64_t kChunk = 1 << 16;
#pragma omp parallel for schedule(static) if (n >= 4 * kChunk)
        for (int64_t c = 0; c < n; c += kChunk) {
            Rng rng{s0 + static_cast<uint64_t>(2 * c) * Rng::kGamma};
            for (int64_t i = c; i < std::min(n, c + kChunk); ++i) v[static_cast<size_t>(i)] = mean + std * rng.normal();
        }
        return v;
    }
    // A vector (norm weight, bias) in bf16 unless the whole model is f32.
    void vec(const std::string& name, int64_t n, float mean, float std) {
        const DType t = linear_dtype == DType::F32 ? DType::F32 : DType::BF16;
        tensors.push_back({name, t, {n}, values ? encode(random(name, n, mean, std), t) : std::vector<uint8_t>{}});
    }
    void vec_f32(const std::string& name, int64_t n, float mean, float std) {
        tensors.push_back(
            {name, DType::F32, {n}, values ? encode(random(name, n, mean, std), DType::F32) : std::vector<uint8_t>{}});
    }
    // A matrix; `quantize` = false keeps it out of FP8 (embeddings, router, indexer gates, MTP projections),
    // as in the GLM-5.2-FP8 checkpoint (model-spec §7.2).
    void mat(const std::string& name, int64_t rows, int64_t cols, bool quantize = true) {
        if (!values) {
            const bool fp8 = linear_dtype == DType::F8_E4M3 && quantize;
            const DType t = fp8 ? DType::F8_E4M3 : linear_dtype == DType::F32 ? DType::F32 : DType::BF16;
            tensors.push_back({name, t, {rows, cols}, {}});
            if (fp8)
                tensors.push_back({name.substr(0, name.size() - std::string(".weight").size()) + ".weight_scale_inv",
                                   DType::F32,
                                   {(rows + 127) / 128, (cols + 127) / 128},
                                   {}});
            return;
        }
        const float std = 1.0f / std::sqrt(static_cast<float>(cols));
        std::vector<float> v = random(name, rows * cols, 0.0f, std);
        if (linear_dtype != DType::F8_E4M3 || !quantize) {
            const DType t = linear_dtype == DType::F32 ? DType::F32 : DType::BF16;
            tensors.push_back({name, t, {rows, cols}, encode(v, t)});
            return;
        }
        // 128×128 blocks: scale = amax / 448, stored as the multiplier (weight_scale_inv).
        const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
        std::vector<float> scales(static_cast<size_t>(br * bc));
        std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
#pragma omp parallel for schedule(dynamic, 1) if (rows * cols >= (1 << 20))
        for (int64_t bi = 0; bi < br; ++bi) {
            for (int64_t bj = 0; bj < bc; ++bj) {
                float amax = 0.0f;
                for (int64_t i = bi * 128; i < std::min(rows, bi * 128 + 128); ++i)
                    for (int64_t j = bj * 128; j < std::min(cols, bj * 128 + 128); ++j)
                        amax = std::max(amax, std::fabs(v[i * cols + j]));
                const float s = std::max(amax, 1e-12f) / 448.0f;
                scales[bi * bc + bj] = s;
                for (int64_t i = bi * 128; i < std::min(rows, bi * 128 + 128); ++i)
                    for (int64_t j = bj * 128; j < std::min(cols, bj * 128 + 128); ++j)
                        q[i * cols + j] = f32_to_fp8e4m3(v[i * cols + j] / s);
            }
        }
        tensors.push_back({name, DType::F8_E4M3, {rows, cols}, std::move(q)});
        const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
        tensors.push_back({stem + ".weight_scale_inv", DType::F32, {br, bc}, encode(scales, DType::F32)});
    }
};

// Removes from `dir` (not below it) the files a gen-model run writes: config, tokenizer, weights, shards and index.
// A 4-shard model's index and shards would otherwise outlive a 1-shard model written over it, and be loaded instead.
void remove_earlier_model(const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    if (!fs::is_directory(dir)) return;
    static const std::regex kShard(R"(model-\d+-of-\d+\.safetensors)");
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        const bool ours = name == "config.json" || name == "tokenizer.json" || name == "tokenizer_config.json" ||
                          name == "model.safetensors" || name == "model.safetensors.index.json" ||
                          std::regex_match(name, kShard);
        if (ours && !e.is_directory()) fs::remove(e.path());
    }
}

}  // namespace

json preset_config(const std::string& preset) {
    json c = {
        {"architectures", {"GlmMoeDsaForCausalLM"}},
        {"model_type", "glm_moe_dsa"},
        {"hidden_act", "silu"},
        {"attention_bias", false},
        {"rope_interleave", true},
        {"indexer_rope_interleave", true},
        {"rope_parameters", {{"rope_theta", 8000000.0}, {"rope_type", "default"}}},
        {"rms_norm_eps", 1e-5},
        {"scoring_func", "sigmoid"},
        {"topk_method", "noaux_tc"},
        {"norm_topk_prob", true},
        {"routed_scaling_factor", 2.5},
        {"n_group", 1},
        {"topk_group", 1},
        {"n_shared_experts", 1},
        {"index_topk_freq", 4},
        {"index_skip_topk_offset", 3},
        {"num_nextn_predict_layers", 1},
        {"index_share_for_mtp_iteration", true},
        {"tie_word_embeddings", false},
        {"dtype", "bfloat16"},
    };
    if (preset == "tiny") {
        c.update({{"vocab_size", 512},
                  {"hidden_size", 64},
                  {"intermediate_size", 128},
                  {"moe_intermediate_size", 32},
                  {"num_hidden_layers", 6},
                  {"num_attention_heads", 4},
                  {"num_key_value_heads", 4},
                  {"q_lora_rank", 48},
                  {"kv_lora_rank", 32},
                  {"qk_nope_head_dim", 24},
                  {"qk_rope_head_dim", 16},
                  {"v_head_dim", 32},
                  {"n_routed_experts", 8},
                  {"num_experts_per_tok", 2},
                  {"first_k_dense_replace", 1},
                  {"index_n_heads", 4},
                  {"index_head_dim", 32},
                  {"index_topk", 32},
                  {"max_position_embeddings", 131072}});
    } else if (preset == "small") {
        c.update({{"vocab_size", 4096},
                  {"hidden_size", 256},
                  {"intermediate_size", 512},
                  {"moe_intermediate_size", 64},
                  {"num_hidden_layers", 8},
                  {"num_attention_heads", 8},
                  {"num_key_value_heads", 8},
                  {"q_lora_rank", 128},
                  {"kv_lora_rank", 64},
                  {"qk_nope_head_dim", 32},
                  {"qk_rope_head_dim", 16},
                  {"v_head_dim", 32},
                  {"n_routed_experts", 16},
                  {"num_experts_per_tok", 4},
                  {"first_k_dense_replace", 1},
                  {"index_n_heads", 8},
                  {"index_head_dim", 64},
                  {"index_topk", 512},
                  {"max_position_embeddings", 131072}});
    } else if (preset == "glm52-shape") {
        // GLM-5.2's attention and indexer dimensions (model-spec §1.1); fewer layers, experts and vocab.
        c.update({{"vocab_size", 16384},
                  {"hidden_size", 6144},
                  {"intermediate_size", 12288},
                  {"moe_intermediate_size", 2048},
                  {"num_hidden_layers", 4},
                  {"num_attention_heads", 64},
                  {"num_key_value_heads", 64},
                  {"q_lora_rank", 2048},
                  {"kv_lora_rank", 512},
                  {"qk_nope_head_dim", 192},
                  {"qk_rope_head_dim", 64},
                  {"v_head_dim", 256},
                  {"n_routed_experts", 4},
                  {"num_experts_per_tok", 2},
                  {"first_k_dense_replace", 1},
                  {"index_n_heads", 32},
                  {"index_head_dim", 128},
                  {"index_topk", 2048},
                  {"max_position_embeddings", 1048576}});
    } else if (preset == "glm52-mini") {
        // GLM-5.2's attention and indexer geometry (what the fast CUDA kernels take: 64 heads, latent 512 + 64,
        // indexer 32 × 128, top-2048) around a small residual stream, so tests run it at > 2048 tokens cheaply.
        c.update({{"vocab_size", 2048},
                  {"hidden_size", 512},
                  {"intermediate_size", 1024},
                  {"moe_intermediate_size", 256},
                  {"num_hidden_layers", 4},
                  {"num_attention_heads", 64},
                  {"num_key_value_heads", 64},
                  {"q_lora_rank", 256},
                  {"kv_lora_rank", 512},
                  {"qk_nope_head_dim", 192},
                  {"qk_rope_head_dim", 64},
                  {"v_head_dim", 256},
                  {"n_routed_experts", 4},
                  {"num_experts_per_tok", 2},
                  {"first_k_dense_replace", 1},
                  {"index_n_heads", 32},
                  {"index_head_dim", 128},
                  {"index_topk", 2048},
                  {"max_position_embeddings", 1048576}});
    } else if (preset == "dsv32-mini") {
        // DeepSeek-V3.2's attention and indexer geometry (128 heads, latent 512 + 64, indexer 64 × 128, top-2048)
        // and its group-limited routing (8 groups, 4 kept) around a small residual stream.
        c.update({{"vocab_size", 2048},
                  {"hidden_size", 512},
                  {"intermediate_size", 1024},
                  {"moe_intermediate_size", 256},
                  {"num_hidden_layers", 4},
                  {"num_attention_heads", 128},
                  {"num_key_value_heads", 128},
                  {"q_lora_rank", 256},
                  {"kv_lora_rank", 512},
                  {"qk_nope_head_dim", 128},
                  {"qk_rope_head_dim", 64},
                  {"v_head_dim", 128},
                  {"n_routed_experts", 16},
                  {"num_experts_per_tok", 2},
                  {"n_group", 8},
                  {"topk_group", 4},
                  {"first_k_dense_replace", 1},
                  {"index_n_heads", 64},
                  {"index_head_dim", 128},
                  {"index_topk", 2048},
                  {"max_position_embeddings", 1048576}});
    } else if (preset == "dsv32-shape") {
        // DeepSeek-V3.2's dimensions (hidden 7168, q_lora 1536, 128 heads); fewer layers, experts and vocab.
        c.update({{"vocab_size", 16384},
                  {"hidden_size", 7168},
                  {"intermediate_size", 18432},
                  {"moe_intermediate_size", 2048},
                  {"num_hidden_layers", 4},
                  {"num_attention_heads", 128},
                  {"num_key_value_heads", 128},
                  {"q_lora_rank", 1536},
                  {"kv_lora_rank", 512},
                  {"qk_nope_head_dim", 128},
                  {"qk_rope_head_dim", 64},
                  {"v_head_dim", 128},
                  {"n_routed_experts", 4},
                  {"num_experts_per_tok", 2},
                  {"n_group", 2},
                  {"topk_group", 1},
                  {"first_k_dense_replace", 1},
                  {"index_n_heads", 64},
                  {"index_head_dim", 128},
                  {"index_topk", 2048},
                  {"max_position_embeddings", 1048576}});
    } else {
        MEGACTX_FAIL(
            "gen-model: unknown preset '{}' (expected tiny, small, glm52-mini, glm52-shape, dsv32-mini or dsv32-shape)",
            preset);
    }
    if (preset.rfind("dsv32-", 0) == 0) {
        // DeepSeek-V3.2's config.json form: no IndexShare (an indexer on every layer), its half-split indexer RoPE
        // and MTP draft steps with their own indexer implied by model_type; YaRN as it ships (factor 40 over 4096
        // positions). max_position_embeddings stays 1M (V3.2 says 163840) so benchmarks can run the window.
        c["architectures"] = {"DeepseekV32ForCausalLM"};
        c["model_type"] = "deepseek_v32";
        for (const char* k : {"index_topk_freq", "index_skip_topk_offset", "indexer_rope_interleave",
                              "index_share_for_mtp_iteration"}) {
            c.erase(k);
        }
        c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0},
                                {"factor", 40.0},      {"original_max_position_embeddings", 4096},
                                {"beta_fast", 32.0},   {"beta_slow", 1.0},
                                {"mscale", 1.0},       {"mscale_all_dim", 1.0}};
        c["rms_norm_eps"] = 1e-6;
    }
    // Like GLM-5.2: generation stops at <|endoftext|>, <|user|> or <|observation|> (the tokenizer gen-model
    // writes puts them at the top of the vocabulary).
    const int64_t vocab = c["vocab_size"].get<int64_t>();
    c["eos_token_id"] = {glm_special_id(vocab, "<|endoftext|>"), glm_special_id(vocab, "<|user|>"),
                         glm_special_id(vocab, "<|observation|>")};
    return c;
}

std::vector<TensorToWrite> model_tensors(const ModelConfig& c, DType lt, uint64_t seed, bool values) {
    Writer w{seed, lt, {}, values};
    const int64_t H = c.hidden_size;
    w.mat("model.embed_tokens.weight", c.vocab_size, H, false);
    w.vec("model.norm.weight", H, 1.0f, 0.1f);
    w.mat("lm_head.weight", c.vocab_size, H, false);
    for (int64_t i = 0; i < c.n_layers_total(); ++i) {
        const std::string p = "model.layers." + std::to_string(i) + ".";
        w.vec(p + "input_layernorm.weight", H, 1.0f, 0.1f);
        w.vec(p + "post_attention_layernorm.weight", H, 1.0f, 0.1f);
        const std::string a = p + "self_attn.";
        w.mat(a + "q_a_proj.weight", c.q_lora_rank, H);
        w.vec(a + "q_a_layernorm.weight", c.q_lora_rank, 1.0f, 0.1f);
        w.mat(a + "q_b_proj.weight", c.n_head * c.qk_head_dim(), c.q_lora_rank);
        w.mat(a + "kv_a_proj_with_mqa.weight", c.d_latent(), H);
        w.vec(a + "kv_a_layernorm.weight", c.kv_lora_rank, 1.0f, 0.1f);
        w.mat(a + "kv_b_proj.weight", c.n_head * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
        w.mat(a + "o_proj.weight", H, c.n_head * c.v_head_dim);
        if (c.is_full(i)) {
            const std::string x = a + "indexer.";
            w.mat(x + "wq_b.weight", c.n_head_indexer * c.d_indexer, c.q_lora_rank);
            w.mat(x + "wk.weight", c.d_indexer, H);
            w.vec(x + "k_norm.weight", c.d_indexer, 1.0f, 0.1f);
            w.vec(x + "k_norm.bias", c.d_indexer, 0.0f, 0.1f);
            w.mat(x + "weights_proj.weight", c.n_head_indexer, H, false);
        }
        auto mlp = [&](const std::string& q, int64_t d_ff) {
            w.mat(q + "gate_proj.weight", d_ff, H);
            w.mat(q + "up_proj.weight", d_ff, H);
            w.mat(q + "down_proj.weight", H, d_ff);
        };
        if (c.is_moe(i)) {
            w.mat(p + "mlp.gate.weight", c.n_routed_experts, H, false);
            w.vec_f32(p + "mlp.gate.e_score_correction_bias", c.n_routed_experts, 0.0f, 0.1f);
            for (int64_t e = 0; e < c.n_routed_experts; ++e) {
                mlp(p + "mlp.experts." + std::to_string(e) + ".", c.moe_intermediate_size);
            }
            mlp(p + "mlp.shared_experts.", c.moe_intermediate_size * c.n_shared_experts);
        } else {
            mlp(p + "mlp.", c.intermediate_size);
        }
        if (i >= c.n_layers) {
            w.vec(p + "enorm.weight", H, 1.0f, 0.1f);
            w.vec(p + "hnorm.weight", H, 1.0f, 0.1f);
            w.vec(p + "shared_head.norm.weight", H, 1.0f, 0.1f);
            w.mat(p + "eh_proj.weight", H, 2 * H, false);
        }
    }

    return std::move(w.tensors);
}

void generate_model(const std::string& out_dir, const GenModelOptions& o) {
    namespace fs = std::filesystem;
    json cj = preset_config(o.preset);
    if (o.layers > 0) cj["num_hidden_layers"] = o.layers;
    if (o.experts > 0) cj["n_routed_experts"] = o.experts;
    if (o.experts_per_tok > 0) cj["num_experts_per_tok"] = o.experts_per_tok;
    MEGACTX_CHECK(cj["num_experts_per_tok"].get<int64_t>() <= cj["n_routed_experts"].get<int64_t>(),
                  "gen-model: {} experts per token but only {} experts", cj["num_experts_per_tok"].get<int64_t>(),
                  cj["n_routed_experts"].get<int64_t>());
    if (!o.index_pattern.empty()) {
        const int64_t n = cj["num_hidden_layers"].get<int64_t>();
        json types = json::array();
        for (int64_t i = 0; i < n; ++i) {
            const char ch = o.index_pattern[static_cast<size_t>(i) % o.index_pattern.size()];
            MEGACTX_CHECK(ch == 'F' || ch == 'S', "gen-model: --index-pattern must be letters F and S, got '{}'",
                          o.index_pattern);
            types.push_back(ch == 'F' ? "full" : "shared");
        }
        MEGACTX_CHECK(types[0] == "full", "gen-model: --index-pattern must start with F (layer 0 runs the indexer)");
        cj["indexer_types"] = types;
    }
    const ModelConfig c = parse_config_json(cj.dump(), "preset " + o.preset);
    std::string dtype = o.dtype.empty() ? (o.preset == "tiny" ? "f32" : "bf16") : o.dtype;
    DType lt;
    if (dtype == "f32") {
        lt = DType::F32;
    } else if (dtype == "bf16") {
        lt = DType::BF16;
    } else if (dtype == "fp8") {
        lt = DType::F8_E4M3;
    } else {
        MEGACTX_FAIL("gen-model: unknown dtype '{}' (expected f32, bf16 or fp8)", dtype);
    }
    MEGACTX_CHECK(o.shards >= 0, "gen-model: --shards must be >= 1, got {}", o.shards);
    const int64_t shards = o.shards > 0 ? o.shards : (o.preset == "glm52-shape" ? 4 : 1);

    std::vector<TensorToWrite> tensors = model_tensors(c, lt, o.seed, true);

    remove_earlier_model(out_dir);
    fs::create_directories(out_dir);
    json config = cj;
    if (lt == DType::F8_E4M3) {
        config["quantization_config"] = {{"quant_method", "fp8"},
                                         {"fmt", "e4m3"},
                                         {"activation_scheme", "dynamic"},
                                         {"weight_block_size", {128, 128}}};
    }
    if (shards <= 1) {
        write_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors);
    } else {
        // Split by bytes into `shards` files, HF naming.
        size_t total = 0;
        for (const auto& t : tensors) total += t.bytes.size();
        const size_t per = total / static_cast<size_t>(shards) + 1;
        json weight_map = json::object();
        std::vector<TensorToWrite> part;
        size_t part_bytes = 0;
        int64_t k = 0;
        auto flush = [&]() {
            ++k;
            const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", k, shards);
            for (const auto& t : part) weight_map[t.name] = name;
            write_safetensors((fs::path(out_dir) / name).string(), part);
            part.clear();
            part_bytes = 0;
        };
        for (auto& t : tensors) {
            part_bytes += t.bytes.size();
            part.push_back(std::move(t));
            if (part_bytes >= per && k < shards - 1) flush();
        }
        while (k < shards) flush();
        json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
        std::ofstream((fs::path(out_dir) / "model.safetensors.index.json").string()) << index.dump(2) << "\n";
    }
    std::ofstream((fs::path(out_dir) / "config.json").string()) << config.dump(2) << "\n";
    write_glm_tokenizer(out_dir, c.vocab_size);
}

}  // namespace megactx
