// The CUDA backend's entry point as plain C++ (no CUDA headers): code built without nvcc-only headers (the CLI,
// tests) creates CudaOps through this factory. Only available when MEGACTX_CUDA=ON (target megactx_cuda).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/ops.h"
#include "parallel/comm.h"

namespace megactx {

struct CudaOptions {
    int device = 0;
    int64_t memory_budget_bytes = 0;  // all device memory CudaOps may hold (weights, KV, activations); 0: no cap
    // Every GEMM in fp32 (bf16 / FP8 weights widened once, activations not rounded): the GPU then follows the
    // CPU oracle on any checkpoint, at fp32 GEMM speed and 2-4x weight memory. For tests and debugging.
    bool gemm_f32 = false;
    // FP8 checkpoints' GEMMs beyond the few-row GEMV as W8A8 (activations quantised per 1 × 128 group, e4m3 weights
    // read as they are; what vLLM and SGLang run). false: through a bf16 copy of each weight and bf16 activations
    // (3 bytes per weight on the device instead of 1, slower; for A/B). MEGACTX_FP8_GEMM=0 sets it false.
    bool fp8_gemm = true;
    // FP8 linears of at most this many rows take the GEMV (fp8_gemv.h: fp32 activations, CUDA cores), 0..8. From 3
    // rows on the W8A8 paths read the weight faster (H200, bench_gemm --decode-rows). MEGACTX_FP8_GEMV_MAX_ROWS.
    int fp8_gemv_max_rows = 2;
    // Above that and up to this many rows (0..16), W8A8 through the few-row tensor-core kernel (fp8_gemm_small.h)
    // instead of cuBLASLt, whose fixed cost and bandwidth at these row counts it beats. MEGACTX_FP8_GEMM_SMALL_MAX_ROWS.
    int fp8_gemm_small_max_rows = 16;
    // FP8 routed experts of a few tokens (up to 32) run either per choice (moe.h, fp32 activations) or grouped by
    // expert on the tensor cores (moe_fp8.h: each chosen expert read once, W8A8). 0 (default): per choice for 1-2
    // tokens; for 3-6 tokens whose choices could touch more experts than grouping pays for, inside a CUDA graph,
    // picked on the device from the step's distinct experts (a conditional graph node); else grouped (moe_plan.h).
    // N > 0: grouped from N tokens on; above 32 the grouped path is off. MEGACTX_MOE_FP8_MIN_TOKENS.
    int moe_fp8_min_tokens = 0;
    // The absorbed MLA's per-head products (q · W_UK, W_UV · latent) of at most this many tokens (0..16) read kv_b
    // as stored, FP8 or BF16, with fp32 activations (mla_heads.h); more tokens, or 0, take cuBLAS's batched GEMM
    // over a bf16 copy with bf16 activations. MEGACTX_MLA_HEADS_MAX_TOKENS.
    int mla_heads_max_tokens = 16;
    // Every row's result independent of the other rows of its batch (`--batch-invariant`; MEGACTX_BATCH_INVARIANT=1):
    // a token's logits are the same bits alone, as a row of a speculative verification, or inside a prefill chunk of
    // any size, so speculative = plain and a prefix-cache hit = a cold run hold token for token. Linears and MLA's
    // per-head products run invariant_gemm.h (fp32 activations, one fixed sum order per output); routed experts run
    // per (token, choice) (moe.h) in passes of at most 32 tokens; sparse MLA splits every token's selection in 8,
    // merged in split order, whatever the row count; the FP8 indexer scores every row with one kernel (3, which fails rather than fall back). The
    // default paths pick kernels, tilings and splits by the row count instead. Not with NCCL tensor parallelism,
    // whose sums are ordered by message size.
    bool batch_invariant = false;
};

struct CudaMemoryStats {
    int64_t reserved_bytes = 0;  // obtained from cudaMalloc (in use + cached free blocks)
    int64_t in_use_bytes = 0;    // held by live tensors and uploaded weights
    int64_t weight_bytes = 0;    // uploaded weights and norm vectors
    int64_t budget_bytes = 0;
    int64_t n_cuda_malloc = 0;  // cudaMalloc calls so far (flat in steady state)
};

std::unique_ptr<Ops> make_cuda_ops(const CudaOptions& options);
// Memory of an Ops made by make_cuda_ops (Error for any other backend).
CudaMemoryStats cuda_memory_stats(const Ops& ops);
// Per-op stream synchronisation (MEGACTX_CUDA_SYNC=1 at construction), switched at run time: while on, every op
// returns when its kernels have finished, so a ProfilingOps around it times each op's device work (bench_model
// --op-split). Error for any other backend.
void cuda_sync_each_op(Ops& ops, bool on);
// One NCCL communicator per rank (tensor parallel, parallel/comm.h) over CudaOps on distinct devices; the
// collectives run on each rank's CudaOps stream.
std::vector<std::unique_ptr<Comm>> make_nccl_comms(const std::vector<Ops*>& ops);

}  // namespace megactx
