#include "engine/loader.h"

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace megactx {

int64_t parse_byte_size(const std::string& s, const std::string& flag) {
    size_t used = 0;
    double v = 0;
    try {
        v = std::stod(s, &used);
    } catch (const std::exception&) {
        MEGACTX_FAIL("{}: '{}' is not a size (examples: 4GiB, 512MiB, 1000000)", flag, s);
    }
    std::string unit = s.substr(used);
    double mul = 1;
    if (unit == "" || unit == "B") {
        mul = 1;
    } else if (unit == "K" || unit == "KB" || unit == "KiB") {
        mul = 1024.0;
    } else if (unit == "M" || unit == "MB" || unit == "MiB") {
        mul = 1024.0 * 1024;
    } else if (unit == "G" || unit == "GB" || unit == "GiB") {
        mul = 1024.0 * 1024 * 1024;
    } else if (unit == "T" || unit == "TB" || unit == "TiB") {
        mul = 1024.0 * 1024 * 1024 * 1024;
    } else {
        MEGACTX_FAIL("{}: unknown unit in '{}' (use B, KiB, MiB, GiB or TiB)", flag, s);
    }
    MEGACTX_CHECK(v > 0 && v * mul < 9e18, "{}: '{}' must be a positive size", flag, s);
    return static_cast<int64_t>(v * mul);
}

EngineConfig engine_config(const EngineOptions& o) {
    EngineConfig ec;
    ec.max_model_len = o.max_model_len;
    ec.scheduler.max_num_seqs = o.max_num_seqs;
    ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
    ec.prefix_caching = o.prefix_caching;
    if (!o.kv_cache_memory.empty()) ec.kv_cache_bytes = parse_byte_size(o.kv_cache_memory, "--kv-cache-memory");
    if (!o.kv_offload_memory.empty())
        ec.kv_offload_bytes = parse_byte_size(o.kv_offload_memory, "--kv-offload-memory");
    ec.speculative_tokens = o.speculative_tokens;
    if (!o.speculative_config.empty()) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(o.speculative_config);
        } catch (const std::exception& e) {
            MEGACTX_FAIL("--speculative-config: not JSON ({})", e.what());
        }
        MEGACTX_CHECK(j.is_object(), "--speculative-config: expected a JSON object");
        for (const auto& [key, value] : j.items()) {
            MEGACTX_CHECK(key == "method" || key == "num_speculative_tokens" || key == "disable_by_batch_size",
                          "--speculative-config: unknown field '{}' (method, num_speculative_tokens, "
                          "disable_by_batch_size)",
                          key);
        }
        MEGACTX_CHECK(j.contains("method") && j["method"].is_string() && j["method"] == "mtp",
                      "--speculative-config: method must be \"mtp\" (the checkpoint's MTP layer)");
        MEGACTX_CHECK(j.contains("num_speculative_tokens") && j["num_speculative_tokens"].is_number_integer(),
                      "--speculative-config: num_speculative_tokens must be an integer");
        const int64_t k = j["num_speculative_tokens"].get<int64_t>();
        MEGACTX_CHECK(o.speculative_tokens == 0 || o.speculative_tokens == k,
                      "--speculative-tokens {} and --speculative-config's num_speculative_tokens {} disagree",
                      o.speculative_tokens, k);
        ec.speculative_tokens = k;
        if (j.contains("disable_by_batch_size")) {
            MEGACTX_CHECK(j["disable_by_batch_size"].is_number_integer() && j["disable_by_batch_size"].get<int64_t>() > 0,
                          "--speculative-config: disable_by_batch_size must be a positive integer");
            const int64_t b = j["disable_by_batch_size"].get<int64_t>();
            MEGACTX_CHECK(o.speculative_disable_by_batch_size == 0 || o.speculative_disable_by_batch_size == b,
                          "--speculative-disable-by-batch-size {} and --speculative-config's disable_by_batch_size {} "
                          "disagree",
                          o.speculative_disable_by_batch_size, b);
            ec.speculative_disable_by_batch_size = b;
        }
    }
    if (ec.speculative_disable_by_batch_size == 0)
        ec.speculative_disable_by_batch_size = o.speculative_disable_by_batch_size;
    ec.no_mtp_index_share = o.no_mtp_index_share;
    return ec;
}

LoadedEngine load_engine(const EngineOptions& o, const std::function<void(const GlmDsaModel&)>& on_model_loaded) {
    EngineConfig ec = engine_config(o);
    LoadedEngine e;
    if (o.make_group) {
        e.group = o.make_group(ec);
    } else {
        e.single = std::make_unique<GlmDsaModel>(o.model_dir);
        e.single->override_indexer_hadamard(o.indexer_hadamard);
    }
    if (on_model_loaded) on_model_loaded(e.model());
    if (!e.group) e.ops = o.make_backend ? o.make_backend(*e.single, ec) : std::make_unique<CpuOps>();
    e.engine = std::make_unique<Engine>(e.model(), e.group ? e.group->ops() : *e.ops, ec);
    return e;
}

}  // namespace megactx
