// bench_model: model-level decode TPOT and prefill throughput of a GLM-DSA model on the CUDA backend at long
// contexts (issue 5), e.g. the glm52-shape preset with IndexShare (FSSS) next to every layer full (F).
//
// A context of L tokens is made by filling the KV pools with random valid rows (kv_fill.h) instead of
// prefilling L tokens; the sequence's block table then covers positions 0..L, and
//   decode:  one token at position L per sequence, forward + logits download, median over --steps steps; with
//            --decode-batch B, B sequences that share the context's blocks (each with its own last block, so
//            the B new rows land in different slots): a step is one ragged batch of B decode tokens;
//   prefill: a chunk of --chunk tokens at positions L − chunk .. L − 1 (so the last query sees L keys),
//            tokens/s = chunk / time, median over --prefill-reps runs.
// Every step is a full `GlmDsaModel::forward` through CudaOps (plan upload, all layers, LM head, host sync),
// without CUDA graphs: the CPU launch overhead is part of the figure. Each model's device weight bytes are printed
// (and in every JSON row) after its runs.
//
// With --tp N the model runs tensor parallel on N GPUs (NCCL; --expert-parallel splits the experts; --tp-transport
// thread puts the ranks on one GPU): every rank's KV pools are filled the same way.
//
// With --device-blocks N each model also runs with a host KV tier (kv/kv_tiers.h): N device blocks, the rest of
// the blocks' latent rows in pinned host memory; each step (as in the engine) first applies the last step's block
// moves, and the tiered rows report the host rows gathered per token and the hot set's promotions. The decode
// token and position repeat, so a step selects what the last one did: --promotions 0 (no hot set) shows the cost
// when every selected host row is fetched each step, the default how a hot set absorbs a stable selection, and
// --vary-tokens (a new token each step: on random weights and keys, a new selection each step) how it does not.
//
// With --op-split S (one GPU) each decode case also runs S eager steps through a ProfilingOps with every op
// synchronised (cuda_sync_each_op) and prints the ms per step of each op, largest first: where a step's time goes
// (the launch and synchronisation of each op included, so the parts add up to more than the step).
//
//   bench_model --model DIR [--model DIR2 ...] [--contexts 8192,131072,1048576] [--kv fp8|bf16]
//               [--steps 20] [--chunk 4096] [--prefill-reps 2] [--tp N [--expert-parallel]]
//               [--device-blocks N [--promotions P]] [--vary-tokens] [--op-split S] [--json PATH]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/kv_fill.h"
#include "bench_util.h"
#include "profiling_ops.h"
#include "kv/kv_cache.h"
#include "model/batch.h"
#include "model/glm_dsa.h"
#include "model/graphed_forward.h"
#include "parallel/comm_thread.h"
#include "parallel/tp_group.h"

using namespace megactx;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void fill_pools(KvCache& kv, const ModelConfig& c, KvFormat fmt) {
    const auto f = fmt == KvFormat::FP8 ? cuda::KvFillFormat::kFp8 : cuda::KvFillFormat::kBf16;
    for (int64_t l = 0; l < c.n_layers_total(); ++l) {
        if (!kv.owns(l)) continue;  // LayerSplit: another rank's layer
        // The device latent pool (with a host tier: its blocks and the staging rows), then the host tier's pool,
        // written in place through its mapped address.
        cuda::fill_kv_random(kv.latent(l).data, cuda::KvFillKind::kLatent, f, kv.latent(l).dim(0), c.kv_lora_rank,
                             c.qk_rope_head_dim, 1000 + static_cast<uint64_t>(l));
        if (kv.tiered())
            cuda::fill_kv_random(kv.host_latent(l).data, cuda::KvFillKind::kLatent, f, kv.host_latent(l).dim(0),
                                 c.kv_lora_rank, c.qk_rope_head_dim, 3000 + static_cast<uint64_t>(l));
        if (c.is_full(l))
            cuda::fill_kv_random(kv.indexer_keys(l).data, cuda::KvFillKind::kIndexer, f, kv.n_blocks() * kBlockSize,
                                 c.d_indexer, 0, 2000 + static_cast<uint64_t>(l));
    }
}

