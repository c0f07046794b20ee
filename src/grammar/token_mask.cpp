// token_mask.h: the vocabulary's byte trie, built once, and the mask walk over it.
#include "grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <fmt/format.h>
#include <numeric>

namespace megactx::grammar {

int64_t TokenMask::count() const {
    int64_t n = 0;
    for (uint64_t w : words) n += std::popcount(w);
    return n;
}

TokenVocab::TokenVocab(const std::vector<std::string>& token_bytes, std::vector<int32_t> stop_ids)
    : n_tokens_(token_bytes.size()), bytes_(token_bytes), stop_ids_(std::move(stop_ids)) {
    for (const int32_t id : stop_ids_)
        if (id < 0 || static_cast<size_t>(id) >= n_tokens_)
            throw GrammarError(fmt::format("token masks: stop token {} outside the vocabulary of {}", id, n_tokens_));
    // The ids in byte order: a trie's depth-first order visits them so; stop tokens are not matched as bytes.
    std::vector<int32_t> order;
    for (size_t i = 0; i < n_tokens_; ++i)
        if (!bytes_[i].empty() && std::find(stop_ids_.begin(), stop_ids_.end(), static_cast<int32_t>(i)) == stop_ids_.end())
            order.push_back(static_cast<int32_t>(i));
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)];
    });
    token_ids_.reserve(order.size());
    // build(lo, hi, depth): the node whose prefix the ids order[lo, hi) share, `depth` bytes long.
    const auto build = [&](auto& self, size_t lo, size_t hi, size_t depth, uint8_t byte) -> void {
        const auto me = static_cast<uint32_t>(nodes_.size());
        nodes_.push_back(Node{byte, 0, static_cast<uint32_t>(token_ids_.size()), 0});
        while (lo < hi && bytes_[static_cast<size_t>(order[lo])].size() == depth) {  // tokens ending here come first
            token_ids_.push_back(order[lo++]);
            ++nodes_[me].n_tokens;
        }
        while (lo < hi) {
            const auto c = static_cast<uint8_t>(bytes_[static_cast<size_t>(order[lo])][depth]);
            size_t e = lo;
            while (e < hi && static_cast<uint8_t>(bytes_[static_cast<size_t>(order[e])][depth]) == c) ++e;
            self(self, lo, e, depth + 1, c);
            lo = e;
        }
        nodes_[me].end = static_cast<uint32_t>(nodes_.size());
    };
    build(build, 0, order.size(), 0, 0);
}

void TokenVocab::walk(uint32_t node, Matcher& m, TokenMask& out) const {
    const ByteSet allowed = m.allowed();
    for (uint32_t c = node + 1; c < nodes_[node].end; c = nodes_[c].end) {
        const Node& n = nodes_[c];
        if (!allowed.has(n.byte)) continue;
        m.advance(n.byte);  // allowed: it succeeds
        for (uint32_t t = 0; t < n.n_tokens; ++t) out.set(token_ids_[n.first_token + t]);
        if (n.end > c + 1) walk(c, m, out);
        m.rollback(1);
    }
}

bool MaskCache::find(uint64_t key, TokenMask& out) {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) {
        ++misses_;
        return false;
    }
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second);
    out.words = it->second->second;
    return true;
}

void MaskCache::insert(uint64_t key, const TokenMask& mask) {
    if (max_masks_ == 0) return;
    const std::lock_guard<std::mutex> lock(mu_);
    if (by_key_.count(key) != 0) return;  // another request computed it meanwhile: the same mask
    if (by_key_.size() >= max_masks_) {
        by_key_.erase(lru_.back().first);
        lru_.pop_back();
    }
    lru_.emplace_front(key, mask.words);
    by_key_.emplace(key, lru_.begin());
}

size_t MaskCache::size() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return by_key_.size();
}

int64_t MaskCache::hits() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return hits_;
}

int64_t MaskCache::misses() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return misses_;
}

void TokenVocab::fill_mask(Matcher& m, TokenMask& out, MaskCache* cache) const {
    if (cache == nullptr) {
        fill_mask(m, out);
        return;
    }
    const uint64_t key = m.state_key();
    if (cache->find(key, out) && out.words.size() == (n_tokens_ + 63) / 64) return;
    fill_mask(m, out);
    cache->insert(key, out);
}

void TokenVocab::fill_mask(Matcher& m, TokenMask& out) const {
    out.reset(n_tokens_);
    walk(0, m, out);
    if (m.accepting())
        for (const int32_t id : stop_ids_) out.set(id);
}

}  // namespace megactx::grammar
