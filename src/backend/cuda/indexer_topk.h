// indexer_topk: the whole DSA lightning-indexer op on the GPU (model-spec §3.2–3.3; IndexerTopkParams in
// src/ops/ops.h, here as raw device pointers over the paged FP8 key pool):
//   for row groups of ≤ max_rows_per_group tokens: quantise q (indexer_q_quant) → plan + scores
//   (indexer_logits) into scratch [rows, round_up(max_context, 64)] → top-k per row over t ≤ pos (topk.h)
//   writing positions → slots through the block table (TopkSlotMap), −1 padded. out_slots [n, topk] int32, in
//   position order (ties at the k-th score to the lowest positions: CpuOps::indexer_topk's selection, run-to-run
//   reproducible).
// Scratch is fixed by (max_rows_per_group, max_context, topk), never by chunk × context: CudaOps gives it 256 MiB
// and scores the most rows at once whose scores and top-k scratch fit (59 rows at 1M). In decode with one query per
// sequence, the query quantisation also writes the logits plan (every row its own group: no plan kernel runs) and
// zeroes the top-k's control words, and the scores kernel counts the select's first histogram as it writes the
// scores, so the select starts without an init kernel or a first grid barrier.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx {

struct IndexerTopkCudaParams {
    const float* q = nullptr;               // [n, n_head, 128] fp32, RoPE applied
    const float* gates = nullptr;           // [n, n_head] weights_proj output
    int64_t n_head = 32;                    // 32 (GLM-5.x) or 64 (DeepSeek-V3.2)
    const uint8_t* pool = nullptr;          // [n_blocks, 8448] paged FP8 indexer keys
    int64_t pool_blocks = 0;                // n_blocks (0: unknown)
    const int32_t* pos = nullptr;           // [n]
    const int32_t* seq = nullptr;           // [n]
    const int32_t* table_offset = nullptr;  // [n_seq]
    const int32_t* tables = nullptr;        // concatenated block tables (64-token blocks)
    int64_t n = 0, n_seq = 0;
    int64_t max_seq_rows = 0;  // optional: ≥ the tokens of any one sequence (tightens the logits grid)
    int64_t max_context = 0;   // ≥ pos[i] + 1 for every token
    float softmax_scale = 0;   // d_indexer^-0.5
    float head_scale = 0;      // n_head_indexer^-0.5
    int64_t topk = 2048;
    int64_t max_rows_per_group = 0;  // rows scored at once (scratch grows with it)
    int32_t* out_slots = nullptr;    // [n, topk]
    void* scratch = nullptr;
    size_t scratch_bytes = 0;
    // 0: the scoring kernel by shape (indexer_logits.h); 3 (32 heads) or 2 (64 heads): that kernel for every row
    // group, failing (false) where it cannot run instead of falling back to another kernel, whose sums over heads are
    // ordered differently (the batch-invariant mode).
    int logits_kernel = 0;
    // > 0: the keys were stored rotated (IndexerCacheWriteParams::hadamard_scale), so the queries are rotated the
    // same way before they are quantised (IndexerQQuantParams::hadamard_scale).
    float hadamard_scale = 0;
    // Optional: called on each row group's scores [rows, stride] fp32 (device) between scoring and selection,
    // e.g. to all-reduce partial scores of a head-split indexer on the same stream. Host function.
    void (*reduce_scores)(void* ctx, float* scores, int64_t count) = nullptr;
    void* reduce_ctx = nullptr;
};

size_t indexer_topk_scratch_bytes(int64_t max_rows_per_group, int64_t max_context, int64_t topk = 2048);
bool indexer_topk_supported(int64_t n_head, int64_t d_indexer, int64_t block_size, int64_t topk, int64_t max_context);
// Returns false (launching nothing) when the scratch is too small or the shape is unsupported.
bool launch_indexer_topk(const IndexerTopkCudaParams& p, cudaStream_t stream);

}  // namespace megactx
