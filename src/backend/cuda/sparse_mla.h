// sparse_mla: absorbed ("MQA mode") sparse MLA attention over selected latent cache rows (model-spec §2.5).
// For token i, head h:  out[i,h,:] = Σ_j softmax_j(scale · q[i,h,:]·K[s_ij,:]) · K[s_ij, 0:512]
// over the token's selected slots s_ij = slots[i, j] (j < topk, -1 = unused). d_qk 576 = [q_abs 512 | q_pe 64],
// d_v 512. Queries fp32, rounded inside the kernel: to bf16 for BF16 caches; for FP8 caches the 512 latent dims to
// f16 (times a power of two when |q| > 2^15) and the 64 RoPE dims to bf16. Cache BF16 rows [n_slots, 576] or FP8
// 656-B rows (kv/kv_format.h); softmax and accumulation in fp32, out fp32. Decode and prefill are the same kernel.
// Implementation (sparse_mla.cu): one warp-specialised wgmma (sm_90a) kernel: a producer warpgroup streams the
// selected rows into shared memory (dequantising FP8), two consumer warpgroups run Q·Kᵀ, softmax and P·V.
// Plan, then run: sparse_mla_plan() picks the split of each token's slots over CTAs on the host (from n and the
// SM count) and the cluster size that merges the splits on chip; the run only launches (main kernel + a
// log-sum-exp combine when n_split / cluster > 1), so it can be captured in a CUDA graph. Scratch for the split
// partials is passed in (sparse_mla_scratch_bytes).
// Where the time goes (H200; the kernel's comments in sparse_mla.cu, numbers in docs/benchmarks.md): the producer
// warpgroup stages FP8 rows 0..31 of a 64-row chunk by cp.async (one warp instruction per 512-B row) and rows 32..63
// by one bulk copy per row, since two copy paths keep more bytes in flight than either alone. Its bound: an SM keeps
// only ~14.5 B/clock of these rows in flight, and the next chunk's copies wait for the consumers to free the tile
// they are staged in (Q and two tiles fill shared memory). With splits, a small kernel converts each token's Q once
// into the tile image that every split's CTA bulk-copies (the main kernel starts under PDL while it runs); for 2
// splits pairs of CTAs merge through distributed shared memory (more splits measured faster through the combine);
// FP8 caches pass f16 partials to the log-sum-exp combine; and when the split grid fills at most a quarter of the
// SMs (batch 1 with 64 heads: 32 CTAs), v_split 2 halves the partial each CTA stages and writes, the batch-1 step's
// largest cost after the combine. Measured and not kept: FP8 rows in a 3-deep ring dequantised into the register
// operands of Sᵀ = K·Qᵀ and Oᵀ = Vᵀ·Pᵀ, 1.28× slower at batch 128, bound by its N = 64 products (the code is in
// commit 2d854a3, bench/cuda/lab/sparse_mla_register_operand.patch); docs/benchmarks.md lists the other variants.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

enum class MlaCacheFormat { BF16, FP8 };

struct SparseMlaPlan {
    int n_split = 1;  // CTAs per (token, 64-head group); each takes a contiguous range of 64-slot chunks
    // CTAs per thread-block cluster (1, 2, 4, 8 or 16; divides n_split): a cluster merges its splits through
    // distributed shared memory, so only n_split / cluster partials per (token, head group) go through scratch and
    // the combine kernel (none when cluster == n_split). Reduced at launch to what the device can schedule.
    int cluster = 1;
    // CTAs per split that each produce 512 / v_split of the value dims (1 or 2; only with cluster == 1): they
    // share the split's slots, Q·Kᵀ and softmax (each computes them) and divide P·V and the epilogue, so a batch
    // that fills few SMs with splits (batch 1: 32 CTAs) spreads its per-CTA epilogue over more of them.
    int v_split = 1;
};

struct SparseMlaRunParams {
    const float* q = nullptr;        // [n, n_head, 576] fp32
    const void* cache = nullptr;     // BF16: [n_slots, 576] bf16; FP8: [n_slots, 656] bytes
    const int32_t* slots = nullptr;  // [n, topk] int32, -1 = unused
    float* out = nullptr;            // [n, n_head, 512] fp32
    void* scratch = nullptr;         // sparse_mla_scratch_bytes(n, n_head, plan) bytes (may be null when 0)
    MlaCacheFormat format = MlaCacheFormat::FP8;
    int64_t n = 0;
    int n_head = 64;                 // 64 or 128
    int topk = 2048;                 // multiple of 64
    float scale = 0.0625f;
    SparseMlaPlan plan;
};

bool sparse_mla_supported(int n_head, int topk);
// Host-only planning: the split that fills n_sm SMs for n tokens.
SparseMlaPlan sparse_mla_plan(int64_t n, int n_head, int topk, int n_sm);
// The cluster size a launch of this plan for n tokens uses on the current device: plan.cluster, halved until the
// device holds all of the grid's clusters at once.
int sparse_mla_launch_cluster(int64_t n, int n_head, const SparseMlaPlan& plan);
size_t sparse_mla_scratch_bytes(int64_t n, int n_head, const SparseMlaPlan& plan);
// Launches on `stream` (no host sync); returns cudaErrorInvalidValue when unsupported, else the launch error.
cudaError_t launch_sparse_mla(const SparseMlaRunParams& p, cudaStream_t stream);

}  // namespace megactx::cuda
