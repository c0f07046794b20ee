// The device, parallelism and engine flags the commands share, and what they build: the op table for
// --device, the group for --tensor-parallel-size / --pipeline-parallel-size / --nnodes, and the backend hooks of
// EngineOptions that `serve`, `run` and `eval` load their engine with (engine/loader.h: load_engine).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "kv/kv_format.h"
#include "ops/ops.h"
#include "parallel/rendezvous.h"
#include "parallel/tp_group.h"
#include "engine/loader.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

struct BackendFlags {
    std::string device = "cpu";
    ParallelOptions tp;
    std::string tp_transport = "auto";
    std::string kv_dtype = "auto";
    double gpu_memory_utilization = 0.9;  // the engine commands (add_engine_flags); logits and generate use 0.9
    bool batch_invariant = false;         // CudaOptions::batch_invariant (the CPU backend is batch-invariant as it is)
    std::string indexer_hadamard = "auto";  // --indexer-hadamard: ModelConfig::indexer_hadamard's override
    // Ranks on several nodes: --nnodes, --node-rank, --dist-init-addr (or --master-addr and --master-port),
    // --dist-timeout, --headless (resolve_dist fills `dist` from the flags).
    DistOptions dist;
    std::string dist_init_addr, master_addr;
    int master_port = 0;
    bool headless = false;
    bool dist_flags_given =
        false;  // --nnodes or --node-rank on the command line (else a launcher's environment may say)
};

// --device, --tensor-parallel-size/--tp, --expert-parallel, --indexer-split, --layer-split, --tp-transport,
// --kv-cache-dtype, --batch-invariant, --indexer-hadamard, and the multi-node flags --nnodes, --node-rank,
// --dist-init-addr, --master-addr, --master-port, --dist-timeout, --headless.
void add_backend_flags(CLI::App* sub, BackendFlags& f);
// The engine's settings: --max-model-len, --max-num-seqs, --max-num-batched-tokens, --kv-cache-memory,
// --gpu-memory-utilization, --no-prefix-caching (the defaults shown are those in `so` and `f` when called).
void add_engine_flags(CLI::App* sub, EngineOptions& so, BackendFlags& f);

KvFormat resolve_kv_format(const std::string& device, const std::string& kv_dtype);

// The op table for --device: the CPU oracle, or CudaOps on device 0 with `budget_fraction` of its free memory
// (and, with `batch_invariant`, its batch-invariant mode).
std::unique_ptr<Ops> make_backend(const std::string& device, double budget_fraction, bool batch_invariant = false);

// --tensor-parallel-size N (× --pipeline-parallel-size P): N · P ranks, each with its own backend, a communicator
// per stage. cpu: CpuOps, thread transport. cuda: rank r on GPU r with NCCL (--tp-transport nccl, the default), or
// --tp-transport thread: ranks on GPU r % count exchanging through host memory (several ranks on one GPU, for
// tests; the budget is shared by the ranks of a GPU).
std::unique_ptr<TensorParallelGroup> make_tp_group(const std::string& dir, const std::string& device,
                                                   const ParallelOptions& po, const std::string& transport,
                                                   double budget_fraction, bool batch_invariant = false);

// Checks the multi-node flags and fills f.dist (its address from --dist-init-addr or --master-addr/-port); an
// error names the bad combination. Nothing to do for one node.
void resolve_dist(BackendFlags& f);
// True when this process is a node other than 0: it runs its ranks for node 0 (follower_main), not the command.
inline bool is_follower_node(const BackendFlags& f) { return f.dist.node_rank > 0 || f.headless; }

// The tensor-parallel group of the flags: make_tp_group on one node; with --nnodes, node 0's ranks after the
// rendezvous with the other nodes (whose ranks it then drives). Across nodes a tensor-parallel group's
// collectives and the stages' pipes go over gloo through host memory, on either backend; a node's stages keep
// theirs inside it (NCCL on GPUs).
std::unique_ptr<TensorParallelGroup> make_group(const std::string& dir, const BackendFlags& f, double budget_fraction);

// A node other than 0 (--node-rank R > 0, headless): meets node 0, loads its ranks' shards and runs node 0's
// steps until node 0 stops (returns 0) or something fails (the process exits with status 1 and the error).
int follower_main(const std::string& dir, BackendFlags f);

// Sets so.make_group (tensor parallel) or so.make_backend (one GPU) for the flags; nothing for one CPU device.
// On CUDA the KV pool gets what the memory budget leaves after the weights and an activation reserve, unless
// --kv-cache-memory names its size. `f` must outlive `so`'s hooks.
void set_engine_backend(EngineOptions& so, const BackendFlags& f);

// The tokenizer of the model in `dir` for `command` ("run", "eval niah"), after its config.json is checked (so a
// wrong directory is reported as by the other commands).
Tokenizer load_model_tokenizer(const std::string& dir, const std::string& command);

}  // namespace megactx
