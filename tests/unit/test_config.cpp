// parse_config_json / load_config: the tiny preset's resolved values, indexer-type precedence (model-spec §4.1),
// RoPE fields, MLP layer types, and errors that name the field.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "io/config.h"
#include "model/gen_model.h"
#include "test_util.h"

namespace megactx {
namespace {

using json = nlohmann::json;
using test::error_of;
using test::expect_contains;

json tiny() { return preset_config("tiny"); }

ModelConfig parse(const json& j) { return parse_config_json(j.dump(), "cfg.json"); }

std::string parse_error(const json& j) {
    return error_of([&] { parse(j); });
}

// "FFFSSS…" for layer_full.
std::string pattern(const ModelConfig& c) {
    std::string s;
    for (bool f : c.layer_full) s += f ? 'F' : 'S';
    return s;
}

// A tiny config with `n` layers and the indexer fields removed.
json with_layers(int64_t n) {
    json j = tiny();
    j["num_hidden_layers"] = n;
    j.erase("index_topk_freq");
    j.erase("index_skip_topk_offset");
    return j;
}

TEST(Config, TinyPresetValues) {
    const ModelConfig c = parse(tiny());
    EXPECT_EQ(c.model_type, "glm_moe_dsa");
    EXPECT_EQ(c.vocab_size, 512);
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_EQ(c.intermediate_size, 128);
    EXPECT_EQ(c.moe_intermediate_size, 32);
    EXPECT_EQ(c.n_layers, 6);
    EXPECT_EQ(c.n_head, 4);
    EXPECT_EQ(c.q_lora_rank, 48);
    EXPECT_EQ(c.kv_lora_rank, 32);
    EXPECT_EQ(c.qk_head_dim(), 40);
    EXPECT_EQ(c.d_latent(), 48);
    EXPECT_EQ(c.v_head_dim, 32);
    EXPECT_EQ(c.n_routed_experts, 8);
    EXPECT_EQ(c.n_experts_per_tok, 2);
    EXPECT_EQ(c.n_shared_experts, 1);
    EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.5f);
    EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
    EXPECT_EQ(c.max_position_embeddings, 131072);
    EXPECT_FLOAT_EQ(c.rope.theta, 8e6f);
    EXPECT_EQ(c.n_head_indexer, 4);
    EXPECT_EQ(c.d_indexer, 32);
    EXPECT_EQ(c.index_topk, 32);
    EXPECT_EQ(c.n_mtp_layers, 1);
    EXPECT_EQ(c.n_layers_total(), 7);
    // <|endoftext|>, <|user|>, <|observation|>: the top 32 ids of the 512 hold gen-model's GLM special tokens.
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{480, 487, 489}));
    EXPECT_EQ(pattern(c), "FFFSSS");
    EXPECT_EQ(c.n_full_layers(), 3);
    EXPECT_TRUE(c.is_full(6));  // the MTP layer always has its own indexer
    EXPECT_EQ(c.layer_moe, (std::vector<bool>{false, true, true, true, true, true}));
    EXPECT_TRUE(c.is_moe(6));
    EXPECT_EQ(c.indexer_source, "index_topk_freq/index_skip_topk_offset");
}

TEST(Config, FreqOffsetRuleOnEightLayers) {
    json j = with_layers(8);
    j["index_topk_freq"] = 4;
    j["index_skip_topk_offset"] = 3;
    EXPECT_EQ(pattern(parse(j)), "FFFSSSFS");
}

TEST(Config, FreqOffsetRuleOnGlm52Layers) {
    json j = with_layers(78);
    j["index_topk_freq"] = 4;
    j["index_skip_topk_offset"] = 3;
    const ModelConfig c = parse(j);
    std::vector<int64_t> full;
    for (int64_t i = 0; i < 78; ++i)
        if (c.layer_full[static_cast<size_t>(i)]) full.push_back(i);
    std::vector<int64_t> expect = {0, 1, 2};
    for (int64_t i = 6; i <= 74; i += 4) expect.push_back(i);
    EXPECT_EQ(full, expect);
    EXPECT_EQ(c.n_full_layers(), 21);
}

