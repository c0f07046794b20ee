// bench_spec: what MTP speculation buys through the engine at a set acceptance (issue 49), independent of how well
// the model's MTP layer drafts. Each K runs with EngineConfig::forced_acceptance_length = A: the draft steps and the
// (K + 1)-row verification run at their real cost, and the verifier accepts each draft with the probability that
// makes the mean acceptance length A (speculative.h, ForcedAcceptance).
//
// The model: a checkpoint (--model DIR), or synthetic weights of a config (--synthetic config.json; weights made in
// memory, model/synthetic_weights.h) — with --rank-of N [--expert-parallel] only rank 0's shard of an N-rank
// tensor (and expert) parallel deployment, run alone with collectives that move nothing (parallel/comm_solo.h):
// one GPU's work of GLM-5.2 on 8 GPUs (8 of the 64 heads, 32 of the 256 experts, each token's 8 routed choices
// landing on this rank with probability 1/8 each, the indexer replicated, 1/8 of the LM head).
//
// For each context L and batch B: a prompt of L random tokens is prefilled into the prefix cache (one request of
// one token), then B requests of that prompt (each with its own last token) decode --tokens tokens each, greedy,
// ignore_eos, first plain (K = 0), then at each K:A of --spec. Measured over the steps in which all B requests
// decode (from the last one's first token to the first one's end): output tokens/s, the acceptance length reached,
// and per step the target forward's time and the draft steps' time (EngineStats::target_s, draft_s; each ends with
// its results on the host). From them, per K: t_plain (the plain run's step), t_verify, t_draft (one draft step),
// the ceiling A / (t_verify / t_plain + K · t_draft / t_plain) with A the tokens per step in the window against the
// plain run's, the speed-up over plain and its share of the ceiling (below 1: the host's work between the forwards).
//
//   bench_spec (--model DIR | --synthetic CONFIG [--layers N] [--dtype fp8|bf16] [--rank-of N [--expert-parallel]])
//              [--device cpu|cuda] [--kv fp8|bf16|f32] [--contexts 8192,131072] [--batch 1,8,32]
//              [--spec 3:3.0,7:5.47] [--tokens 96] [--seed S] [--op-split] [--json PATH]
// --op-split runs each case's window again eagerly with every op synchronised and prints each op's ms per step.
// Before the first case, one untimed plain and one speculative run warm the process up (first-use weight
// conversions); each run's window starts a few steps after its last request's first token (graph recording).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "bench_util.h"
#include "profiling_ops.h"
#include "engine/engine.h"
#include "io/config.h"
#include "model/glm_dsa.h"
#include "model/synthetic_weights.h"
#include "parallel/comm_solo.h"
#include "parallel/shard_plan.h"
#ifdef MEGACTX_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#endif

using namespace megactx;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct SpecPoint {
    int64_t k = 0;
    double length = 1.0;  // the set acceptance length A (1 for plain decoding)
};

struct Options {
    std::string device = "cuda", kv = "fp8";
    std::vector<int64_t> contexts, batches;
    std::vector<SpecPoint> spec;
    int64_t tokens = 96;
    uint64_t seed = 0;
    bool op_split = false;
};

// "3:3.0,7:5.47" → {K, A} pairs.
std::vector<SpecPoint> parse_spec(const std::string& s) {
    std::vector<SpecPoint> out;
    size_t pos = 0;
    while (pos <= s.size()) {
        const size_t comma = std::min(s.find(',', pos), s.size());
        const std::string item = s.substr(pos, comma - pos);
        const size_t colon = item.find(':');
        MEGACTX_CHECK(colon != std::string::npos, "--spec: expected K:A pairs such as 3:3.0,7:5.47, got '{}'", item);
        SpecPoint p;
        try {
            p.k = std::stoll(item.substr(0, colon));
            p.length = std::stod(item.substr(colon + 1));
        } catch (const std::exception&) {
            MEGACTX_FAIL("--spec: '{}' is not K:A (an integer and a number)", item);
        }
        MEGACTX_CHECK(p.k >= 1 && p.k <= 7 && p.length >= 1.0 && p.length <= static_cast<double>(p.k + 1),
                      "--spec: {} needs 1 <= K <= 7 and 1 <= A <= K + 1", item);
        out.push_back(p);
        pos = comma + 1;
    }
    return out;
}

