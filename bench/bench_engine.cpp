// bench_engine: the serving workload of bench/bench_serve.mjs run in-process through Engine::submit with token
// sinks — no HTTP, no JSON, no detokenization while running — so that the server's overhead per output token
// can be measured against it (issue 4).
//
// Same workload as bench_serve: the prompts file's texts tokenized as /v1/completions does
// (Tokenizer::encode(text, add_special_tokens = true)), max_tokens M, greedy, ignore_eos; at each concurrency
// level C a closed loop keeps C requests in flight (a finished request is replaced by the next, submitted from
// the main thread like a client would) until N = max(per_stream·C, min_requests) have finished; one untimed
// warm-up request first. The engine runs on its own thread (Engine::start), as in `megactx serve`.
//
// Timestamps are taken in the sink, on the engine thread, when each token is sampled. So that the latencies
// compare with what an HTTP client sees (a streamed chunk carries text only once a UTF-8 character is
// complete), TTFT and ITL are computed over the tokens that yield text when the request's ids are replayed
// through the same StreamDecoder the server uses (after the run, untimed; ids the tokenizer lacks give no text)
// — with --logprobs every token has a chunk — and the per-token ITL is reported too.
// The decoded text's FNV-1a hash is written per prompt so the server's outputs can be checked against it.
//
// The engine's own CPU cost: every op goes through ProfilingOps, so a level's step time splits into the ops (the
// backend's compute and transfers) and the host's work around them — scheduling, building the batch, sampling,
// verifying drafts, streaming — reported per step and per output token (`host_us_per_step`); with
// --speculative-tokens K the steps verify and draft (issue 32's CPU cost of a speculative step).
#include <omp.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench_util.h"
#include "profiling_ops.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "engine/constraint.h"
#include "engine/engine.h"
#include "grammar/frontends.h"
#include "model/glm_dsa.h"
#include "parallel/comm_thread.h"
#include "parallel/tp_group.h"
#include "engine/loader.h"
#include "tokenizer/tokenizer.h"

#ifndef MEGACTX_SOURCE_DIR
#define MEGACTX_SOURCE_DIR "."
#endif

namespace megactx {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

double process_cpu_seconds() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
    return s(ru.ru_utime) + s(ru.ru_stime);
}

// Same rules as bench_serve.mjs: linear interpolation between order statistics; FNV-1a 64 over bytes.
json percentile(std::vector<double> v, double q) {
    if (v.empty()) return nullptr;
    std::sort(v.begin(), v.end());
    const double x = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(x), hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (x - static_cast<double>(lo));
}
json mean(const std::vector<double>& v) {
    if (v.empty()) return nullptr;
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
}
std::string fnv1a64(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return fmt::format("{:016x}", h);
}

struct Options {
    std::string model_dir, prompts_file, out;
    std::vector<int64_t> levels{1, 8, 32, 64};
    int64_t max_tokens = 64, min_requests = 16, per_stream = 2;
    int64_t top_logprobs = -1;  // >= 0: what /v1/completions' `logprobs` asks of the engine
    int64_t max_num_seqs = 64, max_num_batched_tokens = 2048, max_model_len = 1024;
    std::string kv_cache_memory = "256MiB";
    std::string kv_offload_memory;  // the host KV tier (empty: none)
    bool prefix_caching = false;
    int64_t speculative_tokens = 0;
    int64_t tp = 1, pp = 1;  // ranks as threads of CpuOps: tensor-parallel size, pipeline stages
    // Structured outputs: request k follows `regex` when floor((k + 1) · f) > floor(k · f) (a share f of them, spread).
    std::string regex;
    double constrained_fraction = 0.0;
    std::shared_ptr<const OutputConstraint> constraint;  // compiled from `regex` once, shared as the server shares it
};

// One request: written by the sink on the engine thread until `done`, read by the main thread after.
struct Request {
    int prompt = 0;
    Clock::time_point t_submit, t_end;
    std::vector<Clock::time_point> times;
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::kNone;
    std::string error;
};

