// The KV pools of every layer (design.md §5): MLA latent rows [n_slots, kv_lora_rank + qk_rope_head_dim]
// for every layer, indexer keys [n_slots, index_head_dim] only for full layers and the MTP layers.
// slot = block_id · 64 + offset. A sequence's KV is its block table plus its token count.
#pragma once

#include <cstdint>
#include <vector>

#include "io/config.h"
#include "kv/block_allocator.h"
#include "ops/ops.h"

namespace megactx {

constexpr int64_t kBlockSize = 64;

class KvCache {
public:
    KvCache(Ops& ops, const ModelConfig& config, int64_t n_blocks);

    Tensor& latent(int64_t i_layer) { return latent_.at(static_cast<size_t>(i_layer)); }
    Tensor& indexer_keys(int64_t i_layer);
    BlockAllocator& blocks() { return blocks_; }
    int64_t n_blocks() const { return blocks_.n_blocks(); }
    // Bytes of KV per token across all layers (latent rows plus indexer keys where present).
    int64_t bytes_per_token() const { return bytes_per_token_; }

private:
    BlockAllocator blocks_;
    std::vector<Tensor> latent_;   // per layer (decoder then MTP)
    std::vector<Tensor> indexer_;  // per layer; empty on shared layers
    int64_t bytes_per_token_ = 0;
};

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