struct RunResult {
    double tok_s = 0, step_ms = 0, target_ms = 0, draft_ms = 0, acceptance = 1.0;
    int64_t steps = 0, tokens = 0, graph_replays = 0;
    std::vector<std::pair<std::string, ProfilingOps::Stat>> ops;  // with a ProfilingOps: the window's ops
};

constexpr int kSettleSteps = 3;

// One engine: the prompt into the prefix cache, then B requests decoding together; the window is the steps in
// which all B decode.
RunResult run(const GlmDsaModel& model, Ops& ops, const Options& o, int64_t L, int64_t B, SpecPoint sp,
              KvFormat kv_format, ProfilingOps* prof = nullptr) {
    const ModelConfig& c = model.config();
    EngineConfig ec;
    ec.kv_format = kv_format;
    ec.max_model_len = L + o.tokens + 8;
    // the shared prompt once, each request's own last block and its output, and room for a step's drafts
    ec.n_kv_blocks = (L + 63) / 64 + B * ((o.tokens + 8 + 63) / 64 + 2) + 8;
    ec.scheduler.max_num_seqs = std::max<int64_t>(B, 1);
    ec.scheduler.max_num_batched_tokens = 8192;
    ec.speculative_tokens = sp.k;
    ec.forced_acceptance_length = sp.k > 0 ? sp.length : 0.0;
    ec.forced_acceptance_seed = o.seed + 17;
    Engine e(model, prof ? static_cast<Ops&>(*prof) : ops, ec);

    uint64_t s = o.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(L);
    std::vector<int32_t> prompt(static_cast<size_t>(L));
    for (int32_t& t : prompt) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(c.vocab_size - 16));
    }
    GenerationParams warm;
    warm.max_tokens = 1;
    warm.ignore_eos = true;
    e.submit(prompt, warm, [](const TokenEvent&) { return true; });
    while (e.step()) {
    }

    std::vector<int64_t> got(static_cast<size_t>(B), 0);
    int64_t emitted = 0;
    for (int64_t b = 0; b < B; ++b) {
        std::vector<int32_t> p = prompt;
        p.back() = static_cast<int32_t>((static_cast<int64_t>(p.back()) + 1 + b) % (c.vocab_size - 16));
        GenerationParams g;
        g.max_tokens = o.tokens;
        g.ignore_eos = true;
        e.submit(std::move(p), g, [&got, &emitted, b](const TokenEvent& ev) {
            if (ev.token >= 0) {
                ++got[static_cast<size_t>(b)];
                ++emitted;
            }
            return true;
        });
    }
    const auto all_started = [&] { return std::all_of(got.begin(), got.end(), [](int64_t n) { return n > 0; }); };
    const auto one_done = [&] {
        return std::any_of(got.begin(), got.end(), [&](int64_t n) { return n >= o.tokens; });
    };
    while (!all_started() && e.step()) {
    }
    // A few steps more before the window: each new step shape is recorded as a CUDA graph on its second step.
    for (int i = 0; i < kSettleSteps && !one_done(); ++i) e.step();
    if (prof) prof->reset();
    const EngineStats s0 = e.stats();
    const int64_t emitted0 = emitted;
    const auto t0 = Clock::now();
    while (!one_done() && e.step()) {
    }
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const EngineStats s1 = e.stats();
    while (e.step()) {
    }
    RunResult r;
    r.steps = s1.steps - s0.steps;
    r.tokens = emitted - emitted0;
    MEGACTX_CHECK(r.steps > 0, "bench_spec: no decode step in the window (--tokens {} too small?)", o.tokens);
    r.tok_s = static_cast<double>(r.tokens) / wall;
    r.step_ms = 1e3 * wall / static_cast<double>(r.steps);
    r.target_ms = 1e3 * (s1.target_s - s0.target_s) / static_cast<double>(r.steps);
    r.draft_ms = 1e3 * (s1.draft_s - s0.draft_s) / static_cast<double>(r.steps);
    r.graph_replays = s1.graph_replays - s0.graph_replays;
    if (prof) r.ops = prof->stats();
    const int64_t verifs = s1.spec.verifications - s0.spec.verifications;
    if (verifs > 0)
        r.acceptance = 1.0 + static_cast<double>(s1.spec.accepted - s0.spec.accepted) / static_cast<double>(verifs);
    return r;
}

