#include "server/serve.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "server/api_error.h"
#include "server/http.h"
#include "server/openai_api.h"

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

EngineConfig engine_config(const ServeOptions& o) {
    EngineConfig ec;
    ec.max_model_len = o.max_model_len;
    ec.scheduler.max_num_seqs = o.max_num_seqs;
    ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
    ec.prefix_caching = o.prefix_caching;
    if (!o.kv_cache_memory.empty()) ec.kv_cache_bytes = parse_byte_size(o.kv_cache_memory, "--kv-cache-memory");
    return ec;
}

int serve_main(const ServeOptions& o) {
    // Signals go to one waiting thread only: block them before any thread starts.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    signal(SIGPIPE, SIG_IGN);

    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    std::atomic<OpenAiApi*> api{nullptr};
    HttpServerConfig hc;
    hc.host = o.host;
    hc.port = o.port;
    hc.max_body_bytes = static_cast<size_t>(o.max_body_bytes);
    HttpServer http(hc);
    http.set_error_body([](int status, const std::string& message) { return api_error_body(status, message); });
    const auto loading = [] {
        HttpResponse r;
        r.status = 503;
        r.body = api_error_body(503, "the model is still loading");
        return r;
    };
    auto route = [&](const char* method, const char* path, HttpResponse (OpenAiApi::*fn)(const HttpRequest&)) {
        http.route(method, path, [&api, fn, loading](const HttpRequest& req) {
            OpenAiApi* a = api.load();
            return a ? (a->*fn)(req) : loading();
        });
    };
    route("POST", "/v1/chat/completions", &OpenAiApi::chat_completions);
    route("POST", "/v1/completions", &OpenAiApi::completions);
    route("GET", "/v1/models", &OpenAiApi::models);
    route("GET", "/health", &OpenAiApi::health);
    route("GET", "/metrics", &OpenAiApi::metrics);
    std::string bind_error;
    MEGACTX_CHECK(http.bind(&bind_error), "{}", bind_error);
    std::thread http_thread([&] { http.serve(); });
    std::fprintf(stderr, "megactx serve: listening on http://%s:%d (loading; /health answers 503 until ready)\n",
                 o.host.c_str(), http.bound_port());

    int rc = 0;
    try {
        const std::string dir = o.model_dir;
        std::fprintf(stderr, "megactx serve: loading model from %s\n", dir.c_str());
        EngineConfig ec = engine_config(o);
        std::unique_ptr<TensorParallelGroup> group;
        std::unique_ptr<GlmDsaModel> single;
        if (o.make_group) {
            group = o.make_group(ec);
        } else {
            single = std::make_unique<GlmDsaModel>(dir);
        }
        const GlmDsaModel& model = group ? group->model() : *single;
        const ModelConfig& c = model.config();
        std::fprintf(stderr, "megactx serve: model loaded in %.2f s (%lld layers, %lld with a full indexer, MTP %s)\n",
                     elapsed(), static_cast<long long>(c.n_layers), static_cast<long long>(c.n_full_layers()),
                     model.has_mtp() ? "present" : "absent");
        std::unique_ptr<Tokenizer> tokenizer;
        namespace fs = std::filesystem;
        if (fs::exists(fs::path(dir) / "tokenizer.json")) {
            tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(dir));
            std::fprintf(stderr, "megactx serve: tokenizer loaded (%zu tokens)\n", tokenizer->vocab_size());
        } else {
            std::fprintf(stderr, "megactx serve: no tokenizer.json: only token-id prompts on /v1/completions\n");
        }
        std::unique_ptr<Ops> own_ops;
        if (!group) own_ops = o.make_backend ? o.make_backend(model, ec) : std::make_unique<CpuOps>();
        Engine engine(model, group ? group->ops() : *own_ops, ec);
        std::fprintf(stderr,
                     "megactx serve: KV cache: %lld blocks of 64 tokens = %lld tokens; max context %lld tokens; up to "
                     "%lld sequences\n",
                     static_cast<long long>(engine.kv_capacity_tokens() / 64),
                     static_cast<long long>(engine.kv_capacity_tokens()), static_cast<long long>(engine.max_model_len()),
                     static_cast<long long>(o.max_num_seqs));
        ApiConfig ac;
        ac.served_model_name =
            o.served_model_name.empty() ? fs::path(dir).lexically_normal().filename().string() : o.served_model_name;
        if (ac.served_model_name.empty()) ac.served_model_name = "megactx";
        ac.api_key = o.api_key;
        OpenAiApi service(engine, tokenizer.get(), ac);
        engine.start();
        api.store(&service);
        std::fprintf(stderr, "megactx serve: ready in %.2f s, serving '%s'\n", elapsed(), ac.served_model_name.c_str());

        int sig = 0;
        sigwait(&sigs, &sig);
        std::fprintf(stderr, "megactx serve: %s received, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        service.close();   // new requests get 503
        engine.stop();     // in-flight requests end (aborted); their streams finish
        http.stop();
        http_thread.join();
        api.store(nullptr);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "megactx: error: %s\n", e.what());
        http.stop();
        http_thread.join();
        rc = 1;
    }
    return rc;
}

}  // namespace megactx
