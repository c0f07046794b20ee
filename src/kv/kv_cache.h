// The KV pools of every layer (design.md §5): MLA latent rows for every layer, indexer keys only for full layers
// and the MTP layers, stored in one KvFormat (kv_format.h):
//   F32   latent [n_slots, d_latent] F32,  indexer [n_slots, d_indexer] F32
//   BF16  latent [n_slots, d_latent] BF16, indexer [n_slots, d_indexer] BF16
//   FP8   latent [n_slots, fp8_latent_row_bytes] F8_E4M3 (bytes), indexer [n_blocks, fp8_indexer_block_bytes]
//         F8_E4M3 (bytes, paged per 64-token block)
// slot = block_id · 64 + offset. A sequence's KV is its block table plus its token count.
#pragma once

#include <cstdint>
#include <vector>

#include "core/range.h"
#include "io/config.h"
#include "kv/block_allocator.h"
#include "kv/kv_format.h"
#include "ops/ops.h"

namespace megactx {

constexpr int64_t kBlockSize = 64;

class KvCache {
public:
    // `layers`: the layers whose pools this cache holds (LayerSplit: a rank's contiguous group); empty = all.
    KvCache(Ops& ops, const ModelConfig& config, int64_t n_blocks, KvFormat format = KvFormat::F32,
            Range layers = {});

    bool owns(int64_t i_layer) const { return layers_.contains(i_layer); }
    Range layers() const { return layers_; }
    Tensor& latent(int64_t i_layer);
    Tensor& indexer_keys(int64_t i_layer);
    BlockAllocator& blocks() { return blocks_; }
    int64_t n_blocks() const { return blocks_.n_blocks(); }
    KvFormat format() const { return format_; }
    // Bytes of KV per token across the held layers (latent rows plus indexer keys where present).
    int64_t bytes_per_token() const { return bytes_per_token_; }

private:
    BlockAllocator blocks_;
    std::vector<Tensor> latent_;   // per layer (decoder then MTP)
    std::vector<Tensor> indexer_;  // per layer; empty on shared layers
    int64_t bytes_per_token_ = 0;
    KvFormat format_ = KvFormat::F32;
    Range layers_;
};

// Bytes of KV per token across the layers `layers` (empty: all) of `config` in `format`.
int64_t kv_bytes_per_token(const ModelConfig& config, KvFormat format, Range layers = {});

// One sequence's view of the cache.
struct SeqKv {
    std::vector<int32_t> blocks;
    int64_t n_tokens = 0;  // tokens whose KV is written

    // Grows the block table to hold n_total tokens.
    void reserve(BlockAllocator& alloc, int64_t n_total);
    void free(BlockAllocator& alloc);
    int32_t slot(int64_t pos) const {
        return blocks[static_cast<size_t>(pos / kBlockSize)] * static_cast<int32_t>(kBlockSize) +
               static_cast<int32_t>(pos % kBlockSize);
    }
};

}  // namespace megactx