class Runner {
public:
    Runner(Engine& engine, const Options& o) : engine_(engine), o_(o) {}

    void submit(Request* r, const std::vector<int32_t>& prompt, bool constrained) {
        GenerationParams gp;
        if (constrained) gp.constraint = o_.constraint;
        gp.max_tokens = o_.max_tokens;
        gp.ignore_eos = !constrained;  // (a constrained output ends where its grammar allows: here, never)
        gp.top_logprobs = o_.top_logprobs;
        gp.sampling.temperature = 0.0f;
        r->times.reserve(static_cast<size_t>(o_.max_tokens));
        r->tokens.reserve(static_cast<size_t>(o_.max_tokens));
        r->t_submit = Clock::now();
        engine_.submit(prompt, gp, [this, r](const TokenEvent& ev) {
            if (ev.token >= 0) {
                r->times.push_back(Clock::now());
                r->tokens.push_back(ev.token);
                return true;
            }
            r->t_end = Clock::now();
            std::lock_guard<std::mutex> lock(mu_);
            r->finish = ev.finish;
            r->error = ev.error;
            finished_.push_back(r);
            cv_.notify_one();
            return true;
        });
    }

    // Blocks until at least one request finished; returns those that did.
    std::vector<Request*> wait_finished() {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !finished_.empty(); });
        std::vector<Request*> out;
        out.swap(finished_);
        return out;
    }

private:
    Engine& engine_;
    const Options& o_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Request*> finished_;
};

// Ids the tokenizer maps to text; the server's sink gives the others no text (and so no chunk), as here.
std::vector<bool> decodable_ids(const Tokenizer& tok, int64_t vocab_size) {
    std::vector<bool> ok(static_cast<size_t>(vocab_size), false);
    for (size_t id = 0; id < ok.size() && id < tok.vocab_size(); ++id) {
        try {
            tok.token_str(static_cast<int32_t>(id));
            ok[id] = true;
        } catch (const Error&) {
        }
    }
    return ok;
}

