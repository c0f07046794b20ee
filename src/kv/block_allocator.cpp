#include "kv/block_allocator.h"

#include "core/error.h"

namespace megactx {

BlockAllocator::BlockAllocator(int64_t n_blocks) : refs_(static_cast<size_t>(n_blocks), 0) {
    for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int32_t BlockAllocator::allocate() {
    MEGACTX_CHECK(!free_.empty(), "KV cache is full: all {} blocks are in use", refs_.size());
    const int32_t b = free_.back();
    free_.pop_back();
    refs_[static_cast<size_t>(b)] = 1;
    return b;
}

void BlockAllocator::retain(int32_t block) {
    MEGACTX_CHECK(block >= 0 && block < n_blocks() && refs_[static_cast<size_t>(block)] > 0,
                  "retain of a free or unknown KV block {}", block);
    ++refs_[static_cast<size_t>(block)];
}

void BlockAllocator::release(int32_t block) {
    MEGACTX_CHECK(block >= 0 && block < n_blocks() && refs_[static_cast<size_t>(block)] > 0,
                  "release of a free or unknown KV block {}", block);
    if (--refs_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

}  // namespace megactx
