#include "server/serve.h"

#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
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

std::string served_name_for(const std::string& model_dir) {
    namespace fs = std::filesystem;
    fs::path p = fs::absolute(fs::path(model_dir)).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();  // "gm_small/" names gm_small, like "gm_small"
    const std::string name = p.filename().string();
    return name.empty() || name == "." || name == ".." ? "megactx" : name;
}

LoadedEngine load_engine(const ServeOptions& o, const std::function<void(const GlmDsaModel&)>& on_model_loaded) {
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

namespace {

// Waits for SIGINT/SIGTERM on its own thread from the start, so a signal while the model loads is not lost:
// then the process exits at once (nothing is serving yet). Once the server is ready the first signal starts
// the graceful shutdown and a second one exits immediately.
class SignalWatch {
  public:
    explicit SignalWatch(const sigset_t& sigs) : sigs_(sigs) {
        std::thread([this] { run(); }).detach();  // lives as long as the process; never joined
    }
    void set_ready() {
        std::lock_guard<std::mutex> lock(mu_);
        ready_ = true;
    }
    int wait() {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return sig_ != 0; });
        return sig_;
    }

  private:
    void run() {
        for (int n = 0;; ++n) {
            int sig = 0;
            if (sigwait(&sigs_, &sig) != 0) continue;
            const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
            std::unique_lock<std::mutex> lock(mu_);
            if (!ready_) {
                std::fprintf(stderr, "megactx serve: %s received while loading; exiting\n", name);
                std::fflush(stderr);
                std::_Exit(0);
            }
            if (n > 0) {
                std::fprintf(stderr, "megactx serve: second %s; exiting now\n", name);
                std::fflush(stderr);
                std::_Exit(1);
            }
            sig_ = sig;
            cv_.notify_all();
        }
    }

    sigset_t sigs_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool ready_ = false;
    int sig_ = 0;
};

// A vLLM-style progress line every `interval_s` while there is work: throughput since the last line, queue
// lengths, KV use and the prefix-cache hit rate.
class ThroughputLog {
  public:
    ThroughputLog(const Engine& engine, double interval_s) : engine_(engine), interval_s_(interval_s) {
        if (interval_s_ > 0) thread_ = std::thread([this] { run(); });
    }
    ~ThroughputLog() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    }

  private:
    void run() {
        EngineStats last = engine_.stats();
        auto t_last = std::chrono::steady_clock::now();
        std::unique_lock<std::mutex> lock(mu_);
        while (!cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [&] { return stop_; })) {
            const EngineStats now = engine_.stats();
            const auto t_now = std::chrono::steady_clock::now();
            const double dt = std::chrono::duration<double>(t_now - t_last).count();
            const int64_t d_prompt = now.prompt_tokens - last.prompt_tokens;
            const int64_t d_gen = now.generation_tokens - last.generation_tokens;
            if (d_prompt > 0 || d_gen > 0 || now.running > 0 || now.waiting > 0) {
                const int64_t d_query = now.prefix_query_tokens - last.prefix_query_tokens;
                const int64_t d_hit = now.prefix_hit_tokens - last.prefix_hit_tokens;
                std::fprintf(stderr,
                             "megactx serve: prompt %.1f tok/s, generation %.1f tok/s, running %lld, waiting %lld, "
                             "KV %.1f%% used, prefix-cache hits %.1f%%, preemptions %lld\n",
                             static_cast<double>(d_prompt) / dt, static_cast<double>(d_gen) / dt,
                             static_cast<long long>(now.running), static_cast<long long>(now.waiting),
                             now.kv_blocks_total ? 100.0 * static_cast<double>(now.kv_blocks_used) /
                                                       static_cast<double>(now.kv_blocks_total)
                                                 : 0.0,
                             d_query ? 100.0 * static_cast<double>(d_hit) / static_cast<double>(d_query) : 0.0,
                             static_cast<long long>(now.preemptions - last.preemptions));
            }
            last = now;
            t_last = t_now;
        }
    }

    const Engine& engine_;
    double interval_s_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace

