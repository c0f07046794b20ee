#include "kv/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace megactx {

namespace {

int64_t latent_row_bytes(const ModelConfig& c, KvFormat f) {
    switch (f) {
        case KvFormat::F32:
            return c.d_latent() * 4;
        case KvFormat::BF16:
            return c.d_latent() * 2;
        case KvFormat::FP8:
            return fp8_latent_row_bytes(c.kv_lora_rank, c.qk_rope_head_dim);
    }
    return 0;
}

int64_t indexer_token_bytes(const ModelConfig& c, KvFormat f) {
    switch (f) {
        case KvFormat::F32:
            return c.d_indexer * 4;
        case KvFormat::BF16:
            return c.d_indexer * 2;
        case KvFormat::FP8:
            return fp8_indexer_block_bytes(c.d_indexer) / kFp8IndexerBlock;
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

KvTierBlocks kv_tier_blocks(const ModelConfig& c, KvFormat f, Range layers, int64_t device_bytes, int64_t host_bytes,
                            int64_t rows_per_pass, int64_t max_rows) {
    layers = all_if_empty(c, layers);
    int64_t latent = 0, indexer = 0;  // bytes per token over the layers
    for (int64_t l = layers.begin; l < layers.end; ++l) {
        latent += latent_row_bytes(c, f);
        indexer += c.is_full(l) ? indexer_token_bytes(c, f) : 0;
    }
    MEGACTX_CHECK(rows_per_pass >= 0 && max_rows >= 0, "KV tiers: {} staging rows per pass for {} rows a step",
                  rows_per_pass, max_rows);
    if (rows_per_pass == 0) {
        constexpr int64_t kMinRows = 8;
        const int64_t eighth = device_bytes / 8 / std::max<int64_t>(1, c.index_topk * latent);
        rows_per_pass = std::max(kMinRows, std::min(std::max(max_rows, kMinRows), eighth));
    }
    KvTierBlocks t;
    t.rows_per_pass = rows_per_pass;
    t.host = host_bytes / (kBlockSize * latent);
    const int64_t staging = t.host > 0 ? std::max(kBlockSize, rows_per_pass * c.index_topk) * latent : 0;
    const int64_t left = device_bytes - staging - t.host * kBlockSize * indexer;
    t.device = left > 0 ? left / (kBlockSize * (latent + indexer)) : 0;
    MEGACTX_CHECK(
        t.device >= 1,
        "--kv-cache-memory of {} bytes holds no device KV block ({} bytes per block, plus {} bytes of staging "
        "rows and {} bytes of indexer keys for the {} host blocks)",
        device_bytes, kBlockSize * (latent + indexer), staging, t.host * kBlockSize * indexer, t.host);
    return t;
}

KvCache::KvCache(Ops& ops, const ModelConfig& c, int64_t n_blocks, KvFormat format, Range layers,
                 const KvTierOptions& tier)
    : ops_(&ops), blocks_(n_blocks + tier.n_host_blocks), format_(format), layers_(all_if_empty(c, layers)) {
    static_assert(kBlockSize == kFp8IndexerBlock, "the FP8 indexer pages are the cache's blocks");
    MEGACTX_CHECK(layers_.begin >= 0 && layers_.end <= c.n_layers_total() && layers_.size() > 0,
                  "KV cache: layers [{}, {}) outside the model's {}", layers_.begin, layers_.end, c.n_layers_total());
    MEGACTX_CHECK(tier.n_host_blocks >= 0 && (tier.n_host_blocks == 0 || tier.rows_per_pass >= 1),
                  "KV cache: {} host blocks, {} rows per staging pass", tier.n_host_blocks, tier.rows_per_pass);
    const int64_t n_all = blocks_.n_blocks();
    latent_row_bytes_ = ::megactx::latent_row_bytes(c, format);
    // The device latent pool: the device tier's blocks, then (tiered) the staging rows.
    int64_t n_slots = n_blocks * kBlockSize;
    if (tier.n_host_blocks > 0) {
        rows_per_pass_ = tier.rows_per_pass;
        staging_base_ = n_slots;
        n_slots += std::max(kBlockSize, rows_per_pass_ * c.index_topk);
    }
    const auto latent_tensor = [&](int64_t rows, bool host) {
        const DType t = format == KvFormat::F32 ? DType::F32 : format == KvFormat::BF16 ? DType::BF16 : DType::F8_E4M3;
        const int64_t cols = format == KvFormat::FP8 ? latent_row_bytes_ : c.d_latent();
        return host ? ops.alloc_host(t, {rows, cols}) : ops.alloc(t, {rows, cols});
    };
    for (int64_t l = 0; l < c.n_layers_total(); ++l) {
        if (!owns(l)) {  // another rank's layer (LayerSplit)
            latent_.emplace_back();
            indexer_.emplace_back();
            host_latent_.emplace_back();
            continue;
        }
        latent_.push_back(latent_tensor(n_slots, false));
        host_latent_.push_back(tier.n_host_blocks > 0 ? latent_tensor(tier.n_host_blocks * kBlockSize, true)
                                                      : Tensor{});
        const int64_t n_index_slots = n_all * kBlockSize;  // indexer keys of every block stay on the device
        if (c.is_full(l)) {
            switch (format) {
                case KvFormat::F32:
                    indexer_.push_back(ops.alloc(DType::F32, {n_index_slots, c.d_indexer}));
                    break;
                case KvFormat::BF16:
                    indexer_.push_back(ops.alloc(DType::BF16, {n_index_slots, c.d_indexer}));
                    break;
                case KvFormat::FP8:
                    indexer_.push_back(ops.alloc(DType::F8_E4M3, {n_all, fp8_indexer_block_bytes(c.d_indexer)}));
                    break;
            }
        } else {
            indexer_.emplace_back();
        }
    }
    bytes_per_token_ = kv_bytes_per_token(c, format, layers_);
    if (tier.n_host_blocks > 0) {
        n_staging_blocks_ = std::max(kBlockSize, rows_per_pass_ * c.index_topk) / kBlockSize;
        tiers_ = std::make_unique<KvTiers>(n_blocks, tier.n_host_blocks, tier.max_promotions, n_staging_blocks_);
        tier_options_ = tier;
        blocks_.set_hooks(
            [this](int32_t b) {
                if (log_events_) events_.push_back({TierEvent::Kind::Place, b});
                apply(tiers_->place(b));
                dirty_ = true;  // b's location is new
            },
            [this](int32_t b) {
                if (log_events_) events_.push_back({TierEvent::Kind::Drop, b});
                tiers_->drop(b);
            });
        loc_ = ops.alloc(DType::I32, {n_all});
        hits_ = ops.alloc(DType::I32, {n_all});
        ops.zero(hits_);
        dirty_ = true;
        flush_tiers();
    }
}

KvCache::~KvCache() = default;

const KvTiers& KvCache::tiers() const {
    MEGACTX_CHECK(tiers_ != nullptr, "KV cache: no host tier");
    return *tiers_;
}

Tensor& KvCache::host_latent(int64_t i_layer) {
    Tensor& t = host_latent_.at(static_cast<size_t>(i_layer));
    MEGACTX_CHECK(t.data != nullptr, "KV cache: layer {} has no host tier here", i_layer);
    return t;
}

void KvCache::flush_tiers() {
    if (!dirty_) return;
    std::vector<int32_t> loc = tiers_->loc();
    for (int32_t& l : loc) l = l == kTierNowhere ? 0 : l;  // a free block is never selected
    ops_->upload(loc.data(), loc_);
    dirty_ = false;
}

void KvCache::end_step() {
    if (!tiers_) return;
    if (log_events_) events_.push_back({TierEvent::Kind::EndStep});
    std::vector<int32_t> hits(static_cast<size_t>(n_blocks()));
    ops_->download(hits_, hits.data());
    ops_->zero(hits_);  // on the stream: no second synchronisation and no host buffer of zeros
    apply(tiers_->end_step(hits));
}

void KvCache::replay_tier_events(const std::vector<TierEvent>& events) {
    MEGACTX_CHECK(tiers_ != nullptr || events.empty(), "KV cache: tier events for a cache without a host tier");
    for (const TierEvent& e : events) {
        switch (e.kind) {
            case TierEvent::Kind::Place:
                apply(tiers_->place(e.block));
                dirty_ = true;
                break;
            case TierEvent::Kind::Drop:
                tiers_->drop(e.block);
                break;
            case TierEvent::Kind::EndStep:
                end_step();
                break;
        }
    }
    flush_tiers();
}

// Moves run in order; consecutive moves that touch different frames go to the backend as one copy_blocks call
// (one launch on CUDA for every layer's copy of them), a move that reads or writes a frame an earlier move of the
// call writes or reads starts the next call.
void KvCache::apply(const std::vector<TierMove>& moves) {
    if (moves.empty()) return;
    const int64_t rb = latent_row_bytes();
    const auto address = [&](int32_t loc, int64_t l) -> uint8_t* {
        const bool staged = loc >= kTierStaging && loc < kTierStaging + n_staging_blocks_;
        Tensor& pool = loc >= 0 || staged ? latent_[static_cast<size_t>(l)] : host_latent_[static_cast<size_t>(l)];
        const int64_t row =
            staged ? staging_base_ + (loc - kTierStaging) * kBlockSize : (loc >= 0 ? loc : -(loc + 1)) * kBlockSize;
        return static_cast<uint8_t*>(pool.data) + row * rb;
    };
    std::vector<BlockCopy> copies;
    std::vector<int32_t> read, written;  // the frames of the moves in `copies`
    const auto flush = [&] {
        if (!copies.empty()) ops_->copy_blocks(copies);
        copies.clear();
        read.clear();
        written.clear();
    };
    const auto touches = [](const std::vector<int32_t>& v, int32_t loc) {
        return std::find(v.begin(), v.end(), loc) != v.end();
    };
    for (const TierMove& m : moves) {
        if (touches(written, m.from) || touches(read, m.to) || touches(written, m.to)) flush();
        for (int64_t l = layers_.begin; l < layers_.end; ++l)
            copies.push_back({address(m.from, l), address(m.to, l), rb * kBlockSize});
        read.push_back(m.from);
        written.push_back(m.to);
    }
    flush();
    dirty_ = true;
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