// One step as the engine runs it: (host tier) the last step's block moves, then the forward and the logits.
// end_step_ms (if given) adds the host tier's end of the last step: its hit counts downloaded and its promotions.
double time_forward(const GlmDsaModel& model, Ops& ops, const Batch& b, KvCache& kv, std::vector<float>& host,
                    GraphedForward* graphs = nullptr, double* end_step_ms = nullptr) {
    const auto t0 = Clock::now();
    kv.end_step();
    if (end_step_ms) *end_step_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!graphs) kv.flush_tiers();  // (GraphedForward flushes itself)
    const ForwardResult r = graphs ? graphs->forward(b) : model.forward(ops, b, kv);
    host.resize(static_cast<size_t>(r.logits.numel()));
    ops.download(r.logits, host.data());  // synchronises the stream
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_model: decode TPOT and prefill tokens/s at long contexts on the CUDA backend"};
    std::vector<std::string> models;
    std::string contexts_arg = "8192,131072,1048576", kv_arg = "fp8", json_path;
    int64_t steps = 20, chunk = 4096, prefill_reps = 2;
    std::string decode_batch_arg = "1";
    app.add_option("--model", models, "model directories (gen-model output); repeat to compare")->required();
    app.add_option("--contexts", contexts_arg, "context lengths L");
    app.add_option("--kv", kv_arg, "KV format: fp8 | bf16");
    app.add_option("--steps", steps, "timed decode steps per context")->check(CLI::Range(1, 10000));
    app.add_option("--chunk", chunk, "prefill chunk (0: no prefill measurement)")->check(CLI::Range(0, 65536));
    app.add_option("--prefill-reps", prefill_reps)->check(CLI::Range(1, 100));
    app.add_option("--decode-batch", decode_batch_arg,
                   "sequences decoding together, a list (they share the context's KV blocks), e.g. 1,32");
    app.add_option("--json", json_path, "write the results as JSON");
    int64_t device_blocks = 0, promotions = 32, staging_rows = 8, op_split = 0;
    app.add_option("--op-split", op_split, "eager decode steps timed op by op, each op synchronised (0: none)")
        ->check(CLI::Range(0, 1000));
    bool vary_tokens = false;
    app.add_flag("--vary-tokens", vary_tokens,
                 "decode a different token each step (a selection that moves) instead of repeating one");
    app.add_option("--device-blocks", device_blocks,
                   "also run each model with a host KV tier: this many device blocks, the rest in pinned host memory")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
    app.add_option("--promotions", promotions, "host tier: blocks promoted into the hot set per step (0: no hot set)")
        ->check(CLI::Range(0, 4096));
    app.add_option("--staging-rows", staging_rows,
                   "host tier: query rows whose selections the staging rows hold (a larger step runs in passes)")
        ->check(CLI::Range(1, 65536));
    ParallelOptions po;
    std::string transport = "nccl";
    app.add_option("--tp", po.n_gpus, "tensor-parallel ranks (one per GPU with NCCL)")->check(CLI::Range(1, 64));
    app.add_flag("--expert-parallel", po.expert_parallel, "split the routed experts across the ranks");
    app.add_flag("--layer-split", po.layer_split, "each rank keeps the KV of a contiguous group of layers");
    app.add_flag("--indexer-split", po.indexer_split, "split the indexer by heads (scores all-reduced before top-k)");
    app.add_option("--tp-transport", transport, "nccl | thread");
    CLI11_PARSE(app, argc, argv);
    try {
        const std::vector<int64_t> contexts = bench::parse_positive_list(contexts_arg, "--contexts");
        const std::vector<int64_t> decode_batches = bench::parse_positive_list(decode_batch_arg, "--decode-batch");
        const int64_t max_batch = *std::max_element(decode_batches.begin(), decode_batches.end());
        MEGACTX_CHECK(kv_arg == "fp8" || kv_arg == "bf16", "--kv must be fp8 or bf16, got '{}'", kv_arg);
        const KvFormat fmt = kv_arg == "fp8" ? KvFormat::FP8 : KvFormat::BF16;
        MEGACTX_CHECK(op_split == 0 || po.n_gpus == 1, "--op-split times one GPU's ops: not with --tp");
        const cuda::DeviceInfo dev = cuda::device_info(0);
        nlohmann::json out = {{"bench", "bench_model"},
                              {"device", dev.name},
                              {"date", bench::utc_now()},
                              {"commit", bench::source_commit(MEGACTX_SOURCE_DIR)},
                              {"kv", kv_arg},
                              {"steps", steps},
                              {"vary_tokens", vary_tokens},
                              {"chunk", chunk},
                              {"cuda_graphs", "decode_graph_* columns: GraphedForward replays"},
                              {"tensor_parallel", po.n_gpus},
                              {"expert_parallel", po.expert_parallel},
                              {"layer_split", po.layer_split},
                              {"indexer_split", po.indexer_split},
                              {"tp_transport", po.n_gpus > 1 ? transport : "none"},
                              {"results", nlohmann::json::array()}};
        std::printf("%-28s %9s %6s %6s %12s %12s %16s %12s\n", "model", "L", "full", "batch", "decode ms",
                    "decode tok/s", "prefill tok/s", "graph ms");
        const int64_t max_l = *std::max_element(contexts.begin(), contexts.end());
        for (const std::string& dir : models) {
            std::unique_ptr<TensorParallelGroup> group;
            std::unique_ptr<GlmDsaModel> single;
            std::unique_ptr<Ops> single_ops;
            if (po.n_gpus > 1) {
                const int n_dev = cuda::device_count();
                std::vector<std::unique_ptr<Ops>> rank_ops;
                for (int64_t r = 0; r < po.n_gpus; ++r) {
                    CudaOptions o;
                    o.device = static_cast<int>(r % n_dev);
                    rank_ops.push_back(make_cuda_ops(o));
                }
                group = std::make_unique<TensorParallelGroup>(dir, po, std::move(rank_ops),
                                                              transport == "thread"
                                                                  ? TensorParallelGroup::CommFactory(make_thread_comms)
                                                                  : TensorParallelGroup::CommFactory(make_nccl_comms));
            } else {
                single = std::make_unique<GlmDsaModel>(dir);
                single_ops = make_cuda_ops(CudaOptions{});
            }
            const GlmDsaModel& model = group ? group->model() : *single;
            Ops* ops = group ? &group->ops() : single_ops.get();
            const ModelConfig& c = model.config();
            int64_t n_full = 0;
            for (int64_t l = 0; l < c.n_layers; ++l) n_full += c.is_full(l);
            const int64_t n_need = (max_l + kBlockSize - 1) / kBlockSize + 2 + max_batch;
            std::vector<int64_t> device_tiers = {0};  // 0: every block on the device
            if (device_blocks > 0) {
                MEGACTX_CHECK(device_blocks < n_need, "--device-blocks {}: the longest context needs only {} blocks",
                              device_blocks, n_need);
                device_tiers.push_back(device_blocks);
            }
            for (const int64_t n_dev : device_tiers) {
                std::unique_ptr<KvCache> kv_owner =
                    n_dev == 0 ? std::make_unique<KvCache>(*ops, c, n_need, fmt, model.kv_layers())
                               : std::make_unique<KvCache>(*ops, c, n_dev, fmt, model.kv_layers(),
                                                           KvTierOptions{n_need - n_dev, staging_rows, promotions});
                KvCache& kv = *kv_owner;
                model.prepare_kv(kv);  // tensor parallel: the followers' caches (and tiers, replaying rank 0's events)
                fill_pools(kv, c, fmt);
                if (group) group->run_on_followers(kv, [&](int, Ops&, KvCache& k) { fill_pools(k, c, fmt); });
                std::vector<float> host;
                GraphedForward graphs(model, *ops, kv);  // decode steps as CUDA graph replays (single device)
                const std::string tier_label =
                    n_dev == 0 ? "gpu" : fmt::format("gpu {} + host {}", n_dev, n_need - n_dev);
                for (const int64_t L : contexts) {
                    // The decode token sits at position L (L cached keys before it): L + 1 ≤ max_position_embeddings,
                    // so "1M" is --contexts 1048575.
                    MEGACTX_CHECK(L < c.max_position_embeddings, "context {} + the decode token exceeds the model's {}",
                                  L, c.max_position_embeddings);
                    SeqKv seq;
                    seq.reserve(kv.blocks(), L + 1);
                    const int32_t tok = 17;
                    double prefill_tok_s = 0, prefill_ms = 0;
                    if (chunk > 0 && L >= chunk) {
                        std::vector<int32_t> toks(static_cast<size_t>(chunk));
                        for (int64_t i = 0; i < chunk; ++i)
                            toks[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % c.vocab_size);
                        Batch p;
                        p.add_sequence(&seq.blocks, toks.data(), chunk, L - chunk, false);
                        p.want_logits.back() = true;
                        time_forward(model, *ops, p, kv, host);  // warm-up (allocator, cuBLASLt plans)
                        std::vector<double> pms;
                        for (int64_t i = 0; i < prefill_reps; ++i)
                            pms.push_back(time_forward(model, *ops, p, kv, host));
                        prefill_ms = median(pms);
                        prefill_tok_s = 1e3 * static_cast<double>(chunk) / prefill_ms;
                    }
                    for (const int64_t B : decode_batches) {
                        // B sequences: the shared context blocks, each its own block for position L (the random pool
                        // fill gives that block's earlier rows too), so the B new rows land in different slots.
                        std::vector<std::vector<int32_t>> tables(static_cast<size_t>(B), seq.blocks);
                        std::vector<int32_t> own;
                        for (auto& t : tables) {
                            own.push_back(kv.blocks().allocate());
                            t[static_cast<size_t>(L / kBlockSize)] = own.back();
                        }
                        // The decode step's batch: token 17 every step, or (--vary-tokens) another each step.
                        int64_t step = 0;
                        std::vector<int32_t> step_tok(1, tok);
                        const auto batch = [&] {
                            step_tok[0] = vary_tokens ? static_cast<int32_t>((17 + 7919 * step++) % c.vocab_size) : tok;
                            Batch d;
                            for (auto& t : tables) d.add_sequence(&t, step_tok.data(), 1, L, true);
                            return d;
                        };
                        for (int i = 0; i < 3; ++i) time_forward(model, *ops, batch(), kv, host);
                        std::vector<double> ms, gms;
                        for (int64_t i = 0; i < steps; ++i) ms.push_back(time_forward(model, *ops, batch(), kv, host));
                        // The same step through GraphedForward: a first eager step, a recorded one, then replays;
                        // the host tier's counts are over the replays (the figure reported).
                        for (int i = 0; i < 3; ++i) time_forward(model, *ops, batch(), kv, host, &graphs);
                        kv.end_step();
                        const TierStats before = kv.tiered() ? kv.tiers().stats() : TierStats{};
                        const int64_t stall_before = ops->kv_fetch_stall_ns();
                        double end_step_ms = 0;
                        for (int64_t i = 0; i < steps; ++i)
                            gms.push_back(time_forward(model, *ops, batch(), kv, host, &graphs, &end_step_ms));
                        end_step_ms /= static_cast<double>(steps);
                        kv.end_step();
                        // The fetch stall per graphed step (the compute stream waiting for the copy stream's rows).
                        const double stall_ms = static_cast<double>(ops->kv_fetch_stall_ns() - stall_before) / 1e6 /
                                                static_cast<double>(steps);
                        TierStats per_step = kv.tiered() ? kv.tiers().stats() : TierStats{};
                        per_step.device_rows -= before.device_rows;
                        per_step.host_rows -= before.host_rows;
                        per_step.promotions -= before.promotions;
                        const double fetched_per_token = static_cast<double>(per_step.host_rows) *
                                                         static_cast<double>(kv.latent_row_bytes()) /
                                                         static_cast<double>(steps * B);
                        // Op by op (--op-split): eager steps, each op waiting for its kernels.
                        nlohmann::json split = nlohmann::json::object();
                        if (op_split > 0) {
                            ProfilingOps prof(*ops);
                            cuda_sync_each_op(*ops, true);
                            for (int64_t i = 0; i < op_split; ++i) time_forward(model, prof, batch(), kv, host);
                            cuda_sync_each_op(*ops, false);
                            auto stats = prof.stats();
                            std::sort(stats.begin(), stats.end(),
                                      [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
                            std::string line;
                            for (const auto& [name, st] : stats) {
                                const double op_ms = 1e3 * st.seconds / static_cast<double>(op_split);
                                split[name] = {{"ms_per_step", op_ms},
                                               {"calls_per_step", static_cast<double>(st.calls) /
                                                                      static_cast<double>(op_split)}};
                                line += fmt::format(" {} {:.3f}", name, op_ms);
                            }
                            std::printf("%-28s   op split, ms a step (each op synchronised):%s\n", "", line.c_str());
                        }
                        for (int32_t b : own) kv.blocks().release(b);
                        const double dec = median(ms), gdec = median(gms);
                        const bool graphed = graphs.stats().replayed > 0 && graphs.enabled();
                        std::printf("%-28s %9lld %3lld/%-2lld %6lld %12.3f %12.0f %16.0f %12.3f  %s%s\n",
                                    dir.substr(dir.find_last_of('/') + 1).c_str(), static_cast<long long>(L),
                                    static_cast<long long>(n_full), static_cast<long long>(c.n_layers),
                                    static_cast<long long>(B), dec, 1e3 * static_cast<double>(B) / dec, prefill_tok_s,
                                    gdec, tier_label.c_str(), graphed ? "" : " (eager: no graphs)");
                        if (kv.tiered())
                            std::printf(
                                "%-28s   host tier: %.0f rows fetched per token (%.2f MB, %.2f MB per layer), "
                                "%.0f selected rows resident, %.1f promotions per step, fetch stall %.3f ms "
                                "a step (%.1f%% of it), end of step on the host %.3f ms\n",
                                "", static_cast<double>(per_step.host_rows) / static_cast<double>(steps * B),
                                fetched_per_token / 1e6, fetched_per_token / 1e6 / static_cast<double>(c.n_layers),
                                static_cast<double>(per_step.device_rows) / static_cast<double>(steps * B),
                                static_cast<double>(per_step.promotions) / static_cast<double>(steps), stall_ms,
                                100.0 * stall_ms / gdec, end_step_ms);
                        std::fflush(stdout);
                        out["results"].push_back(
                            {{"model", dir},
                             {"n_layers", c.n_layers},
                             {"n_full", n_full},
                             {"n_experts", c.n_routed_experts},
                             {"context", L},
                             {"decode_batch", B},
                             {"decode_ms_median", dec},
                             {"decode_tok_s", 1e3 * static_cast<double>(B) / dec},
                             {"decode_ms_min", *std::min_element(ms.begin(), ms.end())},
                             {"decode_graph_ms_median", gdec},
                             {"decode_graphed", graphed},
                             {"decode_graph_tok_s", 1e3 * static_cast<double>(B) / gdec},
                             {"prefill_chunk", chunk},
                             {"prefill_ms", prefill_ms},
                             {"prefill_tok_s", prefill_tok_s},
                             {"weight_bytes", cuda_memory_stats(*ops).weight_bytes},
                             {"kv_device_blocks", n_dev == 0 ? n_need : n_dev},
                             {"kv_host_blocks", n_dev == 0 ? 0 : n_need - n_dev},
                             {"hot_set_promotions_max", n_dev == 0 ? 0 : promotions},
                             {"staging_rows", n_dev == 0 ? 0 : staging_rows},
                             {"host_rows_per_token",
                              static_cast<double>(per_step.host_rows) / static_cast<double>(steps * B)},
                             {"resident_rows_per_token",
                              static_cast<double>(per_step.device_rows) / static_cast<double>(steps * B)},
                             {"fetched_bytes_per_token", fetched_per_token},
                             {"promotions_per_step",
                              static_cast<double>(per_step.promotions) / static_cast<double>(steps)},
                             {"fetch_stall_ms_per_step", stall_ms},
                             {"end_step_host_ms", end_step_ms},
                             {"op_split", split}});
                    }
                    seq.free(kv.blocks());
                }
            }
            // Device memory of the weights (FP8 checkpoints: e4m3 + scales, plus any bf16 copies GEMMs made).
            std::printf("%-28s weights on the device: %.2f GiB\n", dir.substr(dir.find_last_of('/') + 1).c_str(),
                        static_cast<double>(cuda_memory_stats(*ops).weight_bytes) / (1 << 30));
        }
        if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_model: %s\n", e.what());
        return 1;
    }
    return 0;
}
