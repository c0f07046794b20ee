// Paged KV blocks (design.md §5) with prefix caching. A block id addresses one 64-token range in every
// layer's pools — MLA latent rows and, on full layers, indexer keys — so a cached block carries both and
// both are evicted together.
//
// Blocks are reference-counted. A full block can be published under the chained content hash of the
// tokens up to its end; later sequences with the same prefix look the hash up and share the block. When its
// last reference goes, a published block stays cached (LRU) until a fresh block is needed and none is free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace megactx {

// Chained content hash of one block: parent is the previous block's hash (0 for the first block).
uint64_t block_hash(uint64_t parent, const int32_t* tokens, int64_t n_tokens);

class BlockAllocator {
public:
    explicit BlockAllocator(int64_t n_blocks);

    // A block with refcount 1: a free one, else the least recently used cached one (evicting its content).
    // Throws Error when every block is referenced.
    int32_t allocate();
    // Adds a reference; revives a cached block with no references.
    void retain(int32_t block);
    // Drops one reference; at zero a published block becomes cached, any other becomes free.
    void release(int32_t block);

    // The block holding the content with this chained hash, if cached or in use.
    std::optional<int32_t> lookup(uint64_t hash) const;
    // Declares that `block` is full and holds the content with this hash (no-op if the hash is known).
    void publish(int32_t block, uint64_t hash);

    int64_t n_blocks() const { return static_cast<int64_t>(refs_.size()); }
    // Blocks that allocate() can hand out now: free plus cached-unreferenced.
    int64_t n_available() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
    int64_t n_used() const { return n_blocks() - n_available(); }
    int64_t n_cached() const { return static_cast<int64_t>(lru_.size()); }
    int32_t refcount(int32_t block) const { return refs_.at(static_cast<size_t>(block)); }

    // Tiered KV (kv_tiers.h): `fresh` sees each block allocate() hands out (its content discarded) before it is
    // returned, `freed` each block that becomes free (a published block that loses its last reference is cached,
    // not freed).
    void set_hooks(std::function<void(int32_t)> fresh, std::function<void(int32_t)> freed) {
        fresh_ = std::move(fresh);
        freed_ = std::move(freed);
    }

private:
    void check(int32_t block) const;

    std::vector<int32_t> refs_;
    std::vector<int32_t> free_;  // a stack; lowest ids are handed out first
    std::list<int32_t> lru_;     // cached blocks with no references, least recently used first
    std::vector<std::list<int32_t>::iterator> lru_pos_;
    std::vector<uint64_t> hash_of_;  // 0 = not published
    std::unordered_map<uint64_t, int32_t> by_hash_;
    std::function<void(int32_t)> fresh_, freed_;
};

}  // namespace megactx
