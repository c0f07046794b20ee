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

std::string served_name_for(const std::string& model_dir) {
    namespace fs = std::filesystem;
    fs::path p = fs::absolute(fs::path(model_dir)).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();  // "gm_small/" names gm_small, like "gm_small"
    const std::string name = p.filename().string();
    return name.empty() || name == "." || name == ".." ? "megactx" : name;
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
