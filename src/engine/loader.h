// Bringing an engine up (issue 53): the options every engine command shares (`serve`, `run`, `eval`, the
// benchmarks), turned into the engine settings, and the model, its op table and the engine built from them — the
// tensor-parallel / pipeline group (make_group) or one model and its backend. The server adds HTTP on top
// (server/serve.h); a headless node loads its ranks without either (tools/engine_setup.h, follower_main).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "parallel/tp_group.h"

namespace megactx {

struct EngineOptions {
    std::string model_dir;
    int64_t max_model_len = 0;  // 0: the model's max_position_embeddings
    int64_t max_num_seqs = 64;
    int64_t max_num_batched_tokens = 2048;
    std::string kv_cache_memory;    // e.g. "4GiB"; empty: the engine's default
    std::string kv_offload_memory;  // the host KV tier, e.g. "64GiB"; empty: none
    bool prefix_caching = true;
    int64_t speculative_tokens = 0;   // MTP draft tokens per step (0: off)
    std::string speculative_config;   // vLLM's JSON form: {"method": "mtp", "num_speculative_tokens": K}
    bool no_mtp_index_share = false;  // draft steps >= 1 run the MTP indexer (the IndexShare ablation)
    std::optional<bool> indexer_hadamard;  // --indexer-hadamard on / off (nullopt: the model's default)
    int64_t speculative_disable_by_batch_size = 0;  // > 0: no drafts while more sequences than this decode
    // Creates the op table once the model is loaded and may adjust the engine settings (KV format and size);
    // empty: the CPU backend with an f32 KV cache.
    std::function<std::unique_ptr<Ops>(const GlmDsaModel&, EngineConfig&)> make_backend;
    // Several ranks (--tensor-parallel-size or --pipeline-parallel-size > 1, or --nnodes): builds the group (model
    // shards, backends, communicators, pipes) and may adjust the engine settings; the engine then drives rank 0.
    // Replaces the model load and make_backend.
    std::function<std::unique_ptr<TensorParallelGroup>(EngineConfig&)> make_group;
};

// Parses sizes like "512MiB", "4GiB", "2G", "1000000" (bytes); Error on anything else.
int64_t parse_byte_size(const std::string& s, const std::string& flag);

// The engine settings these options ask for (--speculative-config checked and merged).
EngineConfig engine_config(const EngineOptions& options);

// The model, its op table and the engine over them: the group (make_group), or the model and then make_backend's
// op table (the CPU when empty). `on_model_loaded` runs once the weights are in, before the backend and the KV
// cache are made.
struct LoadedEngine {
    std::unique_ptr<TensorParallelGroup> group;
    std::unique_ptr<GlmDsaModel> single;
    std::unique_ptr<Ops> ops;        // with `single`
    std::unique_ptr<Engine> engine;  // declared last: destroyed first
    const GlmDsaModel& model() const { return group ? group->model() : *single; }
};
LoadedEngine load_engine(const EngineOptions& options,
                         const std::function<void(const GlmDsaModel&)>& on_model_loaded = {});

}  // namespace megactx