// The window's steps again, eagerly, every op synchronised: ms per step of each op, largest first.
std::string op_split(const GlmDsaModel& model, Ops& ops, const Options& o, int64_t L, int64_t B, SpecPoint sp,
                     KvFormat kv_format, json* out) {
#ifdef MEGACTX_WITH_CUDA
    if (o.device == "cuda") cuda_sync_each_op(ops, true);
#endif
    ProfilingOps prof(ops);
    Options short_run = o;
    short_run.tokens = std::min<int64_t>(o.tokens, 64);
    const RunResult r = run(model, ops, short_run, L, B, sp, kv_format, &prof);
#ifdef MEGACTX_WITH_CUDA
    if (o.device == "cuda") cuda_sync_each_op(ops, false);
#endif
    std::vector<std::pair<std::string, ProfilingOps::Stat>> v = r.ops;
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    std::string line = fmt::format("eager step {:.3f} ms, ops:", r.step_ms);
    for (const auto& [name, st] : v) {
        const double ms = 1e3 * st.seconds / static_cast<double>(r.steps);
        line += fmt::format(" {} {:.3f}", name, ms);
        (*out)[name] = {{"ms_per_step", ms}, {"calls_per_step", static_cast<double>(st.calls) / r.steps}};
    }
    (*out)["eager_step_ms"] = r.step_ms;
    return line;
}

