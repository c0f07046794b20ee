// config.json → ModelConfig for the DSA models: `glm_moe_dsa` (GLM-5, 5.1, 5.2; model-spec §1.1, §4.1) and
// `deepseek_v32` (DeepSeek-V3.2: an indexer on every layer, YaRN RoPE, a half-split indexer RoPE;
// docs/deepseek-v32.md). Per-layer facts (full or shared indexer, dense or MoE) are resolved here once, so the forward
// pass never rediscovers them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ops/rope.h"

namespace megactx {

// `rope_parameters` (or the older `rope_scaling` + `rope_theta`): plain RoPE or YaRN, the fields transformers'
// `_compute_yarn_parameters` reads.
struct RopeConfig {
    std::string type = "default";  // "default" or "yarn"
    float theta = 10000.0f;
    double factor = 1.0;
    int64_t original_max_position_embeddings = 0;
    double beta_fast = 32.0, beta_slow = 1.0;
    double mscale = 0.0, mscale_all_dim = 0.0;  // 0: absent
    double attention_factor = 0.0;              // 0: absent (derived from factor and the mscales)
    bool truncate = true;
};

struct ModelConfig {
    std::string model_type;
    int64_t vocab_size = 0;
    int64_t hidden_size = 0;
    int64_t intermediate_size = 0;      // dense SwiGLU width
    int64_t moe_intermediate_size = 0;  // each routed expert and shared-expert unit
    int64_t n_layers = 0;               // num_hidden_layers (the MTP layers come after these)
    int64_t n_head = 0;
    int64_t q_lora_rank = 0;
    int64_t kv_lora_rank = 0;
    int64_t qk_nope_head_dim = 0;
    int64_t qk_rope_head_dim = 0;
    int64_t v_head_dim = 0;
    int64_t n_routed_experts = 0;
    int64_t n_experts_per_tok = 0;
    int64_t n_shared_experts = 0;
    int64_t n_group = 1;
    int64_t topk_group = 1;
    float routed_scaling_factor = 1.0f;
    bool norm_topk_prob = true;
    float rms_norm_eps = 1e-5f;
    int64_t max_position_embeddings = 0;
    RopeConfig rope;
    bool indexer_rope_interleave = true;  // GLM: interleaved pairs; DeepSeek-V3.2: half-split
    int64_t n_head_indexer = 0;           // index_n_heads
    int64_t d_indexer = 0;                // index_head_dim
    int64_t index_topk = 0;
    // Rotate the indexer's queries and keys by the normalised Walsh–Hadamard matrix before they are quantised to
    // FP8 (model-spec §3.3; kv_format.h hadamard_transform): DeepSeek-V3.2's reference and SGLang do, vLLM and
    // transformers do not. On by default for deepseek_v32, off for GLM; --indexer-hadamard overrides it.
    bool indexer_hadamard = false;
    int64_t n_mtp_layers = 0;     // num_nextn_predict_layers
    bool mtp_index_share = true;  // index_share_for_mtp_iteration: draft steps >= 1 reuse step 0's top-k
    bool tie_word_embeddings = false;
    std::string quant_method;  // quantization_config.quant_method ("fp8" for GLM-5.2-FP8); empty when unquantized
    std::vector<int64_t> eos_token_ids;

    // Resolved per layer, size n_layers: indexer_types > index_topk_pattern > freq/offset > all full.
    std::vector<bool> layer_full;
    // Size n_layers: mlp_layer_types > first_k_dense_replace / moe_layer_freq.
    std::vector<bool> layer_moe;
    std::string indexer_source;  // which config field decided layer_full (for `cost` and logs)

    int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
    int64_t d_latent() const { return kv_lora_rank + qk_rope_head_dim; }  // one MLA cache row
    // Layers 0..n_layers-1 are the decoder; n_layers.. are MTP layers (always full indexer, MoE).
    int64_t n_layers_total() const { return n_layers + n_mtp_layers; }
    bool is_full(int64_t i_layer) const { return i_layer >= n_layers || layer_full[i_layer]; }
    bool is_moe(int64_t i_layer) const { return i_layer >= n_layers || layer_moe[i_layer]; }
    int64_t n_full_layers() const;

    // The RoPE of main attention (always interleaved) and of the indexer, over qk_rope_head_dim dims, with
    // transformers' frequencies and cos/sin factor (YaRN: the ramp between interpolated and extrapolated
    // frequencies, the attention factor).
    Rope attention_rope() const;
    Rope indexer_rope() const;
    // Main attention's softmax scale: qk_head_dim^-0.5, times mscale² under YaRN with mscale_all_dim
    // (mscale = 0.1 · mscale_all_dim · ln(factor) + 1), as transformers' yarn_apply_mscale.
    float attention_softmax_scale() const;
};

// Parses and validates; every error names `source` and the field.
ModelConfig parse_config_json(const std::string& text, const std::string& source);
ModelConfig load_config(const std::string& path);  // a config.json file or a directory holding one

// The value of --indexer-hadamard: "auto" → nullopt (the model's default), "on" → true, "off" → false; anything
// else is an error naming the option and the values it takes.
std::optional<bool> parse_indexer_hadamard(const std::string& value);
// Sets c.indexer_hadamard to `on` unless it is nullopt; on with an index_head_dim that is not a power of two is an
// error (the transform is defined for powers of two).
void override_indexer_hadamard(ModelConfig& c, std::optional<bool> on);

}  // namespace megactx
