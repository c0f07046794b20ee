// indexer_logits: DSA lightning-indexer scores over the paged FP8 key cache (model-spec §3.2–3.3).
//   out[r, t] = k_scale(t) · Σ_h w8[i, h] · relu(q8[i, h, :] · k8(t, :))   for i = row_begin + r, t ≤ pos[i]
// q8/w8 come from indexer_q_quant; keys are read through the sequence's block table (CacheMap in src/ops/ops.h):
// slot(t) = tables[table_offset[seq[i]] + t / 64] · 64 + t % 64. Entries t > pos[i] of a row are NOT written:
// pass lengths = pos + 1 to the top-k (indexer_logits writes them when `lengths` is set).
//
// Plan, then run: launch_indexer_plan groups the rows [row_begin, row_end) into runs of at most 16 consecutive
// queries of one sequence (tokens of a sequence are contiguous in the batch) and records each group's block-table
// offset and largest position; the plan depends only on seq, pos and table_offset, so one plan serves every
// indexer layer of a step (build it with the table_offset the logits launch gets). launch_indexer_logits then
// reads each cached key once per group, so MTP verification (several queries per sequence) costs one pass.
// Three kernels: 1 = mma.sync m16n8k32 (keys in registers); 2 = wgmma m64nNk32 (sm_90a; pages streamed through a
// cp.async shared-memory ring, the group's queries' heads as N); 3 = wgmma, warp-specialised (sm_90a; a TMA producer
// and two math warpgroups per CTA: prefill, and MTP verification). 2 and 3 use programmatic dependent launch.
// kernel = 0 takes $MEGACTX_INDEXER_LOGITS_KERNEL if set, else kernel 3 for more than 8 queries per sequence and
// at least 16 rows (one full group) or for 3–4 queries per sequence (MTP verification; kernel 3 then splits
// the pages between its math warpgroups instead of the queries), and kernel 2 otherwise. Kernel 3 falls back to kernel
// 2 (with a one-time message on stderr) where it cannot run (its register plan or its tensor map is refused).
// Geometry: 32 heads (GLM-5.x) or 64 heads (DeepSeek-V3.2; kernel 2 for every shape, each query staged as two
// 32-head units whose sums are added before the store) × 128 dims, 64-token blocks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx {

// Passed by value to the kernels and kept within 128 bytes: at 136 bytes nvcc addressed the parameter as memory
// instead of loading its fields up front, and kernel 3 (prefill) ran 16% slower with identical PTX otherwise
// (1M context, 59 rows: 495 -> 572 us; 7bfb9ac, fixed in badccbb). indexer_logits.cu asserts the size.
struct IndexerLogitsParams {
    const uint8_t* q8 = nullptr;            // [n, n_head, 128] e4m3 (batch rows, indexed by the absolute row i)
    const float* w8 = nullptr;              // [n, n_head] folded head weights
    const uint8_t* pool = nullptr;          // [n_blocks, 8448] paged FP8 indexer cache
    int64_t pool_blocks = 0;                // n_blocks (0: unknown; kernel 3's tensor map then spans 2^31 rows)
    const int32_t* pos = nullptr;           // [n]
    const int32_t* seq = nullptr;           // [n]
    const int32_t* table_offset = nullptr;  // [n_seq]
    const int32_t* tables = nullptr;        // concatenated block tables
    int64_t row_begin = 0, row_end = 0;     // rows i0..i1 of the batch
    int64_t n_seq = 0;                      // sequences in the batch (bounds the number of groups)
    int64_t max_context = 0;                // ≥ pos[i] + 1 for every row in range
    float* out = nullptr;                   // [row_end - row_begin, out_stride]
    int64_t out_stride = 0;                 // ≥ max_context
    const int32_t* plan = nullptr;          // from launch_indexer_plan for the same rows
    int16_t kernel = 0;                     // 0: default, 1: mma.sync, 2: wgmma, 3: warp-specialised (sm_90a)
    int16_t n_head = 32;                    // 32, or 64 (kernel 2 only: any other request runs kernel 2)
    int32_t max_seq_rows = 0;               // optional: ≥ the rows of any one sequence in range (tightens that bound)
};

struct IndexerPlanParams {
    const int32_t* pos = nullptr;  // [n]
    const int32_t* seq = nullptr;  // [n]
    int64_t row_begin = 0, row_end = 0;
    int32_t* plan = nullptr;                // [indexer_plan_ints(row_end - row_begin)]
    int32_t* lengths = nullptr;             // optional [row_end - row_begin]: pos + 1 (top-k row lengths)
    const int32_t* table_offset = nullptr;  // optional [n_seq]: recorded per group (else the logits look it up)
    int* zero = nullptr;                    // optional: zero_n ints the kernel zeroes (a top-k's control words)
    int64_t zero_n = 0;
};

// Optional for launch_indexer_logits: round 0 of the decode top-k's radix select, added up while the scores are
// written (topk.h, TopkGridCtl): row i's scores go to bins[(i - row_begin) · row_stride + grid_bin0(float_key(s))],
// which must be zero before. Kernel 2 does it when every sequence has one row (decode); the return value says
// whether it did.
struct IndexerLogitsHist {
    int* bins = nullptr;
    int64_t row_stride = 0;
};

// Number of int32 the plan of n_rows rows occupies.
int64_t indexer_plan_ints(int64_t n_rows);
bool indexer_logits_supported(int64_t n_head, int64_t d_indexer, int64_t block_size);
// Launched with programmatic dependent launch: it may run alongside the previous kernel when that kernel triggers
// its dependents early (indexer_q_quant does), and it completes only after that kernel has completed. The previous
// kernel must not write pos / seq / table_offset.
void launch_indexer_plan(const IndexerPlanParams& p, cudaStream_t stream);
// Returns the kernel that ran (1, 2 or 3; 0 when there was nothing to score); with hist, *hist_done says whether
// the histogram was added up.
int launch_indexer_logits(const IndexerLogitsParams& p, cudaStream_t stream, const IndexerLogitsHist* hist = nullptr,
                          bool* hist_done = nullptr);

}  // namespace megactx