json run_level(Engine& engine, ProfilingOps& prof, const Options& o, const Tokenizer& tok,
               const std::vector<bool>& decodable, const std::vector<std::vector<int32_t>>& prompts, int64_t C) {
    const int64_t N = std::max(o.per_stream * C, o.min_requests);
    std::vector<std::unique_ptr<Request>> reqs;
    for (int64_t k = 0; k < N; ++k) {
        reqs.push_back(std::make_unique<Request>());
        reqs.back()->prompt = static_cast<int>(k % static_cast<int64_t>(prompts.size()));
    }
    Runner runner(engine, o);
    prof.reset();  // (the engine is idle between levels: see the end of the level)
    const EngineStats st0 = engine.stats();
    const double cpu0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    int64_t next = 0, done = 0;
    const auto constrained = [&](int64_t k) {
        const double f = o.constraint ? o.constrained_fraction : 0.0;
        return std::floor(static_cast<double>(k + 1) * f) > std::floor(static_cast<double>(k) * f);
    };
    for (; next < std::min(C, N); ++next) runner.submit(reqs[next].get(), prompts[reqs[next]->prompt], constrained(next));
    int64_t running_max = 0, running_sum = 0, n_samples = 0;  // running sequences, sampled at each completion
    while (done < N) {
        const std::vector<Request*> finished = runner.wait_finished();
        const EngineStats st = engine.stats();
        running_max = std::max(running_max, st.running);
        running_sum += st.running;
        ++n_samples;
        for (Request* r : finished) {
            ++done;
            MEGACTX_CHECK(r->finish == FinishReason::kLength, "request finished with '{}' {}",
                          finish_reason_name(r->finish), r->error);
            if (next < N) {
                runner.submit(reqs[next].get(), prompts[reqs[next]->prompt], constrained(next));
                ++next;
            }
        }
    }
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpu = process_cpu_seconds() - cpu0;
    // The last request finishes inside its step; the step's time joins the stats after it returns, with the
    // snapshot that shows nothing running. Only then is the level's step time complete (and the engine idle, so
    // that the profile can be read and the next level's reset).
    EngineStats st1 = engine.stats();
    while (st1.running > 0 || st1.waiting > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        st1 = engine.stats();
    }
    const double op_s = prof.total_seconds(), step_s = st1.step_s - st0.step_s;
    const int64_t steps = st1.steps - st0.steps;
    SpecStats spec = st1.spec;
    spec.verifications -= st0.spec.verifications;
    spec.drafted -= st0.spec.drafted;
    spec.accepted -= st0.spec.accepted;

    std::vector<double> ttft, itl, ttft_tok, itl_tok, e2e;
    int64_t out_tokens = 0, prompt_tokens = 0, chunks = 0;
    json hashes = json::object();
    for (const auto& rp : reqs) {
        const Request& r = *rp;
        MEGACTX_CHECK(static_cast<int64_t>(r.tokens.size()) == o.max_tokens, "expected {} tokens, got {}",
                      o.max_tokens, r.tokens.size());
        out_tokens += static_cast<int64_t>(r.tokens.size());
        prompt_tokens += static_cast<int64_t>(prompts[r.prompt].size());
        e2e.push_back(ms_between(r.t_submit, r.t_end));
        ttft_tok.push_back(ms_between(r.t_submit, r.times.front()));
        for (size_t i = 1; i < r.times.size(); ++i) itl_tok.push_back(ms_between(r.times[i - 1], r.times[i]));
        // Replay through the server's StreamDecoder: which tokens produce a chunk with text.
        StreamDecoder dec(tok, true);
        std::string text;
        bool first = true;
        Clock::time_point prev;
        for (size_t i = 0; i < r.tokens.size(); ++i) {
            const std::string piece = decodable[static_cast<size_t>(r.tokens[i])] ? dec.push(r.tokens[i]) : "";
            text += piece;
            if (piece.empty() && o.top_logprobs < 0) continue;  // with logprobs every token has its chunk
            ++chunks;
            if (first) {
                ttft.push_back(ms_between(r.t_submit, r.times[i]));
                first = false;
            } else {
                itl.push_back(ms_between(prev, r.times[i]));
            }
            prev = r.times[i];
        }
        text += dec.flush();
        hashes[std::to_string(r.prompt)] = fnv1a64(text);
    }
    json l = {{"concurrency", C},
              {"requests", N},
              {"wall_s", wall},
              {"output_tokens", out_tokens},
              {"prompt_tokens", prompt_tokens},
              {"output_tok_s", static_cast<double>(out_tokens) / wall},
              {"req_s", static_cast<double>(N) / wall},
              {"running_at_completions",
               {{"max", running_max}, {"mean", static_cast<double>(running_sum) / std::max<int64_t>(n_samples, 1)}}},
              {"ttft_ms", {{"p50", percentile(ttft, 0.5)}, {"p99", percentile(ttft, 0.99)}, {"mean", mean(ttft)}}},
              {"itl_ms",
               {{"p50", percentile(itl, 0.5)}, {"p99", percentile(itl, 0.99)}, {"mean", mean(itl)}, {"n", itl.size()}}},
              {"ttft_first_token_ms",
               {{"p50", percentile(ttft_tok, 0.5)}, {"p99", percentile(ttft_tok, 0.99)}, {"mean", mean(ttft_tok)}}},
              {"itl_per_token_ms",
               {{"p50", percentile(itl_tok, 0.5)},
                {"p99", percentile(itl_tok, 0.99)},
                {"mean", mean(itl_tok)},
                {"n", itl_tok.size()}}},
              {"e2e_ms", {{"p50", percentile(e2e, 0.5)}, {"p99", percentile(e2e, 0.99)}, {"mean", mean(e2e)}}},
              {"text_chunks", chunks},
              {"tokens_per_text_chunk", static_cast<double>(out_tokens) / static_cast<double>(chunks)},
              {"step_s", step_s},
              {"steps", steps},
              {"op_s", op_s},
              {"host_s", step_s - op_s},
              {"host_us_per_step", 1e6 * (step_s - op_s) / static_cast<double>(std::max<int64_t>(steps, 1))},
              {"host_us_per_token", 1e6 * (step_s - op_s) / static_cast<double>(out_tokens)},
              {"speculative",
               o.speculative_tokens == 0
                   ? json(nullptr)
                   : json{{"verifications", spec.verifications},
                          {"drafted", spec.drafted},
                          {"accepted", spec.accepted},
                          {"mean_acceptance_length", spec.mean_acceptance_length()}}},
              {"kv_fetch_stall_s", st1.kv_fetch_stall_s - st0.kv_fetch_stall_s},
              {"cpu_s", cpu},
              {"cpu_ms_per_token", 1e3 * cpu / static_cast<double>(out_tokens)},
              {"output_hashes", hashes},
              {"loadavg", bench::run_command("cat /proc/loadavg")}};
    return l;
}

