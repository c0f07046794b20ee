// `megactx serve`: the OpenAI-compatible server process — HTTP up first (503 while loading), then the model,
// tokenizer and engine; SIGINT/SIGTERM stop taking requests, abort the ones in flight and exit 0. A signal while
// loading exits at once; a load failure closes the port and exits 1.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "parallel/tp_group.h"

namespace megactx {

struct ServeOptions {
    std::string model_dir;
    std::string host = "127.0.0.1";
    int port = 8000;
    int64_t max_model_len = 0;  // 0: the model's max_position_embeddings
    int64_t max_num_seqs = 64;
    int64_t max_num_batched_tokens = 2048;
    std::string kv_cache_memory;    // e.g. "4GiB"; empty: the engine's default
    std::string kv_offload_memory;  // the host KV tier, e.g. "64GiB"; empty: none
    std::string served_model_name;  // empty: the model directory's name
    std::string api_key;
    int64_t max_body_bytes = 32 << 20;
    bool prefix_caching = true;
    int64_t speculative_tokens = 0;   // MTP draft tokens per step (0: off)
    std::string speculative_config;   // vLLM's JSON form: {"method": "mtp", "num_speculative_tokens": K}
    bool no_mtp_index_share = false;  // draft steps >= 1 run the MTP indexer (the IndexShare ablation)
    std::optional<bool> indexer_hadamard;  // --indexer-hadamard on / off (nullopt: the model's default)
    int64_t speculative_disable_by_batch_size = 0;  // > 0: no drafts while more sequences than this decode
    bool access_log = true;           // one line per request on stderr
    double log_interval_s = 10;       // a throughput line this often while there is work (0: never)
    // Creates the op table once the model is loaded and may adjust the engine settings (KV format and size);
    // empty: the CPU backend with an f32 KV cache.
    std::function<std::unique_ptr<Ops>(const GlmDsaModel&, EngineConfig&)> make_backend;
    // Tensor parallel (--tensor-parallel-size > 1): builds the group (model shards, backends, communicators) and
    // may adjust the engine settings; the engine then drives rank 0. Replaces the model load and make_backend.
    std::function<std::unique_ptr<TensorParallelGroup>(EngineConfig&)> make_group;
};

// Parses sizes like "512MiB", "4GiB", "2G", "1000000" (bytes); Error on anything else.
int64_t parse_byte_size(const std::string& s, const std::string& flag);

// The engine settings these options ask for (shared with bench_engine, so both run the same engine).
EngineConfig engine_config(const ServeOptions& options);

// The model, its op table and the engine over them, built from `options` as `serve` builds them: the
// tensor-parallel group (make_group), or the model and then make_backend's op table (the CPU when empty).
// `on_model_loaded` runs once the weights are in, before the backend and the KV cache are made. Used by
// `megactx run` and `megactx eval` too, so every command runs the same engine.
struct LoadedEngine {
    std::unique_ptr<TensorParallelGroup> group;
    std::unique_ptr<GlmDsaModel> single;
    std::unique_ptr<Ops> ops;        // with `single`
    std::unique_ptr<Engine> engine;  // declared last: destroyed first
    const GlmDsaModel& model() const { return group ? group->model() : *single; }
};
LoadedEngine load_engine(const ServeOptions& options,
                         const std::function<void(const GlmDsaModel&)>& on_model_loaded = {});

// The API's model name for a directory: its last component, whatever the trailing slashes ("megactx" if none).
std::string served_name_for(const std::string& model_dir);

// Runs until SIGINT/SIGTERM; returns the process exit code (a load failure exits the process with status 1).
int serve_main(const ServeOptions& options);

}  // namespace megactx
