#include "kv/kv_cache.h"

#include "core/error.h"

namespace megactx {

KvCache::KvCache(Ops& ops, const ModelConfig& c, int64_t n_blocks) : blocks_(n_blocks) {
    const int64_t n_slots = n_blocks * kBlockSize;
    for (int64_t l = 0; l < c.n_layers_total(); ++l) {
        latent_.push_back(ops.alloc(DType::F32, {n_slots, c.d_latent()}));
        bytes_per_token_ += c.d_latent() * 4;
        if (c.is_full(l)) {
            indexer_.push_back(ops.alloc(DType::F32, {n_slots, c.d_indexer}));
            bytes_per_token_ += c.d_indexer * 4;
        } else {
            indexer_.emplace_back();
        }
    }
}

Tensor& KvCache::indexer_keys(int64_t i_layer) {
    Tensor& t = indexer_.at(static_cast<size_t>(i_layer));
    MEGACTX_CHECK(t.data != nullptr, "layer {} is a shared-indexer layer and has no indexer cache", i_layer);
    return t;
}

void SeqKv::reserve(BlockAllocator& alloc, int64_t n_total) {
    while (static_cast<int64_t>(blocks.size()) * kBlockSize < n_total) blocks.push_back(alloc.allocate());
}

void SeqKv::free(BlockAllocator& alloc) {
    for (int32_t b : blocks) alloc.release(b);
    blocks.clear();
    n_tokens = 0;
}

}  // namespace megactx
