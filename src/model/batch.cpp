#include "model/batch.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "kv/kv_cache.h"

namespace megactx {

void Batch::add_sequence(const std::vector<int32_t>* table, const int32_t* toks, int64_t count, int64_t pos0,
                         bool logits) {
    const auto s = static_cast<int32_t>(block_tables.size());
    block_tables.push_back(table);
    for (int64_t i = 0; i < count; ++i) {
        tokens.push_back(toks[i]);
        pos.push_back(static_cast<int32_t>(pos0 + i));
        seq.push_back(s);
        want_logits.push_back(logits);
    }
}

Batch slice_batch(const Batch& b, int64_t begin, int64_t end) {
    MEGACTX_CHECK(0 <= begin && begin <= end && end <= b.n_tokens(), "slice_batch: tokens [{}, {}) of {}", begin, end,
                  b.n_tokens());
    Batch out;
    const auto cut = [&](const auto& v) { return std::decay_t<decltype(v)>(v.begin() + begin, v.begin() + end); };
    out.tokens = cut(b.tokens);
    out.pos = cut(b.pos);
    out.seq = cut(b.seq);
    if (!b.want_logits.empty()) out.want_logits = cut(b.want_logits);
    out.block_tables = b.block_tables;
    out.pad_blocks = b.pad_blocks;
    out.want_hidden = b.want_hidden;
    return out;
}

std::vector<std::vector<int32_t>> BatchPlan::host_inputs(const Batch& b) {
    const int64_t n = b.n_tokens();
    MEGACTX_CHECK(b.pos.size() == static_cast<size_t>(n) && b.seq.size() == static_cast<size_t>(n),
                  "batch: tokens, positions and sequence ids must have the same length");
    std::vector<int32_t> offsets, flat, slots(static_cast<size_t>(n)), logit_rows;
    for (const auto* t : b.block_tables) {
        offsets.push_back(static_cast<int32_t>(flat.size()));
        if (b.pad_blocks > 0) {
            const size_t keep = std::min(t->size(), static_cast<size_t>(b.pad_blocks));
            flat.insert(flat.end(), t->begin(), t->begin() + static_cast<long>(keep));
            flat.resize(flat.size() + (static_cast<size_t>(b.pad_blocks) - keep), 0);
        } else {
            flat.insert(flat.end(), t->begin(), t->end());
        }
    }
    for (int64_t i = 0; i < n; ++i) {
        const auto& table = *b.block_tables.at(static_cast<size_t>(b.seq[i]));
        const int64_t blk = b.pos[i] / kBlockSize;
        MEGACTX_CHECK(b.pos[i] >= 0 && blk < static_cast<int64_t>(table.size()),
                      "batch: position {} is not covered by its sequence's block table", b.pos[i]);
        MEGACTX_CHECK(b.pad_blocks <= 0 || blk < b.pad_blocks, "batch: position {} is beyond the {} padded blocks",
                      b.pos[i], b.pad_blocks);
        slots[i] = table[blk] * static_cast<int32_t>(kBlockSize) + b.pos[i] % static_cast<int32_t>(kBlockSize);
        if (b.want_logits.empty() || b.want_logits[i]) logit_rows.push_back(static_cast<int32_t>(i));
    }
    return {b.tokens, b.pos, b.seq, std::move(slots), std::move(offsets), std::move(flat), std::move(logit_rows)};
}

BatchPlan::BatchPlan(Ops& ops, const Batch& b) {
    std::vector<std::vector<int32_t>> in = host_inputs(b);
    logit_rows = in[6];
    tokens = ops.upload_i32(in[0]);
    pos = ops.upload_i32(in[1]);
    seq = ops.upload_i32(in[2]);
    write_slots = ops.upload_i32(in[3]);
    table_offset = ops.upload_i32(in[4]);
    tables = ops.upload_i32(in[5]);
    logit_rows_dev = ops.upload_i32(in[6]);
    map.block_size = kBlockSize;
    map.pos = pos.i32();
    map.seq = seq.i32();
    map.table_offset = table_offset.i32();
    map.tables = tables.i32();
    map.n_seq = static_cast<int64_t>(b.block_tables.size());
    std::vector<int64_t> rows_of(static_cast<size_t>(map.n_seq), 0);
    for (const int32_t s : b.seq) map.max_seq_rows = std::max(map.max_seq_rows, ++rows_of.at(static_cast<size_t>(s)));
    for (const int32_t p : b.pos) map.max_context = std::max<int64_t>(map.max_context, p + 1);
    if (b.pad_blocks > 0) map.max_context = b.pad_blocks * kBlockSize;
}

}  // namespace megactx
