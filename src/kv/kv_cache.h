// The KV pools of every layer (design.md §5): MLA latent rows for every layer, indexer keys only for full layers
// and the MTP layers, stored in one KvFormat (kv_format.h):
//   F32   latent [n_slots, d_latent] F32,  indexer [n_slots, d_indexer] F32
//   BF16  latent [n_slots, d_latent] BF16, indexer [n_slots, d_indexer] BF16
//   FP8   latent [n_slots, fp8_latent_row_bytes] F8_E4M3 (bytes), indexer [n_blocks, fp8_indexer_block_bytes]
//         F8_E4M3 (bytes, paged per 64-token block)
// slot = block_id · 64 + offset. A sequence's KV is its block table plus its token count.
//
// With a host tier (KvTierOptions::n_host_blocks > 0) block ids are logical: the indexer pools still hold every
// block on the device (they are read whole every step), but a block's latent rows live in one of two pools —
// the device pool [device blocks · 64 + staging rows] or the host pool [host blocks · 64] (Ops::alloc_host) —
// as KvTiers decides, and move between them between steps. The model reads them through KvResolveParams: the
// selected rows that are on the host are copied into the device pool's staging rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/range.h"
#include "io/config.h"
#include "kv/block_allocator.h"
#include "kv/kv_format.h"
#include "kv/kv_tiers.h"
#include "ops/ops.h"

namespace megactx {

struct KvTierOptions {
    int64_t n_host_blocks = 0;  // 0: one tier, every block on the device
    int64_t rows_per_pass = 8;  // query rows staged at once: the staging area holds rows_per_pass · index_topk rows
    int64_t max_promotions = 32;  // host blocks moved to the device per step at most
};

class KvCache {
public:
    // `layers`: the layers whose pools this cache holds (LayerSplit: a rank's contiguous group); empty = all.
    // n_blocks: the device tier's blocks (all blocks without a host tier).
    KvCache(Ops& ops, const ModelConfig& config, int64_t n_blocks, KvFormat format = KvFormat::F32,
            Range layers = {}, const KvTierOptions& tiers = {});
    ~KvCache();
    KvCache(const KvCache&) = delete;
    KvCache& operator=(const KvCache&) = delete;

    bool owns(int64_t i_layer) const { return layers_.contains(i_layer); }
    Range layers() const { return layers_; }
    Tensor& latent(int64_t i_layer);
    Tensor& indexer_keys(int64_t i_layer);
    BlockAllocator& blocks() { return blocks_; }
    const BlockAllocator& blocks() const { return blocks_; }
    int64_t n_blocks() const { return blocks_.n_blocks(); }  // both tiers

    // The host tier (all of these need tiered()).
    bool tiered() const { return tiers_ != nullptr; }
    const KvTiers& tiers() const;
    Tensor& host_latent(int64_t i_layer);
    const Tensor& tier_loc() const { return loc_; }  // [n_blocks] int32 in backend memory (KvResolveParams::loc)
    Tensor& tier_hits() { return hits_; }            // [n_blocks] int32, the rows selected since end_step
    int64_t staging_base() const { return staging_base_; }
    int64_t rows_per_pass() const { return rows_per_pass_; }
    // Block moves since the last flush have changed the locations the model reads: flush_tiers() uploads them
    // (before a forward, outside any graph recording).
    bool tiers_dirty() const { return dirty_; }
    void flush_tiers();
    // After the forwards of a step: reads the selection counts back (a host sync), clears them and moves the
    // most selected host blocks to the device. No-op without a host tier.
    void end_step();
    // Tensor parallelism: the followers' caches replay rank 0's tier events (kv_tiers.h), in order, before each
    // forward, so that every rank places and drops the same blocks at the same points and ends its steps where
    // rank 0 does; each rank then moves its own rows by its own selection counts (under LayerSplit each holds
    // other layers). Rank 0 logs once a group asks for it; the group clears the log when every follower has
    // replayed it.
    struct TierEvent {
        enum class Kind : uint8_t { Place, Drop, EndStep } kind;
        int32_t block = -1;  // Place, Drop
    };
    void log_tier_events() { log_events_ = true; }
    const std::vector<TierEvent>& tier_events() const { return events_; }
    void clear_tier_events() { events_.clear(); }
    void replay_tier_events(const std::vector<TierEvent>& events);
    const KvTierOptions& tier_options() const { return tier_options_; }
    // Bytes of one layer's latent row (what a fetched row costs).
    int64_t latent_row_bytes() const { return latent_row_bytes_; }
    KvFormat format() const { return format_; }
    // Bytes of KV per token across the held layers (latent rows plus indexer keys where present).
    int64_t bytes_per_token() const { return bytes_per_token_; }

private:
    void apply(const std::vector<TierMove>& moves);

    Ops* ops_;
    BlockAllocator blocks_;
    std::unique_ptr<KvTiers> tiers_;
    std::vector<Tensor> host_latent_;  // per layer, host tier only
    Tensor loc_, hits_;
    int64_t staging_base_ = 0, rows_per_pass_ = 0, latent_row_bytes_ = 0, n_staging_blocks_ = 0;
    bool dirty_ = false;
    KvTierOptions tier_options_;
    bool log_events_ = false;
    std::vector<TierEvent> events_;
    std::vector<Tensor> latent_;   // per layer (decoder then MTP)
    std::vector<Tensor> indexer_;  // per layer; empty on shared layers
    int64_t bytes_per_token_ = 0;
    KvFormat format_ = KvFormat::F32;
    Range layers_;
};

// Bytes of KV per token across the layers `layers` (empty: all) of `config` in `format`.
int64_t kv_bytes_per_token(const ModelConfig& config, KvFormat format, Range layers = {});

// Block counts of the two tiers for byte budgets: the host tier holds latent rows only, the device tier the
// latent rows of its blocks, the indexer keys of all blocks and the staging rows. Throws when the device budget
// holds no block.
//
// The staging rows hold the selections of rows_per_pass query rows: a step whose rows fit attends in one pass,
// its gathers overlapped with compute; a larger one (a prefill chunk, a wide decode batch) in passes of that many
// rows, each gathering and then attending. rows_per_pass > 0 fixes it; 0 sizes it: enough for max_rows query rows
// (the most a step holds), but at most what an eighth of the device budget stages, and at least 8.
struct KvTierBlocks {
    int64_t device = 0, host = 0;
    int64_t rows_per_pass = 0;  // the staging rows' query rows (KvTierOptions::rows_per_pass)
};
KvTierBlocks kv_tier_blocks(const ModelConfig& config, KvFormat format, Range layers, int64_t device_bytes,
                            int64_t host_bytes, int64_t rows_per_pass = KvTierOptions{}.rows_per_pass,
                            int64_t max_rows = 0);

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
