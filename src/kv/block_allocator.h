// Paged KV blocks (design.md §5): a block id addresses one 64-token range in every layer's pools.
// Blocks are reference-counted so sequences can share them (prefix caching builds on this).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace megactx {

class BlockAllocator {
public:
    explicit BlockAllocator(int64_t n_blocks);

    // A free block with refcount 1; throws Error when the cache is full.
    int32_t allocate();
    void retain(int32_t block);
    // Drops one reference; the block is free again at zero.
    void release(int32_t block);
    int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
    int64_t n_blocks() const { return static_cast<int64_t>(refs_.size()); }
    int32_t refcount(int32_t block) const { return refs_.at(static_cast<size_t>(block)); }

private:
    std::vector<int32_t> refs_;
    std::vector<int32_t> free_;  // a stack; lowest ids are handed out first
};

}  // namespace megactx
