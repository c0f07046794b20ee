#include "engine_setup.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/cpu/cpu_ops.h"
#include "cli_checks.h"
#include "core/error.h"
#include "io/config.h"
#include "kv/kv_cache.h"
#include "model/glm_dsa.h"
#include "parallel/comm_gloo.h"
#include "parallel/comm_thread.h"
#include "parallel/launcher_env.h"
#include "parallel/node_group.h"
#include "parallel/rendezvous.h"

#ifdef MEGACTX_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#endif

namespace megactx {

void add_backend_flags(CLI::App* sub, BackendFlags& f) {
    sub->add_option("--device", f.device, "cpu | cuda")->capture_default_str();
    sub->add_option("--tensor-parallel-size,--tp", f.tp.n_gpus, "Ranks (GPUs) sharing the model")
        ->capture_default_str()
        ->check(in_range<int64_t>(1, 64));
    sub->add_option("--pipeline-parallel-size,--pp", f.tp.pp,
                    "Pipeline stages, each of --tensor-parallel-size ranks holding a contiguous group of layers and "
                    "their KV; a step's batch goes through them in micro-batches")
        ->capture_default_str()
        ->check(in_range<int64_t>(1, 64));
    sub->add_flag("--expert-parallel", f.tp.expert_parallel,
                  "Split the routed experts across the ranks (else by columns)");
    sub->add_flag("--indexer-split", f.tp.indexer_split,
                  "Split the indexer by heads (partial scores all-reduced before top-k; default: replicated)");
    sub->add_flag("--layer-split", f.tp.layer_split,
                  "Each rank keeps the KV of a contiguous group of layers (the node holds N times more tokens)");
    sub->add_option("--tp-transport", f.tp_transport,
                    "auto | nccl | thread (auto: nccl on cuda, thread on cpu; thread allows several ranks per GPU)")
        ->capture_default_str();
    sub->add_option("--kv-cache-dtype", f.kv_dtype, "auto | f32 | bf16 | fp8 (auto: f32 on cpu, bf16 on cuda)")
        ->capture_default_str();
    sub->add_flag("--batch-invariant", f.batch_invariant,
                  "cuda: every row's result independent of the rest of the batch, so speculative = plain and a "
                  "prefix-cache hit = a cold run, token for token (slower; the CPU backend is so already)");
    sub->add_option("--indexer-hadamard", f.indexer_hadamard,
                    "auto | on | off: rotate the indexer's queries and keys by the normalised Walsh-Hadamard matrix "
                    "before FP8 quantisation (--kv-cache-dtype fp8; auto: on for deepseek_v32, off for GLM)")
        ->capture_default_str();
    sub->add_option("--nnodes", f.dist.nnodes,
                    "Processes (nodes) sharing the --tensor-parallel-size ranks; node 0 runs the command (default: "
                    "the launcher's, from torchrun, LeaderWorkerSet, Slurm or Open MPI variables, else 1)")
        ->capture_default_str()
        ->check(in_range<int64_t>(1, 64))
        ->each([&f](const std::string&) { f.dist_flags_given = true; });
    sub->add_option("--node-rank", f.dist.node_rank,
                    "This node's number, 0..nnodes-1 (nodes other than 0 run their ranks for node 0: headless)")
        ->capture_default_str()
        ->check(in_range<int64_t>(0, 63))
        ->each([&f](const std::string&) { f.dist_flags_given = true; });
    sub->add_option("--dist-init-addr", f.dist_init_addr,
                    "HOST:PORT where node 0 listens for the other nodes (default: none; --nnodes 2 or more needs it)");
    sub->add_option("--master-addr", f.master_addr, "vLLM's form of --dist-init-addr: node 0's host (default: none)");
    sub->add_option("--master-port", f.master_port, "vLLM's form of --dist-init-addr: node 0's port (default: none)")
        ->check(in_range(1, 65535));
    sub->add_option("--dist-timeout", f.dist.timeout_s,
                    "Seconds the nodes wait for each other at the start before giving up with an error")
        ->capture_default_str()
        ->check(in_range(0.1, 86400.0));
    sub->add_flag("--headless", f.headless, "Run this node's ranks only (implied by --node-rank > 0)");
}

void resolve_dist(BackendFlags& f) {
    DistOptions& d = f.dist;
    // No multi-node flag on the command line: a launcher's environment may say (parallel/launcher_env.h).
    if (!f.dist_flags_given && f.dist_init_addr.empty() && f.master_addr.empty() && f.master_port == 0 && !f.headless) {
        const auto env = launcher_env([](const char* name) { return std::getenv(name); });
        if (env && env->nnodes > 1) {
            MEGACTX_CHECK(!env->host.empty(),
                          "{} says {} nodes ({}) but not node 0's address: give --dist-init-addr HOST:PORT or set "
                          "MASTER_ADDR",
                          env->launcher, env->nnodes, env->variables);
            d.nnodes = env->nnodes;
            d.node_rank = env->node_rank;
            f.dist_init_addr = (env->host.find(':') != std::string::npos ? "[" + env->host + "]" : env->host) + ":" +
                               std::to_string(env->port);
            std::fprintf(stderr, "megactx: --nnodes %lld --node-rank %lld --dist-init-addr %s from %s (%s)\n",
                         static_cast<long long>(d.nnodes), static_cast<long long>(d.node_rank),
                         f.dist_init_addr.c_str(), env->launcher.c_str(), env->variables.c_str());
        }
    }
    if (d.nnodes == 1) {
        MEGACTX_CHECK(d.node_rank == 0, "--node-rank {} with --nnodes 1: a node rank needs --nnodes 2 or more",
                      d.node_rank);
        MEGACTX_CHECK(f.dist_init_addr.empty() && f.master_addr.empty() && f.master_port == 0,
                      "--dist-init-addr / --master-addr / --master-port need --nnodes 2 or more");
        MEGACTX_CHECK(!f.headless, "--headless needs --nnodes 2 or more and --node-rank 1 or more");
        return;
    }
    MEGACTX_CHECK(d.node_rank < d.nnodes, "--node-rank {} with --nnodes {}: must be 0..{}", d.node_rank, d.nnodes,
                  d.nnodes - 1);
    MEGACTX_CHECK(!(f.headless && d.node_rank == 0),
                  "--headless with --node-rank 0: node 0 runs the scheduler, tokenizer and server; the other nodes "
                  "are headless");
    MEGACTX_CHECK(f.dist_init_addr.empty() || (f.master_addr.empty() && f.master_port == 0),
                  "--dist-init-addr and --master-addr/--master-port name the same address: give one of them");
    if (!f.dist_init_addr.empty()) {
        std::tie(d.host, d.port) = parse_host_port(f.dist_init_addr, "--dist-init-addr");
    } else {
        MEGACTX_CHECK(!f.master_addr.empty() && f.master_port != 0,
                      "--nnodes {} needs node 0's address: --dist-init-addr HOST:PORT (or --master-addr HOST and "
                      "--master-port PORT)",
                      d.nnodes);
        d.host = f.master_addr;
        d.port = f.master_port;
    }
    if (f.tp.pp > 1) {  // whole stages a node: tensor parallel inside a node, pipeline across nodes
        MEGACTX_CHECK(f.tp.pp % d.nnodes == 0,
                      "--pipeline-parallel-size {} with --nnodes {}: every node runs the same number of whole stages, so "
                      "the stage count must be a multiple of {}",
                      f.tp.pp, d.nnodes, d.nnodes);
    } else {
        MEGACTX_CHECK(f.tp.n_gpus % d.nnodes == 0,
                      "--tensor-parallel-size {} with --nnodes {}: every node runs the same number of ranks, so the "
                      "size must be a multiple of {} (or give --pipeline-parallel-size {}: a stage a node)",
                      f.tp.n_gpus, d.nnodes, d.nnodes, d.nnodes);
    }
    if (f.tp.pp == 1) {
        MEGACTX_CHECK(f.tp_transport == "auto" || f.tp_transport == "gloo",
                      "--tp-transport {} with --nnodes {}: ranks in several processes exchange over gloo (auto or "
                      "gloo)",
                      f.tp_transport, d.nnodes);
    } else {
        MEGACTX_CHECK(f.tp_transport != "gloo",
                      "--tp-transport gloo with --pipeline-parallel-size {}: a node holds whole stages, whose ranks "
                      "meet inside it (auto, nccl or thread); the stages exchange over gloo",
                      f.tp.pp);
    }
}

void add_engine_flags(CLI::App* sub, EngineOptions& so, BackendFlags& f) {
    sub->add_option("--max-model-len,--max-context-len", so.max_model_len,
                    "Maximum tokens per sequence, prompt plus output, up to 1048576 (default: the model's)")
        ->check(in_range<int64_t>(1, 1048576));
    sub->add_option("--max-num-seqs", so.max_num_seqs, "Sequences in the running batch")
        ->capture_default_str()
        ->check(in_range<int64_t>(1, 4096));
    sub->add_option("--max-num-batched-tokens", so.max_num_batched_tokens, "Tokens per engine step")
        ->capture_default_str()
        ->check(in_range<int64_t>(1, int64_t{1} << 20));
    sub->add_option("--kv-cache-memory", so.kv_cache_memory,
                    "KV cache size on the device, e.g. 4GiB (default 2GiB on the CPU; on CUDA what the budget leaves)");
    sub->add_option("--kv-offload-memory", so.kv_offload_memory,
                    "Host KV tier, e.g. 64GiB: latent rows beyond the device's, fetched as sparse attention selects "
                    "them (default: none)");
    sub->add_option("--gpu-memory-utilization", f.gpu_memory_utilization,
                    "cuda: fraction of the free GPU memory for weights, KV cache and activations")
        ->capture_default_str()
        ->check(in_range(0.01, 1.0));
    sub->add_flag_callback(
        "--no-prefix-caching", [&so] { so.prefix_caching = false; }, "Disable prefix caching");
    sub->add_option("--speculative-tokens", so.speculative_tokens,
                    "MTP speculative decoding: draft tokens per step, verified exactly (0 = off)")
        ->capture_default_str()
        ->check(in_range<int64_t>(0, 7));
    sub->add_option(
        "--speculative-config", so.speculative_config,
        R"(vLLM's form of --speculative-tokens: '{"method":"mtp","num_speculative_tokens":K}' (default: none))");
    sub->add_option("--speculative-disable-by-batch-size", so.speculative_disable_by_batch_size,
                    "No drafts in a step where more than N sequences decode (vLLM's disable_by_batch_size; 0 = never)")
        ->capture_default_str()
        ->check(in_range<int64_t>(0, 1 << 20));
    sub->add_flag("--no-mtp-index-share", so.no_mtp_index_share,
                  "Draft steps after the first run the MTP indexer instead of reusing the first step's top-k "
                  "(default: as config.json's index_share_for_mtp_iteration)");
}

namespace {

// --batch-invariant over NCCL: refused, since NCCL orders its sums by message size.
void check_invariant_transport(bool batch_invariant, bool nccl, int64_t ranks) {
    MEGACTX_CHECK(!(nccl && batch_invariant),
                  "--batch-invariant with --tensor-parallel-size {}: NCCL orders its sums by message size, so a row's "
                  "result would still depend on the batch (--tp-transport thread keeps the order fixed)",
                  ranks);
}

}  // namespace

KvFormat resolve_kv_format(const std::string& device, const std::string& kv_dtype) {
    KvFormat f = KvFormat::F32;
    if (kv_dtype == "auto") {
        f = device == "cuda" ? KvFormat::BF16 : KvFormat::F32;
    } else if (kv_dtype == "f32") {
        f = KvFormat::F32;
    } else if (kv_dtype == "bf16") {
        f = KvFormat::BF16;
    } else if (kv_dtype == "fp8") {
        f = KvFormat::FP8;
    } else {
        MEGACTX_FAIL("--kv-cache-dtype must be auto, f32, bf16 or fp8, got '{}'", kv_dtype);
    }
    MEGACTX_CHECK(device == "cuda" || f == KvFormat::F32,
                  "--kv-cache-dtype {}: the CPU backend stores the KV cache in f32 only", kv_format_name(f));
    return f;
}

std::unique_ptr<Ops> make_backend(const std::string& device, double budget_fraction, bool batch_invariant) {
    if (device == "cpu") return std::make_unique<CpuOps>();
    MEGACTX_CHECK(device == "cuda", "--device must be cpu or cuda, got '{}'", device);
#ifdef MEGACTX_WITH_CUDA
    MEGACTX_CHECK(cuda::device_count() > 0, "--device cuda: no CUDA device is available (no GPU or no driver)");
    const cuda::DeviceInfo info = cuda::device_info(0);
    CudaOptions o;
    o.memory_budget_bytes = static_cast<int64_t>(static_cast<double>(info.free_bytes) * budget_fraction);
    o.batch_invariant = batch_invariant;
    std::fprintf(stderr, "megactx: CUDA device 0: %s (sm_%d%d, %d SMs), %.1f GiB free, budget %.1f GiB%s\n",
                 info.name.c_str(), info.major, info.minor, info.n_sm, static_cast<double>(info.free_bytes) / (1 << 30),
                 static_cast<double>(o.memory_budget_bytes) / (1 << 30),
                 batch_invariant ? "; batch-invariant kernels" : "");
    return make_cuda_ops(o);
#else
    (void)budget_fraction;
    (void)batch_invariant;
    MEGACTX_FAIL("--device cuda: this megactx was built without CUDA (configure with -DMEGACTX_CUDA=ON)");
#endif
}

namespace {

// The backends of `count` ranks of this process (global ranks first, first + 1, …): CpuOps, or CUDA device
// (local index mod the GPU count), each GPU's budget shared by the ranks on it. `nccl`: one rank a GPU is needed.
std::vector<std::unique_ptr<Ops>> rank_backends(const std::string& device, int64_t first, int64_t count, bool nccl,
                                                double budget_fraction, bool batch_invariant) {
    std::vector<std::unique_ptr<Ops>> ops;
    if (device == "cpu") {
        for (int64_t r = 0; r < count; ++r) ops.push_back(std::make_unique<CpuOps>());
        return ops;
    }
    MEGACTX_CHECK(device == "cuda", "--device must be cpu or cuda, got '{}'", device);
#ifdef MEGACTX_WITH_CUDA
    const int n_dev = cuda::device_count();
    MEGACTX_CHECK(n_dev > 0, "--device cuda: no CUDA device is available (no GPU or no driver)");
    MEGACTX_CHECK(!nccl || count <= n_dev,
                  "{} ranks in this process with NCCL need {} GPUs, this machine has {} (--tp-transport thread puts "
                  "several ranks on one GPU)",
                  count, count, n_dev);
    for (int64_t r = 0; r < count; ++r) {
        const int dev = static_cast<int>(r % n_dev);
        const int64_t sharing = (count - dev + n_dev - 1) / n_dev;  // ranks on this GPU
        const cuda::DeviceInfo info = cuda::device_info(dev);
        CudaOptions o;
        o.device = dev;
        o.batch_invariant = batch_invariant;
        o.memory_budget_bytes =
            static_cast<int64_t>(static_cast<double>(info.free_bytes) * budget_fraction / static_cast<double>(sharing));
        std::fprintf(stderr, "megactx: rank %lld on CUDA device %d (%s), budget %.1f GiB\n",
                     static_cast<long long>(first + r), dev, info.name.c_str(),
                     static_cast<double>(o.memory_budget_bytes) / (1 << 30));
        ops.push_back(make_cuda_ops(o));
    }
    return ops;
#else
    (void)first, (void)count, (void)nccl, (void)budget_fraction, (void)batch_invariant;
    MEGACTX_FAIL("--device cuda: this megactx was built without CUDA (configure with -DMEGACTX_CUDA=ON)");
#endif
}

// The communicators of ranks that are threads of this process: NCCL (one GPU each) or through host memory.
TensorParallelGroup::CommFactory local_comms([[maybe_unused]] bool nccl) {
#ifdef MEGACTX_WITH_CUDA
    if (nccl) return make_nccl_comms;
#endif
    return make_thread_comms;
}

}  // namespace

std::unique_ptr<TensorParallelGroup> make_tp_group(const std::string& dir, const std::string& device,
                                                   const ParallelOptions& po, const std::string& transport,
                                                   double budget_fraction, bool batch_invariant) {
    MEGACTX_CHECK(transport != "gloo", "--tp-transport gloo is for ranks in several processes (--nnodes 2 or more)");
    MEGACTX_CHECK(transport == "auto" || transport == "nccl" || transport == "thread",
                  "--tp-transport must be auto, nccl, thread or gloo, got '{}'", transport);
    MEGACTX_CHECK(device == "cuda" || transport != "nccl", "--tp-transport nccl needs --device cuda");
    const bool nccl = device == "cuda" && transport != "thread";
    if (device == "cuda") check_invariant_transport(batch_invariant, nccl, po.n_gpus);
    const int64_t world = po.n_gpus * po.pp;  // every stage's ranks
    return std::make_unique<TensorParallelGroup>(
        dir, po, rank_backends(device, 0, world, nccl, budget_fraction, batch_invariant), local_comms(nccl));
}

namespace {

std::string hex64(uint64_t h) { return fmt::format("{:016x}", h); }

// What the nodes must agree on: this megactx, the model (config.json's bytes, the weight files' names and sizes)
// and every flag that shapes a rank's shard or its results.
NodeIdentity node_identity(const std::string& dir, const BackendFlags& f) {
    NodeIdentity id;
    id.emplace_back("megactx version", MEGACTX_VERSION_STRING);
    std::ifstream cfg(std::filesystem::path(dir) / "config.json", std::ios::binary);
    std::stringstream ss;
    ss << cfg.rdbuf();
    const std::string text = ss.str();
    id.emplace_back("config.json", hex64(XXH3_64bits(text.data(), text.size())));
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        if (e.path().extension() == ".safetensors")
            files.push_back(e.path().filename().string() + " " + std::to_string(e.file_size()) + " bytes");
    }
    std::sort(files.begin(), files.end());
    std::string weights;
    for (const auto& w : files) weights += (weights.empty() ? "" : ", ") + w;
    id.emplace_back("weight files", weights);
    id.emplace_back("--tensor-parallel-size", std::to_string(f.tp.n_gpus));
    id.emplace_back("--pipeline-parallel-size", std::to_string(f.tp.pp));
    id.emplace_back("--expert-parallel", f.tp.expert_parallel ? "on" : "off");
    id.emplace_back("--indexer-split", f.tp.indexer_split ? "on" : "off");
    id.emplace_back("--layer-split", f.tp.layer_split ? "on" : "off");
    id.emplace_back("--device", f.device);
    id.emplace_back("--kv-cache-dtype", kv_format_name(resolve_kv_format(f.device, f.kv_dtype)));
    id.emplace_back("--batch-invariant", f.batch_invariant ? "on" : "off");
    id.emplace_back("--indexer-hadamard", f.indexer_hadamard);
    return id;
}

// This node's ranks, connected to the other nodes' (the rendezvous first). `rv` keeps the control connections.
std::unique_ptr<TensorParallelGroup> make_node_ranks(const std::string& dir, const BackendFlags& f,
                                                     double budget_fraction, std::unique_ptr<Rendezvous>& rv) {
    load_config(dir);  // a wrong directory is reported before the other nodes are waited for
    const DistOptions& d = f.dist;
    const int64_t world = f.tp.n_gpus * f.tp.pp;
    const int64_t per_node = world / d.nnodes, first = d.node_rank * per_node;
    std::fprintf(stderr, "megactx: node %lld of %lld (ranks %lld-%lld of %lld): %s %s:%d\n",
                 static_cast<long long>(d.node_rank), static_cast<long long>(d.nnodes), static_cast<long long>(first),
                 static_cast<long long>(first + per_node - 1), static_cast<long long>(world),
                 d.node_rank == 0 ? "waiting for the other nodes at" : "joining node 0 at", d.host.c_str(), d.port);
    rv = Rendezvous::join(d, node_identity(dir, f));
    std::vector<std::shared_ptr<gloo::Context>> contexts = rv->connect_gloo(first, per_node, world);
    // Without stages the ranks of the one tensor-parallel group span the nodes: collectives over gloo (through host
    // memory, whatever the backend). With stages a node holds whole stages: collectives inside the node (NCCL
    // on GPUs unless --tp-transport thread), the stages' pipes over gloo.
    const bool nccl = f.tp.pp > 1 && f.device == "cuda" && f.tp_transport != "thread";
    if (f.device == "cuda") check_invariant_transport(f.batch_invariant, nccl, f.tp.n_gpus);
    std::vector<std::unique_ptr<Ops>> ops =
        rank_backends(f.device, first, per_node, nccl, budget_fraction, f.batch_invariant);
    TensorParallelGroup::CommFactory make_comms = local_comms(nccl);
    TensorParallelGroup::PipeFactory make_pipes;
    if (f.tp.pp == 1) {
        make_comms = [&contexts](const std::vector<Ops*>& o) {
            std::vector<std::unique_ptr<Comm>> out;
            for (size_t r = 0; r < o.size(); ++r) out.push_back(std::make_unique<GlooComm>(contexts[r], *o[r]));
            return out;
        };
    } else {
        make_pipes = [&contexts](int64_t, int64_t count) {
            std::vector<std::unique_ptr<Pipe>> out;
            for (int64_t r = 0; r < count; ++r) out.push_back(std::make_unique<GlooPipe>(contexts[static_cast<size_t>(r)]));
            return out;
        };
    }
    std::unique_ptr<FollowerNodes> remote;
    if (d.node_rank == 0) remote = std::make_unique<FollowerNodes>(std::move(rv), per_node);
    return std::make_unique<TensorParallelGroup>(dir, f.tp, std::move(ops), make_comms, first, std::move(remote),
                                                 make_pipes);
}

}  // namespace