TEST(Config, FreqOffsetDefaults) {
    json j = with_layers(8);
    j["index_topk_freq"] = 4;  // offset defaults to 2: max(i - 1, 0) % 4 == 0
    EXPECT_EQ(pattern(parse(j)), "FFSSSFSS");
    j = with_layers(8);
    j["index_skip_topk_offset"] = 3;  // freq defaults to 1: all full
    EXPECT_EQ(pattern(parse(j)), "FFFFFFFF");
    j["index_topk_freq"] = 0;  // freq 0 is treated as 1
    EXPECT_EQ(pattern(parse(j)), "FFFFFFFF");
}

TEST(Config, NoIndexerFieldsMeansAllFull) {
    const ModelConfig c = parse(with_layers(5));
    EXPECT_EQ(pattern(c), "FFFFF");
    EXPECT_EQ(c.indexer_source, "default (all layers full)");
    json j = with_layers(5);
    j["index_topk_pattern"] = nullptr;  // null counts as absent (GLM-5.2 ships "index_topk_pattern": null)
    j["indexer_types"] = nullptr;
    EXPECT_EQ(pattern(parse(j)), "FFFFF");
}

TEST(Config, IndexerTypePrecedence) {
    json j = with_layers(8);
    j["index_topk_freq"] = 4;
    j["index_skip_topk_offset"] = 3;
    j["index_topk_pattern"] = "FSFSFSFS";
    j["indexer_types"] = {"full", "full", "shared", "full", "shared", "shared", "shared", "full"};
    ModelConfig c = parse(j);
    EXPECT_EQ(pattern(c), "FFSFSSSF");
    EXPECT_EQ(c.indexer_source, "indexer_types");
    j.erase("indexer_types");
    c = parse(j);
    EXPECT_EQ(pattern(c), "FSFSFSFS");
    EXPECT_EQ(c.indexer_source, "index_topk_pattern");
    j.erase("index_topk_pattern");
    c = parse(j);
    EXPECT_EQ(pattern(c), "FFFSSSFS");
    EXPECT_EQ(c.indexer_source, "index_topk_freq/index_skip_topk_offset");
}

TEST(Config, InvalidIndexerTypes) {
    json j = with_layers(4);
    j["indexer_types"] = {"full", "dense", "full", "full"};
    expect_contains(parse_error(j), {"cfg.json", "invalid indexer pattern", "indexer_types[1] = \"dense\""});
    j["indexer_types"] = {"full", 1, "full", "full"};
    expect_contains(parse_error(j), {"indexer_types[1] = 1"});
    j["indexer_types"] = {"full", "shared", "full"};
    expect_contains(parse_error(j), {"invalid indexer pattern", "'indexer_types' must be a list of 4 entries"});
    j["indexer_types"] = "full";
    expect_contains(parse_error(j), {"'indexer_types' must be a list of 4 entries"});
    j["indexer_types"] = {"shared", "full", "full", "full"};
    expect_contains(parse_error(j), {"invalid indexer pattern", "layer 0 is 'shared'"});
}

TEST(Config, InvalidIndexTopkPattern) {
    json j = with_layers(4);
    j["index_topk_pattern"] = "FSXF";
    expect_contains(parse_error(j), {"cfg.json", "invalid indexer pattern", "index_topk_pattern[2] = 'X'"});
    j["index_topk_pattern"] = "fssf";
    expect_contains(parse_error(j), {"index_topk_pattern[0] = 'f'"});
    j["index_topk_pattern"] = "FSS";
    expect_contains(parse_error(j), {"index_topk_pattern has 3 letters for 4 layers"});
    j["index_topk_pattern"] = json::array({"F", "S", "S", "S"});
    expect_contains(parse_error(j), {"'index_topk_pattern' must be a string"});
    j["index_topk_pattern"] = "SFFF";
    expect_contains(parse_error(j), {"layer 0 is 'shared'"});
}

