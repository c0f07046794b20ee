// indexer_topk composition (see indexer_topk.h): q quantisation, plan, logits and top-k per row group under a
// fixed scratch budget; the top-k writes slots (positions through the block tables). Shapes: q [n, H, 128], gates [n,
// H] (H = 32 or 64 heads), out_slots [n, topk]. Reference: CpuOps::indexer_topk (the same selection, in fp32 without
// FP8).
#include <algorithm>

#include "backend/cuda/indexer_common.cuh"
#include "backend/cuda/indexer_logits.h"
#include "backend/cuda/indexer_q_quant.h"
#include "backend/cuda/indexer_topk.h"
#include "backend/cuda/topk.h"

namespace megactx {

using namespace cuda_indexer;
using cuda::launch_topk;
using cuda::topk_grid_ctl;
using cuda::topk_scratch_bytes;
using cuda::topk_supported;
using cuda::TopkGridCtl;
using cuda::TopkParams;

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
int64_t score_stride(int64_t max_context) { return (max_context + kBlock - 1) / kBlock * kBlock; }

// Scratch carve-up for one row group of `rows` rows (q8 / w8 sized for 64 heads, the most the kernels take).
constexpr int64_t kMaxHeads = 2 * kHeads;
struct Layout {
    size_t q8, w8, plan, lengths, scores, topk, total;
};
Layout layout(int64_t rows, int64_t max_context, int64_t topk) {
    Layout l{};
    size_t at = 0;
    l.q8 = at, at += align_up(static_cast<size_t>(rows) * kMaxHeads * kDim);
    l.w8 = at, at += align_up(static_cast<size_t>(rows) * kMaxHeads * 4);
    l.plan = at, at += align_up(static_cast<size_t>(indexer_plan_ints(rows)) * 4);
    l.lengths = at, at += align_up(static_cast<size_t>(rows) * 4);
    l.scores = at, at += align_up(static_cast<size_t>(rows) * score_stride(max_context) * 4);
    l.topk = at, at += align_up(topk_scratch_bytes(rows, score_stride(max_context), topk));
    l.total = at;
    return l;
}

}  // namespace

size_t indexer_topk_scratch_bytes(int64_t max_rows_per_group, int64_t max_context, int64_t topk) {
    return layout(max_rows_per_group, max_context, topk).total;
}

bool indexer_topk_supported(int64_t n_head, int64_t d_indexer, int64_t block_size, int64_t topk, int64_t max_context) {
    return indexer_logits_supported(n_head, d_indexer, block_size) && indexer_q_quant_supported(n_head, d_indexer) &&
           topk_supported(topk, score_stride(max_context));
}