std::unique_ptr<TensorParallelGroup> make_group(const std::string& dir, const BackendFlags& f, double budget_fraction) {
    if (f.dist.nnodes > 1) {
        std::unique_ptr<Rendezvous> rv;
        auto g = make_node_ranks(dir, f, budget_fraction, rv);
        g->override_indexer_hadamard(parse_indexer_hadamard(f.indexer_hadamard));
        return g;
    }
    auto g = make_tp_group(dir, f.device, f.tp, f.tp_transport, budget_fraction, f.batch_invariant);
    g->override_indexer_hadamard(parse_indexer_hadamard(f.indexer_hadamard));
    return g;
}

int follower_main(const std::string& dir, BackendFlags f) {
    resolve_dist(f);
    MEGACTX_CHECK(f.dist.nnodes > 1, "--headless needs --nnodes 2 or more and --node-rank 1 or more");
    std::unique_ptr<Rendezvous> rv;
    std::unique_ptr<TensorParallelGroup> group;
    try {
        group = make_node_ranks(dir, f, f.gpu_memory_utilization, rv);
        group->override_indexer_hadamard(parse_indexer_hadamard(f.indexer_hadamard));
    } catch (const std::exception& e) {
        if (rv) {  // met node 0, then failed (its shard did not load): node 0 reports it too, naming this node
            try {
                rv->peer(0).send(kMsgError, e.what());
            } catch (const Error&) {
            }
        }
        throw;
    }
    std::fprintf(stderr, "megactx: node %lld ready\n", static_cast<long long>(f.dist.node_rank));
    return run_follower_node(*rv, *group);
}

