#include "kv/kv_tiers.h"

#include <algorithm>

#include "core/error.h"

namespace megactx {

namespace {

int32_t host_loc(int32_t h) { return -(h + 1); }
int32_t host_frame(int32_t loc) { return -(loc + 1); }
bool on_device(int32_t loc) { return loc >= 0; }

}  // namespace

KvTiers::KvTiers(int64_t n_device, int64_t n_host, int64_t max_promotions, int64_t n_staging)
    : n_device_(n_device),
      n_host_(n_host),
      max_promotions_(max_promotions),
      n_staging_(std::max<int64_t>(n_staging, 1)),
      limit_(max_promotions) {
    MEGACTX_CHECK(n_device >= 0 && n_host >= 0 && n_device + n_host > 0, "KV tiers: {} device and {} host blocks",
                  n_device, n_host);
    loc_.assign(static_cast<size_t>(n_blocks()), kTierNowhere);
    stamp_.assign(static_cast<size_t>(n_blocks()), 0);
    queued_.assign(static_cast<size_t>(n_blocks()), -1);
    for (int64_t d = n_device - 1; d >= 0; --d) free_device_.push_back(static_cast<int32_t>(d));
    for (int64_t h = n_host - 1; h >= 0; --h) free_host_.push_back(static_cast<int32_t>(h));
}

void KvTiers::push_lru(int32_t block) {
    const auto i = static_cast<size_t>(block);
    if (queued_[i] == stamp_[i]) return;
    queued_[i] = stamp_[i];
    device_lru_.push_back({stamp_[i], block});
    if (static_cast<int64_t>(device_lru_.size()) > 2 * n_device_ + 64) {  // sweep the stale entries
        std::deque<std::pair<int64_t, int32_t>> kept;
        for (const auto& e : device_lru_)
            if (live(e)) kept.push_back(e);
        device_lru_.swap(kept);
    }
}

bool KvTiers::live(const std::pair<int64_t, int32_t>& e) const {
    const auto i = static_cast<size_t>(e.second);
    return on_device(loc_[i]) && stamp_[i] == e.first && queued_[i] == e.first;
}

void KvTiers::stamp(int32_t block) {
    stamp_[static_cast<size_t>(block)] = now_;
    if (on_device(loc_[static_cast<size_t>(block)])) push_lru(block);
}

int32_t KvTiers::take_cold_device(std::vector<TierMove>& out, std::vector<TierMove>* back, int32_t swap_with,
                                  int64_t n_swaps) {
    while (!device_lru_.empty() && !live(device_lru_.front())) device_lru_.pop_front();
    if (device_lru_.empty() || device_lru_.front().first >= now_) return -1;
    const int32_t a = device_lru_.front().second;
    const int32_t d = loc_[static_cast<size_t>(a)];
    if (!free_host_.empty()) {
        const int32_t h = free_host_.back();
        free_host_.pop_back();
        out.push_back({a, d, host_loc(h)});
        loc_[static_cast<size_t>(a)] = host_loc(h);
    } else if (back != nullptr && n_swaps < n_staging_) {  // a takes swap_with's host frame, through staging
        const int32_t h = loc_[static_cast<size_t>(swap_with)];
        const auto s = kTierStaging + static_cast<int32_t>(n_swaps);
        out.push_back({a, d, s});
        back->push_back({a, s, h});
        loc_[static_cast<size_t>(a)] = h;
    } else {
        return -1;
    }
    device_lru_.pop_front();
    queued_[static_cast<size_t>(a)] = -1;
    ++stats_.demotions;
    return d;
}

std::vector<TierMove> KvTiers::place(int32_t block) {
    MEGACTX_CHECK(block >= 0 && block < n_blocks(), "KV tiers: block {} of {}", block, n_blocks());
    const auto i = static_cast<size_t>(block);
    std::vector<TierMove> moves;
    if (loc_[i] == kTierNowhere) {
        if (!free_device_.empty()) {
            loc_[i] = free_device_.back();
            free_device_.pop_back();
        } else if (const int32_t d = take_cold_device(moves, nullptr, -1, 0); d >= 0) {
            loc_[i] = d;
        } else {
            MEGACTX_CHECK(!free_host_.empty(), "KV tiers: no free frame for block {}", block);
            loc_[i] = host_loc(free_host_.back());
            free_host_.pop_back();
        }
    }
    stamp(block);  // (queues a device block) a reused cached block keeps its frame
    return moves;
}

void KvTiers::drop(int32_t block) {
    const auto i = static_cast<size_t>(block);
    const int32_t l = loc_.at(i);
    MEGACTX_CHECK(l != kTierNowhere, "KV tiers: drop of block {}, which has no frame", block);
    if (on_device(l)) {
        queued_[i] = -1;  // its entry goes stale
        free_device_.push_back(l);
    } else {
        free_host_.push_back(host_frame(l));
    }
    loc_[i] = kTierNowhere;
}

std::vector<TierMove> KvTiers::end_step(const std::vector<int32_t>& hits) {
    MEGACTX_CHECK(static_cast<int64_t>(hits.size()) == n_blocks(), "KV tiers: {} hit counts for {} blocks", hits.size(),
                  n_blocks());
    // (−hits, block) of the host blocks selected in this step and the one before: a block selected once is not worth
    // a copy up and one down (a selection that moves every step would promote blocks never read again).
    std::vector<std::pair<int32_t, int32_t>> wanted;
    for (size_t b = 0; b < hits.size(); ++b) {
        if (hits[b] <= 0 || loc_[b] == kTierNowhere) continue;
        if (on_device(loc_[b])) {
            stats_.device_rows += hits[b];
        } else {
            stats_.host_rows += hits[b];
            if (stamp_[b] == now_ - 1) wanted.push_back({-hits[b], static_cast<int32_t>(b)});
        }
        stamp(static_cast<int32_t>(b));
    }
    std::sort(wanted.begin(), wanted.end());
    // The back-off: were the blocks promoted by the step before read in this one?
    if (!promoted_last_.empty()) {
        const auto n = static_cast<int64_t>(promoted_last_.size());
        int64_t read = 0;
        for (const int32_t b : promoted_last_) read += hits[static_cast<size_t>(b)] > 0;
        stats_.promotions_unread += n - read;
        if (2 * read < n) {
            if (limit_ == 1) probe_gap_ = std::min(kMaxProbeGap, 2 * probe_gap_);  // a single probe missed
            limit_ = std::max<int64_t>(1, limit_ / 2);
        } else {
            limit_ = std::min(max_promotions_, 2 * limit_);
            probe_gap_ = 1;
            next_probe_ = now_;
        }
        promoted_last_.clear();
    }
    // out: device frames emptied; in: host blocks moved up; back: staged blocks into the host frames vacated. A
    // host frame vacated this step is reused only by its swap partner (released after the step), so no phase reads
    // what an earlier move of the same phase writes.
    std::vector<TierMove> out, in, back;
    std::vector<int32_t> vacated;
    int64_t n_swaps = 0;
    const auto n_promote = now_ >= next_probe_ ? std::min<int64_t>(limit_, static_cast<int64_t>(wanted.size())) : 0;
    for (int64_t k = 0; k < n_promote; ++k) {
        const int32_t b = wanted[static_cast<size_t>(k)].second;
        const auto i = static_cast<size_t>(b);
        const int32_t h = loc_[i];
        int32_t d = -1;
        if (!free_device_.empty()) {
            d = free_device_.back();
            free_device_.pop_back();
            vacated.push_back(host_frame(h));
        } else {
            const size_t n_back = back.size();
            d = take_cold_device(out, &back, b, n_swaps);
            if (d < 0) break;  // every device block was selected this step, or the staging rows are full
            if (back.size() > n_back) {
                ++n_swaps;  // h now belongs to the block moved down
            } else {
                vacated.push_back(host_frame(h));
            }
        }
        in.push_back({b, h, d});
        loc_[i] = d;
        push_lru(b);
        promoted_last_.push_back(b);
        ++stats_.promotions;
    }
    free_host_.insert(free_host_.end(), vacated.begin(), vacated.end());
    if (!promoted_last_.empty()) next_probe_ = now_ + probe_gap_;
    ++now_;
    std::vector<TierMove> moves = std::move(out);
    moves.insert(moves.end(), in.begin(), in.end());
    moves.insert(moves.end(), back.begin(), back.end());
    return moves;
}

}  // namespace megactx
