// `megactx gen-model`: deterministic random models in the Hugging Face layout (config.json +
// safetensors), with IndexShare (freq 4 / offset 3) and an MTP layer, for the demo, tests and benchmarks.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "core/dtype.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace megactx {

struct GenModelOptions {
    std::string preset = "tiny";  // tiny | small | glm52-shape
    uint64_t seed = 0;
    std::string dtype;            // f32 | bf16 | fp8 (block-quantized linears); empty = the preset's default
    int64_t shards = 0;           // 0 = the preset's default; > 1 writes model.safetensors.index.json
    int64_t layers = 0;           // > 0: this many decoder layers instead of the preset's
    std::string index_pattern;    // non-empty: F/S letters repeated over the layers → explicit indexer_types
                                  // ("F" = every layer full, "FSSS" = one in four)
    int64_t experts = 0;          // > 0: routed experts instead of the preset's (GLM-5.2: 256)
    int64_t experts_per_tok = 0;  // > 0: experts per token instead of the preset's (GLM-5.2: 8)
};

// The preset's config.json contents.
nlohmann::json preset_config(const std::string& preset);
// The checkpoint tensors of a config, as gen-model writes them: linears in `linear_dtype` (FP8 ones with their
// weight_scale_inv; embeddings, router, indexer gates and MTP projections in bf16 then), norms and biases, the MTP
// layers. values = false: names, dtypes and shapes only (empty bytes).
std::vector<TensorToWrite> model_tensors(const ModelConfig& c, DType linear_dtype, uint64_t seed, bool values);
// Writes config.json, the tokenizer and the weights into out_dir (created if missing), first removing the files of
// those names an earlier run left there (shards and index included); other files stay.
void generate_model(const std::string& out_dir, const GenModelOptions& options);

}  // namespace megactx