bool launch_indexer_topk(const IndexerTopkCudaParams& p, cudaStream_t stream) {
    if (p.n <= 0) return true;
    if (p.max_rows_per_group <= 0 || p.max_context <= 0 || !topk_supported(p.topk, score_stride(p.max_context)) ||
        (p.n_head != kHeads && p.n_head != kMaxHeads))
        return false;
    const int64_t h = p.n_head;
    const Layout l = layout(p.max_rows_per_group, p.max_context, p.topk);
    if (p.scratch_bytes < l.total) return false;
    auto* base = static_cast<uint8_t*>(p.scratch);
    auto* q8 = base + l.q8;
    auto* w8 = reinterpret_cast<float*>(base + l.w8);
    auto* plan = reinterpret_cast<int32_t*>(base + l.plan);
    auto* lengths = reinterpret_cast<int32_t*>(base + l.lengths);
    auto* scores = reinterpret_cast<float*>(base + l.scores);
    const int64_t stride = score_stride(p.max_context);
    for (int64_t r0 = 0; r0 < p.n; r0 += p.max_rows_per_group) {
        const int64_t r1 = std::min(p.n, r0 + p.max_rows_per_group), rows = r1 - r0;
        TopkParams tp;
        tp.values = scores;
        tp.lengths = lengths;
        tp.n_rows = rows;
        tp.row_stride = stride;
        tp.k = p.topk;
        tp.out_idx = p.out_slots + r0 * p.topk;
        tp.slots.seq = p.seq;  // positions → slots as the top-k writes them
        tp.slots.table_offset = p.table_offset;
        tp.slots.tables = p.tables;
        tp.slots.row_begin = r0;
        tp.slots.block = kBlock;
        tp.scratch = base + l.topk;
        tp.scratch_bytes = l.total - l.topk;
        // When the top-k's few-rows select will run (decode): the plan kernel (or, with one row per sequence, the
        // quantisation) zeroes the select's control words and the scores kernel adds up its first histogram, which
        // saves the select a launch and a grid-wide barrier.
        const TopkGridCtl gc = p.reduce_scores == nullptr ? topk_grid_ctl(tp) : TopkGridCtl{};

        IndexerQQuantParams qq;
        qq.q = p.q + r0 * h * kDim;
        qq.gates = p.gates + r0 * h;
        qq.n = rows;
        qq.n_head = h;
        qq.head_scale = p.head_scale;
        qq.softmax_scale = p.softmax_scale;
        qq.q8 = q8;
        qq.w8 = w8;
        qq.hadamard_scale = p.hadamard_scale;
        // Decode (no two rows of one sequence): the quantisation also writes the plan, the row lengths and the
        // select's zeroed control words, and the plan kernel's launch is saved.
        const bool one_row_each = p.max_seq_rows == 1;
        if (one_row_each) {
            qq.pos = p.pos;
            qq.seq = p.seq;
            qq.table_offset = p.table_offset;
            qq.row_begin = r0;
            qq.plan = plan;
            qq.lengths = lengths;
            qq.zero = gc.ctl;
            qq.zero_n = gc.n_ints;
        }
        launch_indexer_q_quant(qq, stream);
        if (!one_row_each) {
            IndexerPlanParams pp;
            pp.pos = p.pos;
            pp.seq = p.seq;
            pp.row_begin = r0;
            pp.row_end = r1;
            pp.plan = plan;
            pp.lengths = lengths;
            pp.table_offset = p.table_offset;
            pp.zero = gc.ctl;
            pp.zero_n = gc.n_ints;
            launch_indexer_plan(pp, stream);
        }

        // q8/w8 hold only this group's rows; the logits kernel indexes them by absolute row, so shift the base.
        IndexerLogitsParams lp;
        lp.q8 = q8 - r0 * h * kDim;
        lp.w8 = w8 - r0 * h;
        lp.n_head = static_cast<int16_t>(h);
        lp.pool = p.pool;
        lp.pool_blocks = p.pool_blocks;
        lp.pos = p.pos;
        lp.seq = p.seq;
        lp.table_offset = p.table_offset;
        lp.tables = p.tables;
        lp.row_begin = r0;
        lp.row_end = r1;
        lp.n_seq = p.n_seq;
        lp.max_seq_rows = static_cast<int32_t>(std::min<int64_t>(p.max_seq_rows, INT32_MAX));
        lp.max_context = p.max_context;
        lp.out = scores;
        lp.out_stride = stride;
        lp.plan = plan;
        lp.kernel = static_cast<int16_t>(p.logits_kernel);
        const IndexerLogitsHist hist{gc.hist0, gc.row_stride};
        bool hist_done = false;
        const int ran = launch_indexer_logits(lp, stream, gc.ctl != nullptr ? &hist : nullptr, &hist_done);
        if (p.logits_kernel == 3 && ran == 2) return false;  // kernel 3 refused: no silent change of sum order
        if (p.reduce_scores) p.reduce_scores(p.reduce_ctx, scores, rows * stride);
        tp.grid_prepared = gc.ctl == nullptr ? 0 : hist_done ? 2 : 1;
        launch_topk(tp, stream);
    }
    return cudaGetLastError() == cudaSuccess;
}

}  // namespace megactx