int run(const Options& o, const std::string& command) {
    std::ifstream pin(o.prompts_file);
    MEGACTX_CHECK(pin.good(), "cannot read the prompts file {}", o.prompts_file);
    const json pj = json::parse(pin);
    std::unique_ptr<GlmDsaModel> single;
    std::unique_ptr<TensorParallelGroup> group;
    if (o.tp * o.pp > 1) {
        ParallelOptions po;
        po.n_gpus = o.tp;
        po.pp = o.pp;
        std::vector<std::unique_ptr<Ops>> rank_ops;
        for (int64_t r = 0; r < o.tp * o.pp; ++r) rank_ops.push_back(std::make_unique<CpuOps>());
        group = std::make_unique<TensorParallelGroup>(o.model_dir, po, std::move(rank_ops), make_thread_comms);
    } else {
        single = std::make_unique<GlmDsaModel>(o.model_dir);
    }
    const GlmDsaModel& model = group ? group->model() : *single;
    const Tokenizer tok = Tokenizer::load(o.model_dir);
    std::vector<std::vector<int32_t>> prompts;
    int64_t min_len = INT64_MAX, max_len = 0, sum_len = 0;
    for (const auto& t : pj.at("prompts")) {
        prompts.push_back(tok.encode(t.get<std::string>(), true));  // as /v1/completions encodes a text prompt
        const auto n = static_cast<int64_t>(prompts.back().size());
        min_len = std::min(min_len, n), max_len = std::max(max_len, n), sum_len += n;
    }
    MEGACTX_CHECK(!prompts.empty(), "{} has no prompts", o.prompts_file);

    Options opt = o;
    if (!o.regex.empty()) {  // compiled and warmed as `megactx serve` does it for a request's regex
        auto c = std::make_shared<OutputConstraint>();
        c->grammar = std::make_shared<const grammar::Grammar>(grammar::compile_regex(o.regex));
        c->vocab = make_token_vocab(tok, tok.eos_id() >= 0 ? std::vector<int32_t>{tok.eos_id()} : std::vector<int32_t>{});
        c->masks = std::make_shared<grammar::MaskCache>();
        opt.constraint = c;
    }
    CpuOps cpu;
    ProfilingOps ops(group ? group->ops() : cpu);
    EngineOptions so;  // the same engine settings `megactx serve` would use
    so.max_model_len = o.max_model_len;
    so.max_num_seqs = o.max_num_seqs;
    so.max_num_batched_tokens = o.max_num_batched_tokens;
    so.prefix_caching = o.prefix_caching;
    so.kv_cache_memory = o.kv_cache_memory;
    so.kv_offload_memory = o.kv_offload_memory;
    so.speculative_tokens = o.speculative_tokens;
    Engine engine(model, ops, engine_config(so));
    const std::vector<bool> decodable = decodable_ids(tok, model.config().vocab_size);
    int64_t n_decodable = 0;
    for (bool b : decodable) n_decodable += b;
    int omp_threads_engine_thread = 0;
    std::thread([&] { omp_threads_engine_thread = omp_get_max_threads(); }).join();

    const char* env_threads = std::getenv("OMP_NUM_THREADS");
    json out = {{"bench", "bench_engine"},
                {"device", bench::device_info()},
                {"date", bench::utc_now()},
                {"commit", bench::source_commit(MEGACTX_SOURCE_DIR)},
                {"dirty", bench::source_dirty(MEGACTX_SOURCE_DIR)},
                {"command", command},
                {"vocab_size", model.config().vocab_size},
                {"tokenizer_decodable_ids", n_decodable},
                {"omp_num_threads", env_threads ? json(env_threads) : json(nullptr)},
                {"omp_wait_policy", std::getenv("OMP_WAIT_POLICY") ? json(std::getenv("OMP_WAIT_POLICY")) : json(nullptr)},
                {"omp_max_threads_on_a_new_thread", omp_threads_engine_thread},
                {"engine",
                 {{"max_num_seqs", o.max_num_seqs},
                  {"max_num_batched_tokens", o.max_num_batched_tokens},
                  {"max_model_len", engine.max_model_len()},
                  {"kv_cache_memory", o.kv_cache_memory},
                  {"kv_offload_memory", o.kv_offload_memory.empty() ? json(nullptr) : json(o.kv_offload_memory)},
                  {"kv_capacity_tokens", engine.kv_capacity_tokens()},
                  {"prefix_caching", o.prefix_caching},
                  {"speculative_tokens", o.speculative_tokens},
                  {"tensor_parallel_size", o.tp},
                  {"pipeline_parallel_size", o.pp}}},
                {"workload",
                 {{"prompts_file", o.prompts_file},
                  {"n_prompts", prompts.size()},
                  {"prompt_tokens_min", min_len},
                  {"prompt_tokens_max", max_len},
                  {"prompt_tokens_mean", static_cast<double>(sum_len) / static_cast<double>(prompts.size())},
                  {"max_tokens", o.max_tokens},
                  {"top_logprobs", o.top_logprobs},
                  {"temperature", 0},
                  {"ignore_eos", true},
                  {"min_requests", o.min_requests},
                  {"per_stream", o.per_stream},
                  {"regex", o.regex.empty() ? json(nullptr) : json(o.regex)},
                  {"constrained_fraction", o.regex.empty() ? 0.0 : o.constrained_fraction}}},
                {"loadavg_start", bench::run_command("cat /proc/loadavg")},
                {"levels", json::array()}};

    engine.start();
    {  // warm-up, untimed
        Options one = opt;
        one.min_requests = 1;
        one.per_stream = 1;
        run_level(engine, ops, one, tok, decodable, prompts, 1);
    }
    for (int64_t C : o.levels) {
        std::cerr << fmt::format("bench_engine: C={} ... ", C) << std::flush;
        json l = run_level(engine, ops, opt, tok, decodable, prompts, C);
        std::cerr << fmt::format("{:.1f} tok/s, {:.1f} s\n", l["output_tok_s"].get<double>(), l["wall_s"].get<double>());
        out["levels"].push_back(l);
        if (!o.out.empty()) std::ofstream(o.out) << out.dump(2) << "\n";
    }
    engine.stop();
    out["loadavg_end"] = bench::run_command("cat /proc/loadavg");
    if (!o.out.empty()) std::ofstream(o.out) << out.dump(2) << "\n";

    auto num = [](const json& j, int prec) { return j.is_null() ? std::string("—") : fmt::format("{:.{}f}", j.get<double>(), prec); };
    std::cout << fmt::format("\nengine direct — commit {}{}; prompts {}–{} tokens, max_tokens {}\n",
                             out["commit"].get<std::string>(), out["dirty"].get<bool>() ? " (dirty)" : "", min_len,
                             max_len, o.max_tokens);
    std::cout << "    C  requests   tok/s   req/s  TTFT p50 ms  TTFT p99 ms  ITL p50 ms  ITL p99 ms  ITL mean ms"
                 "  steps  host us/step  host us/token\n";
    for (const json& l : out["levels"]) {
        std::cout << fmt::format("{:>5} {:>9} {:>7} {:>7} {:>12} {:>12} {:>11} {:>11} {:>12} {:>6} {:>13} {:>14}\n",
                                 l["concurrency"].get<int64_t>(), l["requests"].get<int64_t>(), num(l["output_tok_s"], 1),
                                 num(l["req_s"], 2), num(l["ttft_ms"]["p50"], 1), num(l["ttft_ms"]["p99"], 1),
                                 num(l["itl_ms"]["p50"], 2), num(l["itl_ms"]["p99"], 2), num(l["itl_ms"]["mean"], 2),
                                 l["steps"].get<int64_t>(), num(l["host_us_per_step"], 1), num(l["host_us_per_token"], 2));
    }
    return 0;
}

}  // namespace
}  // namespace megactx

