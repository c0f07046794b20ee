// token_mask.h: the vocabulary's byte trie, built once, and the mask walk over it.
#include "grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <fmt/format.h>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

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
        nodes_.push_back(Node{byte, static_cast<uint32_t>(depth), 0, static_cast<uint32_t>(token_ids_.size()), 0});
        max_depth_ = std::max(max_depth_, depth);
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

namespace {

// The keyed walk gives up (and the plain walk runs) past this many distinct states: its transition table holds 256
// entries per state, and a grammar whose states never repeat gains nothing from it.
constexpr size_t kMaxWalkStates = 4096;
constexpr uint32_t kUnknown = ~uint32_t{0};

}  // namespace

// The trie walk over matcher states identified by Matcher::state_key() rather than over the matcher itself: where
// the grammar loops (a JSON string's body), nearly every byte leads back to a state seen before, so a transition
// already taken is a table look-up instead of an Earley step, and the walk is a linear scan of the trie that skips
// the subtrees of refused bytes. The matcher is advanced only to explore a new transition, lazily along the current
// trie path, and rolled back as the scan leaves the path. Equal keys mean equal futures, so a state's allowed bytes
// and transitions stand for every path that reaches it. False (with `m` as it was): too many states, `out` is
// incomplete.
bool TokenVocab::walk_by_state(Matcher& m, TokenMask& out) const {
    std::vector<ByteSet> allowed;  // per state
    std::vector<uint32_t> next;    // next[state * 256 + byte]: the state after the byte, or kUnknown
    std::unordered_map<uint64_t, uint32_t> by_key;
    std::vector<uint32_t> state_at(max_depth_ + 1);  // the state after the first d bytes of the current path
    std::vector<uint8_t> path(max_depth_ + 1);
    size_t synced = 0;  // m has read path[0 .. synced) past where the walk began
    const auto intern = [&]() -> uint32_t {
        const auto [it, fresh] = by_key.emplace(m.state_key(), static_cast<uint32_t>(allowed.size()));
        if (fresh) {
            allowed.push_back(m.allowed());
            next.resize(next.size() + 256, kUnknown);
        }
        return it->second;
    };
    state_at[0] = intern();
    for (uint32_t i = 1; i < nodes_.size();) {
        const Node& n = nodes_[i];
        const uint32_t d = n.depth;
        const uint32_t from = state_at[d - 1];
        if (!allowed[from].has(n.byte)) {
            i = n.end;
            continue;
        }
        for (uint32_t t = 0; t < n.n_tokens; ++t) out.set(token_ids_[n.first_token + t]);
        if (n.end == i + 1) {
            ++i;
            continue;
        }
        if (synced >= d) {  // the matcher read a sibling path: back to this node's parent
            m.rollback(synced - (d - 1));
            synced = d - 1;
        }
        path[d - 1] = n.byte;
        uint32_t& to = next[size_t{from} * 256 + n.byte];
        if (to == kUnknown) {
            for (; synced < d; ++synced)
                if (!m.advance(path[synced])) throw std::logic_error("TokenVocab: a state key misled the walk");
            const uint32_t s = intern();
            if (allowed.size() > kMaxWalkStates) {
                m.rollback(synced);
                return false;
            }
            next[size_t{from} * 256 + n.byte] = s;  // `to` may dangle: intern() grew `next`
        }
        state_at[d] = next[size_t{from} * 256 + n.byte];
        ++i;
    }
    m.rollback(synced);
    return true;
}

void TokenVocab::fill_mask(Matcher& m, TokenMask& out, MaskCache* cache) const {
    if (cache == nullptr) {
        fill_mask(m, out);
        return;
    }
    const uint64_t key = m.state_key();
    if (cache->find(key, out) && out.words.size() == (n_tokens_ + 63) / 64) return;
    out.reset(n_tokens_);
    if (!walk_by_state(m, out)) {
        out.reset(n_tokens_);
        walk(0, m, out);
    }
    if (m.accepting())
        for (const int32_t id : stop_ids_) out.set(id);
    cache->insert(key, out);
}

void TokenVocab::fill_mask(Matcher& m, TokenMask& out) const {
    out.reset(n_tokens_);
    walk(0, m, out);
    if (m.accepting())
        for (const int32_t id : stop_ids_) out.set(id);
}

}  // namespace megactx::grammar
