// bench_cpu: CPU prefill and decode throughput of generated models (presets tiny and small) at several context
// lengths, and the split of decode time per op (issue 2). For each preset and context L:
//   prefill: L random tokens (fixed seed) through the model in chunks of --prefill-chunk → tokens/s = L / time
//   decode:  --warmup untimed steps, then --decode-steps timed steps of one token each at positions ≥ L, over
//            the real KV cache the prefill wrote → tokens/s and ms/token per op (ProfilingOps): indexer_topk is
//            the indexer scan, sparse_mla the sparse attention. Medians over steps are the headline numbers
//            (robust to a step stalled by other work on the machine); means are in the JSON too.
// Prints a table and writes JSON with device, date, commit, threads and every number.
#include <cstdlib>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "bench_util.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "engine/runner.h"
#include "model/gen_model.h"
#include "model/glm_dsa.h"
#include "profiling_ops.h"

#ifndef MEGACTX_SOURCE_DIR
#define MEGACTX_SOURCE_DIR "."
#endif
#ifndef MEGACTX_BENCH_MODEL_DIR
#define MEGACTX_BENCH_MODEL_DIR "bench_models"
#endif

namespace megactx {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// FNV-1a over the bytes of the logits: equal across runs iff the results are bit-identical.
std::string logits_hash(const std::vector<float>& v) {
    uint64_t h = 1469598103934665603ull;
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return fmt::format("{:016x}", h);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int32_t argmax(const std::vector<float>& v) {
    return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// ms per token per op, and the indexer / sparse attention / rest split of the op time.
json op_split(const ProfilingOps& prof, int64_t n_tokens) {
    json ops = json::object();
    double indexer = 0, sparse = 0, rest = 0;
    for (const auto& [name, st] : prof.stats()) {
        const double ms = 1e3 * st.seconds / static_cast<double>(n_tokens);
        ops[name] = {{"calls", st.calls}, {"ms_per_token", ms}};
        if (name == "indexer_topk") {
            indexer += ms;
        } else if (name == "sparse_mla") {
            sparse += ms;
        } else {
            rest += ms;
        }
    }
    return {{"indexer_ms_per_token", indexer}, {"sparse_mla_ms_per_token", sparse}, {"rest_ms_per_token", rest},
            {"ops", ops}};
}

struct Options {
    std::vector<std::string> presets{"tiny", "small"};
    std::vector<int64_t> contexts{1024, 4096, 16384, 65536};
    int threads = 2;
    int64_t decode_steps = 32;
    int64_t warmup = 2;
    int64_t prefill_chunk = 2048;
    std::string out;
    std::string model_dir = MEGACTX_BENCH_MODEL_DIR;
    uint64_t seed = 1234;
};

json bench_context(const GlmDsaModel& model, const Options& o, int64_t L, const std::vector<int32_t>& prompt) {
    CpuOps cpu;
    ProfilingOps prof(cpu);
    SequenceRunner runner(model, prof, L + o.warmup + o.decode_steps);
    const std::vector<int32_t> tokens(prompt.begin(), prompt.begin() + L);

    prof.reset();
    const auto t0 = Clock::now();
    std::vector<float> logits = runner.feed(tokens, o.prefill_chunk, false);
    const double prefill_s = seconds_since(t0);
    MEGACTX_CHECK(runner.n_cached() == L, "prefill wrote {} tokens, expected {}", runner.n_cached(), L);
    json prefill = op_split(prof, L);
    prefill["tokens"] = L;
    prefill["chunk"] = o.prefill_chunk;
    prefill["seconds"] = prefill_s;
    prefill["tok_s"] = static_cast<double>(L) / prefill_s;

    int32_t next = argmax(logits);
    for (int64_t s = 0; s < o.warmup; ++s) {
        logits = runner.feed({next}, 0, false);
        next = argmax(logits);
    }
    // Per step and op, so that medians can be reported: on a shared machine a few steps stall when a thread
    // of the parallel regions is descheduled, which the mean hides and the median does not.
    prof.reset();
    std::vector<double> step_ms;
    std::map<std::string, std::vector<double>> op_step_ms;
    const int64_t pos0 = runner.n_cached();
    const auto t1 = Clock::now();
    for (int64_t s = 0; s < o.decode_steps; ++s) {
        const auto before = prof.stats();
        const auto ts = Clock::now();
        logits = runner.feed({next}, 0, false);
        step_ms.push_back(1e3 * seconds_since(ts));
        std::map<std::string, double> prev;
        for (const auto& [name, st] : before) prev[name] = st.seconds;
        for (const auto& [name, st] : prof.stats()) op_step_ms[name].push_back(1e3 * (st.seconds - prev[name]));
        next = argmax(logits);
    }
    const double decode_s = seconds_since(t1);
    json decode = op_split(prof, o.decode_steps);
    // rest = the other ops' medians summed; a step's median minus all ops is time outside the op table
    // (host code, and stalls while the process was descheduled).
    double med_indexer = 0, med_sparse = 0, med_rest = 0;
    json op_median = json::object();
    for (auto& [name, v] : op_step_ms) {
        const double m = median(v);
        op_median[name] = m;
        if (name == "indexer_topk") {
            med_indexer = m;
        } else if (name == "sparse_mla") {
            med_sparse = m;
        } else {
            med_rest += m;
        }
    }
    const double med_step = median(step_ms);
    decode["median"] = {{"ms_per_token", med_step},
                        {"tok_s", 1e3 / med_step},
                        {"indexer_ms_per_token", med_indexer},
                        {"sparse_mla_ms_per_token", med_sparse},
                        {"rest_ms_per_token", med_rest},
                        {"outside_ops_ms_per_token", med_step - med_indexer - med_sparse - med_rest},
                        {"ops_ms_per_token", op_median}};
    std::vector<double> sorted = step_ms;
    std::sort(sorted.begin(), sorted.end());
    decode["steps"] = o.decode_steps;
    decode["first_position"] = pos0;
    decode["seconds"] = decode_s;
    decode["tok_s"] = static_cast<double>(o.decode_steps) / decode_s;
    decode["ms_per_token_min"] = sorted.front();
    decode["ms_per_token_max"] = sorted.back();
    decode["last_token"] = next;
    decode["last_logits_hash"] = logits_hash(logits);
    return {{"context", L}, {"prefill", prefill}, {"decode", decode}};
}

int run(const Options& o, const std::string& command) {
    omp_set_num_threads(o.threads);
    const int64_t max_l = *std::max_element(o.contexts.begin(), o.contexts.end());
    std::mt19937 rng(static_cast<uint32_t>(o.seed));

    json out = {{"bench", "bench_cpu"},
                {"device", bench::device_info()},
                {"date", bench::utc_now()},
                {"commit", bench::source_commit(MEGACTX_SOURCE_DIR)},
                {"dirty", bench::source_dirty(MEGACTX_SOURCE_DIR)},
                {"command", command},
                {"threads", o.threads},
                {"decode_steps", o.decode_steps},
                {"warmup_steps", o.warmup},
                {"prefill_chunk", o.prefill_chunk},
                {"seed", o.seed},
                {"loadavg_start", bench::run_command("cat /proc/loadavg")},
                {"results", json::array()}};

    for (const std::string& preset : o.presets) {
        const std::string dir = (std::filesystem::path(o.model_dir) / (preset + "-seed0")).string();
        if (!std::filesystem::exists(dir + "/config.json")) {
            std::cerr << "generating " << preset << " model into " << dir << "\n";
            GenModelOptions g;
            g.preset = preset;
            generate_model(dir, g);
        }
        const GlmDsaModel model(dir);
        const int64_t vocab = model.config().vocab_size;
        std::uniform_int_distribution<int32_t> dist(2, static_cast<int32_t>(vocab - 1));  // no EOS
        std::vector<int32_t> prompt(static_cast<size_t>(max_l));
        for (auto& t : prompt) t = dist(rng);
        for (int64_t L : o.contexts) {
            std::cerr << fmt::format("{} L={}: ", preset, L) << std::flush;
            json r = bench_context(model, o, L, prompt);
            r["preset"] = preset;
            std::cerr << fmt::format("prefill {:.1f} s ({:.1f} tok/s), decode {:.2f} tok/s (median step)\n",
                                     r["prefill"]["seconds"].get<double>(), r["prefill"]["tok_s"].get<double>(),
                                     r["decode"]["median"]["tok_s"].get<double>());
            out["results"].push_back(r);
            if (!o.out.empty()) std::ofstream(o.out) << out.dump(2) << "\n";  // partial results survive a crash
        }
    }

    // Sparse attention must stay flat with context: ratio of its decode ms/token at the largest context to 4K.
    json checks = json::object();
    for (const std::string& preset : o.presets) {
        double at4k = 0, at_max = 0;
        int64_t l_max = 0;
        for (const json& r : out["results"]) {
            if (r["preset"] != preset) continue;
            const int64_t L = r["context"];
            const double ms = r["decode"]["median"]["sparse_mla_ms_per_token"];
            if (L == 4096) at4k = ms;
            if (L >= 4096 && L > l_max) l_max = L, at_max = ms;
        }
        if (at4k > 0 && l_max > 4096) {
            checks[preset] = {{"sparse_mla_ratio", at_max / at4k}, {"from", 4096}, {"to", l_max},
                              {"within_1_5x", at_max / at4k <= 1.5}};
        }
    }
    out["checks"] = checks;
    out["loadavg_end"] = bench::run_command("cat /proc/loadavg");
    if (!o.out.empty()) std::ofstream(o.out) << out.dump(2) << "\n";

    std::cout << fmt::format("\ndecode: median over steps; {} threads, {} decode steps, prefill chunk {}, commit {}{}\n", o.threads,
                             o.decode_steps, o.prefill_chunk, out["commit"].get<std::string>(),
                             out["dirty"].get<bool>() ? " (dirty)" : "");
    std::cout << fmt::format("{:<6} {:>7} {:>12} {:>11} {:>12} {:>13} {:>12} {:>11}\n", "preset", "context",
                             "prefill t/s", "decode t/s", "decode ms/t", "indexer ms/t", "sparse ms/t", "rest ms/t");
    for (const json& r : out["results"]) {
        const json& d = r["decode"]["median"];
        std::cout << fmt::format("{:<6} {:>7} {:>12.1f} {:>11.2f} {:>12.2f} {:>13.3f} {:>12.3f} {:>11.3f}\n",
                                 r["preset"].get<std::string>(), r["context"].get<int64_t>(),
                                 r["prefill"]["tok_s"].get<double>(), d["tok_s"].get<double>(),
                                 d["ms_per_token"].get<double>(), d["indexer_ms_per_token"].get<double>(),
                                 d["sparse_mla_ms_per_token"].get<double>(), d["rest_ms_per_token"].get<double>());
    }
    for (const auto& [preset, c] : checks.items()) {
        std::cout << fmt::format("{}: sparse_mla {}→{}: {:.2f}x ({})\n", preset, c["from"].get<int64_t>(),
                                 c["to"].get<int64_t>(), c["sparse_mla_ratio"].get<double>(),
                                 c["within_1_5x"].get<bool>() ? "within 1.5x" : "NOT within 1.5x");
    }
    return 0;
}

}  // namespace
}  // namespace megactx

int main(int argc, char** argv) {
    using namespace megactx;
    Options o;
    std::string presets, contexts;
    CLI::App app{"CPU prefill/decode benchmark with the per-op split of decode time"};
    app.add_option("--preset", presets, "tiny, small or a comma list (default: tiny,small)");
    app.add_option("--contexts", contexts, "context lengths, comma list (default: 1024,4096,16384,65536)");
    app.add_option("--threads", o.threads, "OpenMP threads")->capture_default_str();
    app.add_option("--decode-steps", o.decode_steps, "timed decode steps per context")->capture_default_str();
    app.add_option("--warmup", o.warmup, "untimed decode steps before the timed ones")->capture_default_str();
    app.add_option("--prefill-chunk", o.prefill_chunk, "tokens per prefill forward")->capture_default_str();
    app.add_option("--model-dir", o.model_dir, "where generated models are cached")->capture_default_str();
    app.add_option("--seed", o.seed, "seed of the random prompt")->capture_default_str();
    app.add_option("--out", o.out, "write the results as JSON to this file");
    CLI11_PARSE(app, argc, argv);
    try {
        if (!presets.empty()) {
            o.presets.clear();
            std::stringstream ss(presets);
            std::string p;
            while (std::getline(ss, p, ',')) o.presets.push_back(p);
        }
        if (!contexts.empty()) o.contexts = bench::parse_positive_list(contexts, "--contexts");
        MEGACTX_CHECK(o.threads > 0 && o.decode_steps > 0 && o.warmup >= 0 && o.prefill_chunk > 0,
                      "--threads, --decode-steps and --prefill-chunk must be positive, --warmup not negative");
        std::string command = "bench_cpu";
        for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
        return run(o, command);
    } catch (const std::exception& e) {
        std::cerr << "bench_cpu: " << e.what() << "\n";
        return 1;
    }
}