int main(int argc, char** argv) {
    using namespace megactx;
    Options o;
    std::string levels, prefix = "off";
    CLI::App app{"The serving workload of bench_serve.mjs, in-process through Engine::submit (no HTTP)"};
    app.add_option("--model", o.model_dir, "model directory with tokenizer.json")->required();
    app.add_option("--prompts", o.prompts_file, "prompts JSON (bench_serve.mjs --write-prompts)")->required();
    app.add_option("--levels", levels, "concurrency levels (default 1,8,32,64)");
    app.add_option("--max-tokens", o.max_tokens)->capture_default_str();
    app.add_option("--min-requests", o.min_requests)->capture_default_str();
    app.add_option("--per-stream", o.per_stream, "requests per level = max(per_stream * C, min_requests)")
        ->capture_default_str();
    app.add_option("--logprobs", o.top_logprobs, "request logprobs with N alternatives, as /v1/completions' logprobs")
        ->check(CLI::Range(0, 20));
    app.add_option("--max-num-seqs", o.max_num_seqs)->capture_default_str();
    app.add_option("--max-num-batched-tokens", o.max_num_batched_tokens)->capture_default_str();
    app.add_option("--max-model-len", o.max_model_len)->capture_default_str();
    app.add_option("--kv-cache-memory", o.kv_cache_memory, "KV cache on the device (the device tier with a host tier)")
        ->capture_default_str();
    app.add_option("--kv-offload-memory", o.kv_offload_memory,
                   "host KV tier, e.g. 64MiB (latent rows beyond the device's; default: none)");
    app.add_option("--prefix-caching", prefix, "on | off")->capture_default_str();
    app.add_option("--speculative-tokens", o.speculative_tokens, "MTP draft tokens per step (0: off)")
        ->check(CLI::Range(0, 7))
        ->capture_default_str();
    app.add_option("--regex", o.regex, "requests follow this regular expression (structured outputs; one that cannot end before --max-tokens, "
                   "since every request must run to it), see --constrained-fraction");
    app.add_option("--constrained-fraction", o.constrained_fraction, "share of the requests that follow --regex")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    app.add_option("--tp", o.tp, "tensor-parallel ranks, threads of this process")->check(CLI::Range(1, 64));
    app.add_option("--pp", o.pp, "pipeline stages of --tp ranks each, threads of this process")
        ->check(CLI::Range(1, 64));
    app.add_option("--out", o.out, "write the results as JSON to this file");
    CLI11_PARSE(app, argc, argv);
    try {
        if (!levels.empty()) o.levels = bench::parse_positive_list(levels, "--levels");
        MEGACTX_CHECK(prefix == "on" || prefix == "off", "--prefix-caching must be on or off");
        o.prefix_caching = prefix == "on";
        MEGACTX_CHECK(o.max_tokens > 0 && o.min_requests > 0 && o.per_stream > 0, "counts must be positive");
        std::string command = "bench_engine";
        for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
        return run(o, command);
    } catch (const std::exception& e) {
        std::cerr << "bench_engine: " << e.what() << "\n";
        return 1;
    }
}