TEST(Config, InvalidFreqOffset) {
    json j = with_layers(4);
    j["index_topk_freq"] = "4";
    expect_contains(parse_error(j), {"field 'index_topk_freq' must be an integer"});
    j["index_topk_freq"] = 4;
    j["index_skip_topk_offset"] = -1;
    expect_contains(parse_error(j), {"field 'index_skip_topk_offset' = -1 is out of range"});
    j["index_skip_topk_offset"] = 0;  // max(i + 1, 0) % 4: layer 0 would be shared
    expect_contains(parse_error(j), {"layer 0 is 'shared'"});
}

TEST(Config, RopeParametersWinOverLegacyFields) {
    json j = tiny();
    j["rope_theta"] = 1000.0;
    j["rope_scaling"] = {{"type", "yarn"}};  // ignored: rope_parameters is present
    EXPECT_FLOAT_EQ(parse(j).rope.theta, 8e6f);
    j["rope_parameters"] = {{"rope_type", "default"}};  // no theta inside: the top-level one
    EXPECT_FLOAT_EQ(parse(j).rope.theta, 1000.0f);
    j.erase("rope_theta");
    EXPECT_FLOAT_EQ(parse(j).rope.theta, 10000.0f);
    j["rope_parameters"] = {{"rope_theta", 5e5}, {"type", "yarn"}};
    expect_contains(parse_error(j), {"cfg.json", "rope_parameters.factor must be positive for YaRN"});
    j["rope_parameters"] = {{"rope_theta", 5e5}, {"type", "llama3"}};
    expect_contains(parse_error(j), {"cfg.json", "rope type 'llama3' is not supported"});
    j["rope_parameters"] = "default";
    expect_contains(parse_error(j), {"'rope_parameters' must be an object"});
    j["rope_parameters"] = {{"rope_theta", -1.0}};
    expect_contains(parse_error(j), {"rope_theta must be positive"});
}

TEST(Config, LegacyRopeFields) {
    json j = tiny();
    j.erase("rope_parameters");
    j["rope_theta"] = 1e6;
    j["rope_scaling"] = nullptr;
    EXPECT_FLOAT_EQ(parse(j).rope.theta, 1e6f);
    j.erase("rope_theta");
    EXPECT_FLOAT_EQ(parse(j).rope.theta, 10000.0f);
    j["rope_scaling"] = {{"rope_type", "default"}};
    EXPECT_FLOAT_EQ(parse(j).rope.theta, 10000.0f);
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
    expect_contains(parse_error(j), {"rope type 'linear' is not supported"});
    j["rope_scaling"] = 4;
    expect_contains(parse_error(j), {"'rope_scaling' must be an object or null"});
    j["rope_scaling"] = nullptr;
    j["rope_theta"] = "1e6";
    expect_contains(parse_error(j), {"field 'rope_theta' must be a number"});
}