int serve_main(const ServeOptions& o) {
    // Settings are checked before the port opens: a bad --kv-cache-memory is an error, not a server that
    // listens and then fails.
    engine_config(o);

    // Signals go to one waiting thread only: block them before any thread starts.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    signal(SIGPIPE, SIG_IGN);
    SignalWatch signals(sigs);

    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    std::atomic<OpenAiApi*> api{nullptr};
    HttpServerConfig hc;
    hc.host = o.host;
    hc.port = o.port;
    hc.max_body_bytes = static_cast<size_t>(o.max_body_bytes);
    HttpServer http(hc);
    http.set_error_body([](int status, const std::string& message) { return api_error_body(status, message); });
    const bool access_log = o.access_log;
    http.set_status_hook([&api](int status) {
        if (status >= 400 && status < 500) {
            if (OpenAiApi* a = api.load()) {
                a->metrics_registry().inc("megactx_http_client_errors_total", 1, fmt::format("status=\"{}\"", status));
            }
        }
    });
    http.set_access_log([access_log](int, const std::string& line) {
        if (access_log) std::fprintf(stderr, "megactx serve: %s\n", line.c_str());
    });
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
    route("POST", "/tokenize", &OpenAiApi::tokenize);
    route("POST", "/detokenize", &OpenAiApi::detokenize);
    std::string bind_error;
    MEGACTX_CHECK(http.bind(&bind_error), "{}", bind_error);
    std::thread http_thread([&] { http.serve(); });
    std::fprintf(stderr, "megactx serve: listening on http://%s:%d (loading; /health answers 503 until ready)\n",
                 o.host.c_str(), http.bound_port());

    try {
        const std::string dir = o.model_dir;
        std::fprintf(stderr, "megactx serve: loading model from %s\n", dir.c_str());
        LoadedEngine loaded = load_engine(o, [&](const GlmDsaModel& model) {
            const ModelConfig& c = model.config();
            std::fprintf(stderr,
                         "megactx serve: model loaded in %.2f s (%lld layers, %lld with a full indexer, MTP %s)\n",
                         elapsed(), static_cast<long long>(c.n_layers), static_cast<long long>(c.n_full_layers()),
                         model.has_mtp() ? "present" : "absent");
        });
        Engine& engine = *loaded.engine;
        std::unique_ptr<Tokenizer> tokenizer;
        namespace fs = std::filesystem;
        if (fs::exists(fs::path(dir) / "tokenizer.json")) {
            tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(dir));
            std::fprintf(stderr, "megactx serve: tokenizer loaded (%zu tokens)\n", tokenizer->vocab_size());
        } else {
            std::fprintf(stderr, "megactx serve: no tokenizer.json: only token-id prompts on /v1/completions\n");
        }
        std::fprintf(stderr, "megactx serve: %s; up to %lld sequences running\n", engine.kv_capacity_line().c_str(),
                     static_cast<long long>(o.max_num_seqs));
        ApiConfig ac;
        ac.served_model_name = o.served_model_name.empty() ? served_name_for(dir) : o.served_model_name;
        ac.api_key = o.api_key;
        const std::string& model_type = engine.model().config().model_type;
        const auto format = chat::chat_format_for_model_type(model_type);
        MEGACTX_CHECK(format.has_value(), "model_type '{}' has no chat format", model_type);
        ac.chat_format = *format;
        std::fprintf(stderr, "megactx serve: chat format %s (model_type %s)\n", chat::chat_format_name(ac.chat_format),
                     model_type.c_str());
        OpenAiApi service(engine, tokenizer.get(), ac);
        engine.start();
        api.store(&service);
        signals.set_ready();
        std::fprintf(stderr, "megactx serve: ready in %.2f s, serving '%s'\n", elapsed(), ac.served_model_name.c_str());
        {
            ThroughputLog progress(engine, o.log_interval_s);
            const int sig = signals.wait();
            std::fprintf(stderr, "megactx serve: %s received, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        }
        service.close();  // new requests get 503
        engine.stop();    // in-flight requests end (aborted); their streams finish
        http.stop();
        http_thread.join();
        api.store(nullptr);
    } catch (const std::exception& e) {
        // Nothing is serving yet: close the port and leave now, whatever the HTTP threads are doing (an idle
        // keep-alive connection would hold a graceful stop for seconds).
        std::fprintf(stderr, "megactx: error: %s\n", e.what());
        http.stop();
        std::fflush(stderr);
        std::_Exit(1);
    }
    return 0;
}

}  // namespace megactx
