// The device, parallelism and engine flags the commands share, and what they build: the op table for
// --device, the tensor-parallel group for --tensor-parallel-size, and the backend hooks of ServeOptions that
// `serve`, `run` and `eval` load their engine with (server/serve.h: load_engine).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "kv/kv_format.h"
#include "ops/ops.h"
#include "parallel/tp_group.h"
#include "server/serve.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

struct BackendFlags {
    std::string device = "cpu";
    ParallelOptions tp;
    std::string tp_transport = "auto";
    std::string kv_dtype = "auto";
    double gpu_memory_utilization = 0.9;  // the engine commands (add_engine_flags); logits and generate use 0.9
    bool batch_invariant = false;         // CudaOptions::batch_invariant (the CPU backend is batch-invariant as it is)
};

// --device, --tensor-parallel-size/--tp, --expert-parallel, --indexer-split, --layer-split, --tp-transport,
// --kv-cache-dtype, --batch-invariant.
void add_backend_flags(CLI::App* sub, BackendFlags& f);
// The engine's settings: --max-model-len, --max-num-seqs, --max-num-batched-tokens, --kv-cache-memory,
// --gpu-memory-utilization, --no-prefix-caching (the defaults shown are those in `so` and `f` when called).
void add_engine_flags(CLI::App* sub, ServeOptions& so, BackendFlags& f);

KvFormat resolve_kv_format(const std::string& device, const std::string& kv_dtype);

// The op table for --device: the CPU oracle, or CudaOps on device 0 with `budget_fraction` of its free memory
// (and, with `batch_invariant`, its batch-invariant mode).
std::unique_ptr<Ops> make_backend(const std::string& device, double budget_fraction, bool batch_invariant = false);

// --tensor-parallel-size N: N ranks, each with its own backend. cpu: N CpuOps, thread transport. cuda: rank r on
// GPU r with NCCL (--tp-transport nccl, the default), or --tp-transport thread: ranks on GPU r % count exchanging
// through host memory (several ranks on one GPU, for tests; the budget is shared by the ranks of a GPU).
std::unique_ptr<TensorParallelGroup> make_tp_group(const std::string& dir, const std::string& device,
                                                   const ParallelOptions& po, const std::string& transport,
                                                   double budget_fraction, bool batch_invariant = false);

// Sets so.make_group (tensor parallel) or so.make_backend (one GPU) for the flags; nothing for one CPU device.
// On CUDA the KV pool gets what the memory budget leaves after the weights and an activation reserve, unless
// --kv-cache-memory names its size. `f` must outlive `so`'s hooks.
void set_engine_backend(ServeOptions& so, const BackendFlags& f);

// The tokenizer of the model in `dir` for `command` ("run", "eval niah"), after its config.json is checked (so a
// wrong directory is reported as by the other commands).
Tokenizer load_model_tokenizer(const std::string& dir, const std::string& command);

}  // namespace megactx