// DeepSeek-V3.2's own config.json fields (legacy `rope_scaling`), against transformers' _compute_yarn_parameters
// and yarn_apply_mscale evaluated step by step in fp32 (numpy; correction range 10..23 of 32 pairs).
TEST(Config, DeepSeekV32YarnAsTransformersComputesIt) {
    json j = tiny();
    j["model_type"] = "deepseek_v32";
    j.erase("rope_parameters");
    j.erase("index_topk_freq");
    j.erase("index_skip_topk_offset");
    j.erase("index_topk_pattern");
    j.erase("indexer_types");
    j.erase("index_share_for_mtp_iteration");
    j.erase("indexer_rope_interleave");
    j["qk_rope_head_dim"] = 64;
    j["qk_nope_head_dim"] = 128;
    j["index_head_dim"] = 128;
    j["rope_theta"] = 10000;
    j["rope_scaling"] = {{"beta_fast", 32}, {"beta_slow", 1},        {"factor", 40},
                         {"mscale", 1.0},   {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096},
                         {"type", "yarn"}};
    const ModelConfig c = parse(j);
    EXPECT_EQ(c.n_full_layers(), c.n_layers);  // an indexer on every layer
    EXPECT_FALSE(c.mtp_index_share);           // the MTP layer's own indexer at every draft step
    const Rope a = c.attention_rope(), x = c.indexer_rope();
    EXPECT_TRUE(a.interleaved);
    EXPECT_FALSE(x.interleaved);  // half-split pairs in the indexer
    ASSERT_EQ(a.dim(), 64);
    EXPECT_EQ(a.inv_freq, x.inv_freq);
    EXPECT_FLOAT_EQ(a.scale, 1.0f);  // mscale / mscale_all_dim = 1
    const std::vector<std::pair<int, float>> expected = {
        {0, 1.0f},           {5, 0.237137392f},     {10, 0.0562341288f},   {11, 0.0390069261f},
        {12, 0.0268793609f}, {20, 0.000790569407f}, {25, 1.87473543e-05f}, {31, 3.33380353e-06f}};
    for (const auto& [i, f] : expected) EXPECT_FLOAT_EQ(a.inv_freq[static_cast<size_t>(i)], f) << i;
    EXPECT_FLOAT_EQ(c.attention_softmax_scale(), 0.135233779f);  // 192^-0.5 · (0.1 ln 40 + 1)²

    // attention_factor from mscale / mscale_all_dim, or given
    j["rope_scaling"]["mscale"] = 0.5;
    EXPECT_FLOAT_EQ(parse(j).attention_rope().scale,
                    static_cast<float>((0.05 * std::log(40.0) + 1) / (0.1 * std::log(40.0) + 1)));
    j["rope_scaling"]["attention_factor"] = 1.25;
    EXPECT_FLOAT_EQ(parse(j).attention_rope().scale, 1.25f);

    // GLM keeps plain interleaved RoPE in both places and its draft steps share step 0's indices
    const ModelConfig g = parse(tiny());
    EXPECT_TRUE(g.indexer_rope().interleaved);
    EXPECT_TRUE(g.mtp_index_share);
    EXPECT_FLOAT_EQ(g.attention_rope().scale, 1.0f);
    EXPECT_FLOAT_EQ(g.attention_softmax_scale(), 1.0f / std::sqrt(static_cast<float>(g.qk_head_dim())));
}

// The indexer's Hadamard-before-FP8 (model-spec §3.3): DeepSeek-V3.2's reference applies it, GLM's reference
// engines do not; --indexer-hadamard on / off overrides the model's default.
TEST(Config, IndexerHadamardDefaultsAndOverride) {
    const std::string data = MEGACTX_TEST_DATA;
    EXPECT_FALSE(parse(tiny()).indexer_hadamard);
    EXPECT_FALSE(load_config(data + "/glm52_config.json").indexer_hadamard);
    ModelConfig v32 = load_config(data + "/deepseek_v32/config.json");
    EXPECT_EQ(v32.d_indexer, 128);
    EXPECT_TRUE(v32.indexer_hadamard);

    EXPECT_EQ(parse_indexer_hadamard("auto"), std::nullopt);
    EXPECT_EQ(parse_indexer_hadamard("on"), std::optional<bool>(true));
    EXPECT_EQ(parse_indexer_hadamard("off"), std::optional<bool>(false));
    expect_contains(error_of([] { parse_indexer_hadamard("yes"); }), {"--indexer-hadamard 'yes'", "auto, on or off"});

    override_indexer_hadamard(v32, std::nullopt);
    EXPECT_TRUE(v32.indexer_hadamard);
    override_indexer_hadamard(v32, false);
    EXPECT_FALSE(v32.indexer_hadamard);
    ModelConfig glm = parse(tiny());
    override_indexer_hadamard(glm, true);
    EXPECT_TRUE(glm.indexer_hadamard);

    // The transform needs a power-of-two key: a V3.2-typed model with 96-dim keys keeps it off, and forcing it on
    // is an error naming the dimension.
    json j = tiny();
    j["model_type"] = "deepseek_v32";
    j["index_head_dim"] = 96;
    ModelConfig odd = parse(j);
    EXPECT_FALSE(odd.indexer_hadamard);
    expect_contains(error_of([&] { override_indexer_hadamard(odd, true); }),
                    {"--indexer-hadamard on", "index_head_dim 96", "power of two"});
}

