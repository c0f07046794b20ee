#include "kv/kv_cache.h"

#include "core/error.h"

namespace megactx {

namespace {

int64_t latent_row_bytes(const ModelConfig& c, KvFormat f) {
    switch (f) {
        case KvFormat::F32: return c.d_latent() * 4;
        case KvFormat::BF16: return c.d_latent() * 2;
        case KvFormat::FP8: return fp8_latent_row_bytes(c.kv_lora_rank, c.qk_rope_head_dim);
    }
    return 0;
}

int64_t indexer_token_bytes(const ModelConfig& c, KvFormat f) {
    switch (f) {
        case KvFormat::F32: return c.d_indexer * 4;
        case KvFormat::BF16: return c.d_indexer * 2;
        case KvFormat::FP8: return fp8_indexer_block_bytes(c.d_indexer) / kFp8IndexerBlock;
    }
    return 0;
}

Range all_if_empty(const ModelConfig& c, Range layers) {
    return layers.size() > 0 ? layers : Range{0, c.n_layers_total()};
}

}  // namespace

int64_t kv_bytes_per_token(const ModelConfig& c, KvFormat f, Range layers) {
    layers = all_if_empty(c, layers);
    int64_t b = 0;
    for (int64_t l = layers.begin; l < layers.end; ++l) {
        b += latent_row_bytes(c, f) + (c.is_full(l) ? indexer_token_bytes(c, f) : 0);
    }
    return b;
}

KvCache::KvCache(Ops& ops, const ModelConfig& c, int64_t n_blocks, KvFormat format, Range layers)
    : blocks_(n_blocks), format_(format), layers_(all_if_empty(c, layers)) {
    static_assert(kBlockSize == kFp8IndexerBlock, "the FP8 indexer pages are the cache's blocks");
    MEGACTX_CHECK(layers_.begin >= 0 && layers_.end <= c.n_layers_total() && layers_.size() > 0,
                  "KV cache: layers [{}, {}) outside the model's {}", layers_.begin, layers_.end, c.n_layers_total());
    const int64_t n_slots = n_blocks * kBlockSize;
    for (int64_t l = 0; l < c.n_layers_total(); ++l) {
        if (!owns(l)) {  // another rank's layer (LayerSplit)
            latent_.emplace_back();
            indexer_.emplace_back();
            continue;
        }
        switch (format) {
            case KvFormat::F32: latent_.push_back(ops.alloc(DType::F32, {n_slots, c.d_latent()})); break;
            case KvFormat::BF16: latent_.push_back(ops.alloc(DType::BF16, {n_slots, c.d_latent()})); break;
            case KvFormat::FP8:
                latent_.push_back(ops.alloc(DType::F8_E4M3, {n_slots, latent_row_bytes(c, format)}));
                break;
        }
        if (c.is_full(l)) {
            switch (format) {
                case KvFormat::F32: indexer_.push_back(ops.alloc(DType::F32, {n_slots, c.d_indexer})); break;
                case KvFormat::BF16: indexer_.push_back(ops.alloc(DType::BF16, {n_slots, c.d_indexer})); break;
                case KvFormat::FP8:
                    indexer_.push_back(ops.alloc(DType::F8_E4M3, {n_blocks, fp8_indexer_block_bytes(c.d_indexer)}));
                    break;
            }
        } else {
            indexer_.emplace_back();
        }
    }
    bytes_per_token_ = kv_bytes_per_token(c, format, layers_);
}

Tensor& KvCache::latent(int64_t i_layer) {
    MEGACTX_CHECK(owns(i_layer), "layer {}'s KV is held by another rank (this cache holds layers {}..{})", i_layer,
                  layers_.begin, layers_.end - 1);
    return latent_.at(static_cast<size_t>(i_layer));
}

Tensor& KvCache::indexer_keys(int64_t i_layer) {
    MEGACTX_CHECK(owns(i_layer), "layer {}'s KV is held by another rank (this cache holds layers {}..{})", i_layer,
                  layers_.begin, layers_.end - 1);
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