#ifdef MEGACTX_WITH_CUDA
namespace {

// Device bytes the weights will take: the checkpoint's safetensors files, three times over for FP8 checkpoints
// (CudaOps keeps the e4m3 weights and a bf16 copy for the GEMMs: the block-scaled FP8 GEMM is not wired yet).
int64_t weight_device_bytes(const std::string& dir) {
    int64_t b = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        if (e.path().extension() == ".safetensors") b += static_cast<int64_t>(e.file_size());
    }
    return load_config(dir).quant_method == "fp8" ? 3 * b : b;
}

}  // namespace
#endif

void set_engine_backend(EngineOptions& so, const BackendFlags& f) {
    const KvFormat kv_format = resolve_kv_format(f.device, f.kv_dtype);
    so.indexer_hadamard = parse_indexer_hadamard(f.indexer_hadamard);
    // Before a server listens: what make_tp_group would refuse at load time.
    if (f.tp.n_gpus > 1 && f.device == "cuda") {  // NCCL inside a process (a group spanning nodes uses gloo)
        const bool across_nodes = f.dist.nnodes > 1 && f.tp.pp == 1;
        check_invariant_transport(f.batch_invariant, f.tp_transport != "thread" && !across_nodes, f.tp.n_gpus);
    }
    if (f.tp.n_gpus > 1 || f.tp.pp > 1) {
        so.make_group = [&so, &f, kv_format](EngineConfig& ec) {
            auto g = make_group(so.model_dir, f, f.gpu_memory_utilization);
#ifdef MEGACTX_WITH_CUDA
            if (f.device != "cpu" && so.kv_cache_memory.empty()) {
                // rank 0's budget less its shard of the weights (about 1/N of the checkpoint) and a reserve
                const CudaMemoryStats st = cuda_memory_stats(g->ops());
                const int64_t weights = weight_device_bytes(so.model_dir) / (f.tp.n_gpus * f.tp.pp);
                const int64_t reserve = std::max<int64_t>(int64_t{256} << 20, st.budget_bytes / 20);
                ec.kv_cache_bytes = st.budget_bytes - weights - reserve;
                MEGACTX_CHECK(ec.kv_cache_bytes > 0, "--gpu-memory-utilization {}: no room for the KV cache",
                              f.gpu_memory_utilization);
            }
#endif
            ec.kv_format = kv_format;
            return g;
        };
    } else if (f.device != "cpu") {
        so.make_backend = [&so, &f, kv_format]([[maybe_unused]] const GlmDsaModel& m, EngineConfig& ec) {
            std::unique_ptr<Ops> ops = make_backend(f.device, f.gpu_memory_utilization, f.batch_invariant);
#ifdef MEGACTX_WITH_CUDA
            const CudaMemoryStats st = cuda_memory_stats(*ops);
            const int64_t weights = weight_device_bytes(so.model_dir);
            const int64_t reserve = std::max<int64_t>(int64_t{256} << 20, st.budget_bytes / 20);
            if (so.kv_cache_memory.empty()) ec.kv_cache_bytes = st.budget_bytes - weights - reserve;
            MEGACTX_CHECK(ec.kv_cache_bytes > 0,
                          "--gpu-memory-utilization {}: {} bytes of budget leave no room for the KV cache "
                          "after {} bytes of weights and a {}-byte activation reserve",
                          f.gpu_memory_utilization, st.budget_bytes, weights, reserve);
            const int64_t per_token = kv_bytes_per_token(m.config(), kv_format);
            std::fprintf(stderr, "megactx: KV cache %s: %.2f GiB at %lld bytes per token = %lld tokens fit\n",
                         kv_format_name(kv_format), static_cast<double>(ec.kv_cache_bytes) / (1 << 30),
                         static_cast<long long>(per_token), static_cast<long long>(ec.kv_cache_bytes / per_token));
#endif
            ec.kv_format = kv_format;
            return ops;
        };
    }
}

Tokenizer load_model_tokenizer(const std::string& dir, const std::string& command) {
    load_config(dir);
    MEGACTX_CHECK(std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json"),
                  "{}: no tokenizer.json; {} needs the model's tokenizer", dir, command);
    return Tokenizer::load(dir);
}

}  // namespace megactx