TEST(Config, HeadDimIsIgnored) {
    json j = tiny();
    j["head_dim"] = 999;
    const ModelConfig c = parse(j);
    EXPECT_EQ(c.qk_head_dim(), 24 + 16);
    EXPECT_EQ(c.v_head_dim, 32);
    j["head_dim"] = "not even a number";
    EXPECT_EQ(parse(j).qk_head_dim(), 40);
}

TEST(Config, MlpLayerTypesWinOverFirstKDense) {
    json j = tiny();
    j["first_k_dense_replace"] = 3;
    EXPECT_EQ(parse(j).layer_moe, (std::vector<bool>{false, false, false, true, true, true}));
    j["mlp_layer_types"] = {"sparse", "dense", "sparse", "dense", "dense", "sparse"};
    EXPECT_EQ(parse(j).layer_moe, (std::vector<bool>{true, false, true, false, false, true}));
    j["mlp_layer_types"] = {"sparse", "dense", "moe", "dense", "dense", "sparse"};
    expect_contains(parse_error(j), {"cfg.json", "mlp_layer_types[2] = \"moe\""});
    j["mlp_layer_types"] = {"sparse"};
    expect_contains(parse_error(j), {"'mlp_layer_types' must be a list of 6 entries"});
    j.erase("mlp_layer_types");
    j.erase("first_k_dense_replace");  // default 3
    EXPECT_EQ(parse(j).layer_moe, (std::vector<bool>{false, false, false, true, true, true}));
    j["moe_layer_freq"] = 2;
    EXPECT_EQ(parse(j).layer_moe, (std::vector<bool>{false, false, false, false, true, false}));
}

TEST(Config, EosTokenIdForms) {
    json j = tiny();
    j["eos_token_id"] = 7;
    EXPECT_EQ(parse(j).eos_token_ids, (std::vector<int64_t>{7}));
    j["eos_token_id"] = {3, 4, 5};
    EXPECT_EQ(parse(j).eos_token_ids, (std::vector<int64_t>{3, 4, 5}));
    j.erase("eos_token_id");
    EXPECT_TRUE(parse(j).eos_token_ids.empty());
    j["eos_token_id"] = "</s>";
    expect_contains(parse_error(j), {"field 'eos_token_id' must be an integer or a list"});
    j["eos_token_id"] = {1, "x"};
    expect_contains(parse_error(j), {"field 'eos_token_id' must hold integers"});
}

TEST(Config, NotJsonOrNotObject) {
    expect_contains(error_of([] { parse_config_json("{\"model_type\": ", "bad.json"); }),
                    {"bad.json", "not valid JSON"});
    expect_contains(error_of([] { parse_config_json("", "empty.json"); }), {"empty.json", "not valid JSON"});
    expect_contains(error_of([] { parse_config_json("[1, 2]", "arr.json"); }), {"arr.json", "must be a JSON object"});
}

TEST(Config, ModelTypeErrors) {
    json j = tiny();
    j.erase("model_type");
    expect_contains(parse_error(j), {"cfg.json", "missing field 'model_type'"});
    j["model_type"] = "deepseek_v3";
    expect_contains(parse_error(j), {"model_type 'deepseek_v3' is not supported", "glm_moe_dsa"});
    j["model_type"] = 3;
    expect_contains(parse_error(j), {"field 'model_type' must be a string"});
}

TEST(Config, RequiredFieldErrorsNameTheField) {
    for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                            "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                            "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
                            "max_position_embeddings", "index_n_heads", "index_head_dim", "index_topk"}) {
        json j = tiny();
        j.erase(key);
        expect_contains(parse_error(j), {"cfg.json", fmt::format("missing field '{}'", key)});
        j[key] = nullptr;
        expect_contains(parse_error(j), {fmt::format("missing field '{}'", key)});
        j[key] = "64";
        expect_contains(parse_error(j), {fmt::format("field '{}' must be an integer, got \"64\"", key)});
        j[key] = 64.5;
        expect_contains(parse_error(j), {fmt::format("field '{}' must be an integer", key)});
        j[key] = 0;
        expect_contains(parse_error(j), {fmt::format("field '{}' = 0 is out of range", key)});
        j[key] = -5;
        expect_contains(parse_error(j), {fmt::format("field '{}' = -5 is out of range", key)});
    }
}

