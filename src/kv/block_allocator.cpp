#include "kv/block_allocator.h"

#include <xxhash.h>

#include "core/error.h"

namespace megactx {

uint64_t block_hash(uint64_t parent, const int32_t* tokens, int64_t n_tokens) {
    const uint64_t h = XXH3_64bits_withSeed(tokens, static_cast<size_t>(n_tokens) * sizeof(int32_t), parent);
    return h == 0 ? 1 : h;  // 0 means "not published"
}

BlockAllocator::BlockAllocator(int64_t n_blocks)
    : refs_(static_cast<size_t>(n_blocks), 0),
      lru_pos_(static_cast<size_t>(n_blocks)),
      hash_of_(static_cast<size_t>(n_blocks), 0) {
    MEGACTX_CHECK(n_blocks > 0, "KV cache must have at least one block");
    for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

void BlockAllocator::check(int32_t block) const {
    MEGACTX_CHECK(block >= 0 && block < n_blocks(), "KV block {} does not exist ({} blocks)", block, n_blocks());
}

int32_t BlockAllocator::allocate() {
    int32_t b;
    if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
    } else {
        MEGACTX_CHECK(!lru_.empty(), "KV cache is full: all {} blocks are in use", refs_.size());
        b = lru_.front();
        lru_.pop_front();
        by_hash_.erase(hash_of_[static_cast<size_t>(b)]);
        hash_of_[static_cast<size_t>(b)] = 0;
    }
    refs_[static_cast<size_t>(b)] = 1;
    if (fresh_) fresh_(b);
    return b;
}

void BlockAllocator::retain(int32_t block) {
    check(block);
    const auto i = static_cast<size_t>(block);
    if (refs_[i] == 0) {
        MEGACTX_CHECK(hash_of_[i] != 0, "retain of free KV block {}", block);
        lru_.erase(lru_pos_[i]);
    }
    ++refs_[i];
}

void BlockAllocator::release(int32_t block) {
    check(block);
    const auto i = static_cast<size_t>(block);
    MEGACTX_CHECK(refs_[i] > 0, "release of unreferenced KV block {}", block);
    if (--refs_[i] > 0) return;
    if (hash_of_[i] != 0) {
        lru_pos_[i] = lru_.insert(lru_.end(), block);
    } else {
        free_.push_back(block);
        if (freed_) freed_(block);
    }
}

std::optional<int32_t> BlockAllocator::lookup(uint64_t hash) const {
    const auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) return std::nullopt;
    return it->second;
}

void BlockAllocator::publish(int32_t block, uint64_t hash) {
    check(block);
    const auto i = static_cast<size_t>(block);
    MEGACTX_CHECK(refs_[i] > 0, "publish of unreferenced KV block {}", block);
    if (hash_of_[i] != 0 || by_hash_.count(hash)) return;
    hash_of_[i] = hash;
    by_hash_.emplace(hash, block);
}

}  // namespace megactx