std::unique_ptr<Ops> make_ops(const std::string& device) {
    if (device == "cpu") return std::make_unique<CpuOps>();
    MEGACTX_CHECK(device == "cuda", "--device must be cpu or cuda, got '{}'", device);
#ifdef MEGACTX_WITH_CUDA
    MEGACTX_CHECK(cuda::device_count() > 0, "--device cuda: no CUDA device is available");
    CudaOptions co;
    co.memory_budget_bytes = static_cast<int64_t>(static_cast<double>(cuda::device_info(0).free_bytes) * 0.95);
    return make_cuda_ops(co);
#else
    MEGACTX_FAIL("--device cuda: bench_spec was built without CUDA");
#endif
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_spec: MTP speculative decoding through the engine at a set acceptance length"};
    Options o;
    std::string model_dir, synthetic, dtype = "fp8", contexts = "8192", batches = "1", spec = "3:3.0,7:5.47",
                                       json_path;
    int64_t layers = 0, rank_of = 0;
    bool expert_parallel = false;
    app.add_option("--model", model_dir, "model directory (a checkpoint)");
    app.add_option("--synthetic", synthetic, "config.json whose model is made with synthetic weights in memory");
    app.add_option("--layers", layers, "synthetic: decoder layers (first N of the config's)")->check(CLI::Range(1, 1000));
    app.add_option("--dtype", dtype, "synthetic: linear weights fp8 | bf16");
    app.add_option("--rank-of", rank_of, "synthetic: only rank 0's shard of this many tensor-parallel ranks")
        ->check(CLI::Range(2, 1024));
    app.add_flag("--expert-parallel", expert_parallel, "with --rank-of: whole experts per rank");
    app.add_option("--device", o.device, "cpu | cuda");
    app.add_option("--kv", o.kv, "KV format: fp8 | bf16 | f32");
    app.add_option("--contexts", contexts, "context lengths L, a list");
    app.add_option("--batch", batches, "requests decoding together, a list");
    app.add_option("--spec", spec, "K:A pairs (draft tokens : set acceptance length)");
    app.add_option("--tokens", o.tokens, "output tokens per request")->check(CLI::Range(8, 100000));
    app.add_option("--seed", o.seed);
    app.add_flag("--op-split", o.op_split, "also time each op of the window's steps (eager, every op synchronised)");
    app.add_option("--json", json_path, "write the results as JSON");
    CLI11_PARSE(app, argc, argv);
    try {
        MEGACTX_CHECK(model_dir.empty() != synthetic.empty(), "give exactly one of --model and --synthetic");
        MEGACTX_CHECK(synthetic.size() > 0 || (layers == 0 && rank_of == 0),
                      "--layers and --rank-of apply to --synthetic models");
        o.contexts = bench::parse_positive_list(contexts, "--contexts");
        o.batches = bench::parse_positive_list(batches, "--batch");
        o.spec = parse_spec(spec);
        const KvFormat kv_format = o.kv == "fp8" ? KvFormat::FP8 : o.kv == "bf16" ? KvFormat::BF16 : KvFormat::F32;
        MEGACTX_CHECK(o.kv == "fp8" || o.kv == "bf16" || o.kv == "f32", "--kv must be fp8, bf16 or f32");
        std::unique_ptr<Ops> ops = make_ops(o.device);

        std::unique_ptr<GlmDsaModel> model;
        std::unique_ptr<SoloRankComm> comm;
        json model_info;
        const auto t_load = Clock::now();
        if (!model_dir.empty()) {
            model = std::make_unique<GlmDsaModel>(model_dir);
            model_info = {{"model", model_dir}};
        } else {
            std::ifstream in(synthetic);
            MEGACTX_CHECK(in.good(), "{}: cannot read", synthetic);
            json cj = json::parse(in);
            if (layers > 0) {
                cj["num_hidden_layers"] = layers;
                for (const char* key : {"mlp_layer_types", "indexer_types"}) {
                    if (cj.contains(key) && cj[key].is_array() && static_cast<int64_t>(cj[key].size()) > layers)
                        cj[key].erase(cj[key].begin() + layers, cj[key].end());
                }
            }
            const ModelConfig c = parse_config_json(cj.dump(), synthetic);
            MEGACTX_CHECK(dtype == "fp8" || dtype == "bf16", "--dtype must be fp8 or bf16");
            auto store = synthetic_store(c, dtype == "fp8" ? DType::F8_E4M3 : DType::BF16, o.seed);
            if (rank_of > 0) {
                ParallelOptions po;
                po.n_gpus = rank_of;
                po.expert_parallel = expert_parallel;
                const ShardPlan plan = make_shard_plan(c, po);
                comm = std::make_unique<SoloRankComm>(*ops, 0, static_cast<int>(rank_of));
                model = std::make_unique<GlmDsaModel>(c, std::move(store), &plan, 0, comm.get());
            } else {
                model = std::make_unique<GlmDsaModel>(c, std::move(store));
            }
            model_info = {{"synthetic", synthetic}, {"layers", c.n_layers}, {"dtype", dtype},
                          {"rank_of", rank_of}, {"expert_parallel", expert_parallel},
                          {"heads", c.n_head}, {"experts", c.n_routed_experts},
                          {"experts_per_tok", c.n_experts_per_tok}};
        }
        MEGACTX_CHECK(model->has_mtp(), "bench_spec: the model has no MTP layer");
        std::printf("bench_spec: model ready in %.1f s\n",
                    std::chrono::duration<double>(Clock::now() - t_load).count());

        // Warm-up, untimed: the first steps of a process convert weights for the kernels they pick (per row count).
        {
            Options w = o;
            w.tokens = 64;
            const int64_t max_b = *std::max_element(o.batches.begin(), o.batches.end());
            SpecPoint max_k{0, 1.0};
            for (const SpecPoint& sp : o.spec) max_k = sp.k > max_k.k ? sp : max_k;
            run(*model, *ops, w, std::min<int64_t>(o.contexts[0], 4096), max_b, {0, 1.0}, kv_format);
            run(*model, *ops, w, std::min<int64_t>(o.contexts[0], 4096), max_b, max_k, kv_format);
        }
        json rows = json::array();
        for (int64_t L : o.contexts) {
            for (int64_t B : o.batches) {
                const RunResult plain = run(*model, *ops, o, L, B, {0, 1.0}, kv_format);
                std::printf("L %lld  B %lld  plain: %.1f tok/s, step %.3f ms (target %.3f ms)\n",
                            static_cast<long long>(L), static_cast<long long>(B), plain.tok_s, plain.step_ms,
                            plain.target_ms);
                std::fflush(stdout);
                json row = {{"context", L}, {"batch", B},
                            {"plain", {{"tok_s", plain.tok_s}, {"step_ms", plain.step_ms},
                                       {"target_ms", plain.target_ms}, {"steps", plain.steps},
                                       {"graph_replays", plain.graph_replays}}},
                            {"spec", json::array()}};
                if (o.op_split) {
                    json split;
                    std::printf("    plain %s\n", op_split(*model, *ops, o, L, B, {0, 1.0}, kv_format, &split).c_str());
                    row["plain"]["op_split"] = split;
                }
                for (const SpecPoint& sp : o.spec) {
                    const RunResult r = run(*model, *ops, o, L, B, sp, kv_format);
                    const double t_plain = plain.step_ms;
                    const double t_draft = r.draft_ms / static_cast<double>(sp.k);
                    // The ceiling at the tokens per request and step that the window reached (the verifier's
                    // acceptance length, give or take the window's edges), against plain decoding's.
                    const double per_step = (static_cast<double>(r.tokens) / static_cast<double>(r.steps)) /
                                            (static_cast<double>(plain.tokens) / static_cast<double>(plain.steps));
                    const double ceiling = per_step / ((r.target_ms + r.draft_ms) / t_plain);
                    const double speedup = r.tok_s / plain.tok_s;
                    std::printf("  K %lld  A %.2f (set %.2f): %.1f tok/s = %.2fx plain; step %.3f ms: verify %.3f ms "
                                "(%.2f t_plain), draft %.3f ms a step (%.3f t_plain); ceiling %.2fx, reached %.0f%%\n",
                                static_cast<long long>(sp.k), r.acceptance, sp.length, r.tok_s, speedup, r.step_ms,
                                r.target_ms, r.target_ms / t_plain, t_draft, t_draft / t_plain, ceiling,
                                100.0 * speedup / ceiling);
                    std::fflush(stdout);
                    row["spec"].push_back({{"k", sp.k}, {"set_length", sp.length}, {"length", r.acceptance},
                                           {"tokens_per_step_vs_plain", per_step},
                                           {"tok_s", r.tok_s}, {"speedup", speedup}, {"step_ms", r.step_ms},
                                           {"verify_ms", r.target_ms}, {"draft_ms_per_step", t_draft},
                                           {"draft_ms_total", r.draft_ms}, {"ceiling", ceiling},
                                           {"share_of_ceiling", speedup / ceiling}, {"steps", r.steps},
                                           {"graph_replays", r.graph_replays}});
                    if (o.op_split) {
                        json split;
                        std::printf("    K %lld %s\n", static_cast<long long>(sp.k),
                                    op_split(*model, *ops, o, L, B, sp, kv_format, &split).c_str());
                        row["spec"].back()["op_split"] = split;
                    }
                }
                rows.push_back(row);
            }
        }
        if (!json_path.empty()) {
            const std::string root = MEGACTX_SOURCE_DIR;
            json out = {{"bench", "bench_spec"},   {"date", bench::utc_now()},
                        {"commit", bench::source_commit(root)}, {"device", o.device},
                        {"host", bench::device_info()}, {"kv", o.kv},
                        {"tokens_per_request", o.tokens},       {"model", model_info},
                        {"rows", rows}};
            std::ofstream(json_path) << out.dump(2) << "\n";
        }
    } catch (const Error& e) {
        std::fprintf(stderr, "bench_spec: %s\n", e.what());
        return 1;
    }
    return 0;
}
