// The ragged Batch (design.md §4): a flat list of tokens from several sequences, each with its position,
// plus each sequence's block table. Prefill chunks, decode steps and MTP steps are all Batches.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/ops.h"

namespace megactx {

struct Batch {
    std::vector<int32_t> tokens;                            // [n]
    std::vector<int32_t> pos;                               // [n] position in its sequence
    std::vector<int32_t> seq;                               // [n] index into block_tables
    std::vector<const std::vector<int32_t>*> block_tables;  // per sequence, covering every position in the batch
    std::vector<bool> want_logits;                          // [n] or empty = all tokens
    // > 0: fixed shapes for recorded graphs (graphed_forward.h): each block table is padded (or cut) to this many
    // entries and the plan's max_context is pad_blocks · block size, so a replay's inputs keep their sizes.
    int64_t pad_blocks = 0;
    // Pipeline stages: the last stage also returns every row's hidden state and top-k to rank 0 (what MTP drafting
    // reads; ForwardResult::hidden / topk), not only the logits. One stage computes them anyway.
    bool want_hidden = false;

    int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
    // Appends `count` consecutive tokens of one sequence starting at position `pos0`.
    void add_sequence(const std::vector<int32_t>* table, const int32_t* toks, int64_t count, int64_t pos0,
                      bool logits = true);
};

// Tokens [begin, end) of `b` as a batch of their own (the same block tables, sequence indices and padding).
Batch slice_batch(const Batch& b, int64_t begin, int64_t end);

// The batch moved into backend memory, with the slot of each token and the CacheMap the indexer reads.
struct BatchPlan {
    Tensor tokens, pos, seq, write_slots, table_offset, tables;  // int32
    CacheMap map;
    std::vector<int32_t> logit_rows;  // rows of the batch whose logits are computed
    Tensor logit_rows_dev;

    BatchPlan(Ops& ops, const Batch& b);
    // The host arrays the plan uploads, in upload order: tokens, pos, seq, write slots, table offsets, tables,
    // logit rows (what a graph replay of this batch's shape sends as OpsGraph::inputs).
    static std::vector<std::vector<int32_t>> host_inputs(const Batch& b);
};

}  // namespace megactx