TEST(Config, HugeValuesAreRejected) {
    json j = tiny();
    j["vocab_size"] = int64_t{1} << 41;
    expect_contains(parse_error(j), {"field 'vocab_size'", "out of range"});
    j = tiny();
    j["hidden_size"] = UINT64_MAX;
    expect_contains(parse_error(j), {"field 'hidden_size'", "out of range"});
    // Layer lists are allocated while parsing: an absurd layer count is an error, not a 100 GB allocation.
    j = tiny();
    j["num_hidden_layers"] = int64_t{1} << 40;
    expect_contains(parse_error(j), {"field 'num_hidden_layers'", "out of range"});
    j = tiny();
    j["num_nextn_predict_layers"] = int64_t{1} << 40;
    expect_contains(parse_error(j), {"field 'num_nextn_predict_layers'", "out of range"});
}

TEST(Config, UnsupportedArchitectureFields) {
    const std::vector<std::pair<json, std::string>> cases = {
        {{{"num_key_value_heads", 2}}, "num_key_value_heads (2) must equal num_attention_heads (4)"},
        {{{"q_lora_rank", nullptr}}, "missing field 'q_lora_rank'"},
        {{{"hidden_act", "gelu"}}, "hidden_act 'gelu' is not supported"},
        {{{"scoring_func", "softmax"}}, "scoring_func 'softmax' is not supported"},
        {{{"attention_bias", true}}, "attention_bias = true is not supported"},
        {{{"attention_bias", 1}}, "field 'attention_bias' must be true or false"},
        {{{"rope_interleave", false}}, "rope_interleave = false is not supported"},
        {{{"indexer_rope_interleave", 0}}, "field 'indexer_rope_interleave' must be true or false"},
        {{{"qk_rope_head_dim", 15}}, "qk_rope_head_dim must be even"},
        {{{"index_head_dim", 8}}, "index_head_dim (8) must be at least qk_rope_head_dim (16)"},
        {{{"num_experts_per_tok", 9}}, "num_experts_per_tok (9) exceeds n_routed_experts (8)"},
        {{{"n_group", 3}}, "n_routed_experts (8) must be divisible by n_group (3)"},
        {{{"topk_group", 2}}, "topk_group (2) exceeds n_group (1)"},
        {{{"n_group", 8}, {"topk_group", 1}}, "group-limited routing needs at least 2 experts per group"},
        {{{"n_group", 4}, {"topk_group", 1}, {"num_experts_per_tok", 3}},
         "num_experts_per_tok (3) exceeds the experts in topk_group groups"},
        {{{"rms_norm_eps", "small"}}, "field 'rms_norm_eps' must be a number"},
        {{{"norm_topk_prob", "yes"}}, "field 'norm_topk_prob' must be true or false"},
    };
    for (const auto& [patch, message] : cases) {
        json j = tiny();
        j.update(patch);
        expect_contains(parse_error(j), {"cfg.json", message});
    }
}

TEST(Config, LoadConfigFromFileOrDirectory) {
    test::TempDir dir;
    json j = tiny();
    j["vocab_size"] = 300;
    test::write_text(dir / "config.json", j.dump());
    EXPECT_EQ(load_config(dir.path().string()).vocab_size, 300);
    EXPECT_EQ(load_config(dir / "config.json").vocab_size, 300);
    test::write_text(dir / "config.json", "{");
    expect_contains(error_of([&] { load_config(dir.path().string()); }), {dir / "config.json", "not valid JSON"});
    std::filesystem::remove(dir / "config.json");
    expect_contains(error_of([&] { load_config(dir.path().string()); }), {dir / "config.json", "missing config.json"});
    expect_contains(error_of([&] { load_config(dir / "nowhere"); }), {dir / "nowhere", "missing config.json"});
}

}  // namespace
}  // namespace megactx
