// Where each KV block lives when the cache has a host tier (design.md §5): the bookkeeping of the two tiers,
// with no memory of its own (KvCache moves the rows). Blocks are the allocator's logical ids; a block in use or
// cached occupies one frame, a device frame d or a host frame h, written as loc = d or loc = −(h + 1). Frames and
// logical blocks are equally many, so a block the allocator hands out always finds a frame.
//
// The device tier is a hot set kept by recency of selection: every step the model counts, per block, the rows
// sparse attention selected (Ops::kv_resolve); blocks selected this step are stamped, and the host blocks
// selected most, among those selected in the step before too, are promoted into the device frames of the least
// recently selected device blocks (at most `max_promotions` a step, fewer while promotions go unread: below). A
// fresh block takes a free device frame, else the frame of a device block not selected this step (which moves to
// the host), else a host frame: the newest tokens, which attention selects most, start on the device and new KV
// is written where it stays.
//
// Promotion back-off: a promotion costs a block copied up and one copied down, and pays only if the block is read
// again. Each step checks the blocks the step before promoted: when fewer than half of them were selected again,
// the per-step limit halves (down to 1, which keeps probing); when at least half were, it doubles back up to
// `max_promotions`. At the limit of 1 the probes space out: each single promotion not read again doubles the steps
// until the next (up to 32), and one that is read brings them back to every step. A selection that moves every
// step (each block selected in two steps, then never) then costs a wasted promotion every 32 steps instead of
// `max_promotions` a step (each is a block's rows of every layer copied up and another's copied down: 3.3 MB
// each way for GLM-5.2's 78 layers in FP8).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

namespace megactx {

struct TierMove {
    int32_t block;
    int32_t from, to;  // locations; kTierStaging + s = block s of the device pool's staging rows (a swap's middle)
};

constexpr int32_t kTierNowhere = std::numeric_limits<int32_t>::min();  // a free block: no frame
constexpr int32_t kTierStaging = std::numeric_limits<int32_t>::min() + 1;

struct TierStats {
    int64_t device_rows = 0, host_rows = 0;  // selected rows (× layers reading them) found on the device / host
    int64_t promotions = 0, demotions = 0;   // blocks moved up / down
    int64_t promotions_unread = 0;           // promoted blocks the next step did not select
};

class KvTiers {
  public:
    // n_staging: the blocks the staging rows hold, the swaps one end_step can make when the host tier is full.
    KvTiers(int64_t n_device, int64_t n_host, int64_t max_promotions = 32, int64_t n_staging = 1);

    int64_t n_device() const { return n_device_; }
    int64_t n_host() const { return n_host_; }
    int64_t n_blocks() const { return n_device_ + n_host_; }
    int64_t device_used() const { return n_device_ - static_cast<int64_t>(free_device_.size()); }
    int64_t host_used() const { return n_host_ - static_cast<int64_t>(free_host_.size()); }
    const std::vector<int32_t>& loc() const { return loc_; }
    const TierStats& stats() const { return stats_; }
    int64_t promotion_limit() const { return limit_; }  // promotions the next end_step may make (back-off above)

    // `block`'s content was discarded and it is about to be written: gives it a frame. Returns the moves to make
    // first (a demotion), in order.
    std::vector<TierMove> place(int32_t block);
    // `block` is free: its frame is released.
    void drop(int32_t block);
    // The end of a step: `hits[b]` rows were selected from block b. Returns the moves that bring the most
    // selected host blocks to the device, in order, in three phases — blocks out of their device frames (to free
    // host frames or to staging), blocks into device frames, staged blocks into the host frames just vacated —
    // so that a backend copies each phase's blocks at once.
    std::vector<TierMove> end_step(const std::vector<int32_t>& hits);

  private:
    void stamp(int32_t block);
    // Takes the device frame of the least recently used device block, if it was not used this step, moving the
    // block (`out`) to a free host frame, or when none is free and `back` is given, through staging block
    // `n_swaps` to `swap_with`'s host frame (`back`; the caller moves swap_with up). Returns the frame, or -1.
    int32_t take_cold_device(std::vector<TierMove>& out, std::vector<TierMove>* back, int32_t swap_with,
                             int64_t n_swaps);

    int64_t n_device_, n_host_, max_promotions_, n_staging_;
    std::vector<int32_t> loc_;
    std::vector<int64_t> stamp_;
    // (stamp, block) of device-resident blocks, oldest first: every entry is pushed with the current stamp, so the
    // queue stays in stamp order without sorting. A block re-stamped, dropped or moved down leaves a stale entry,
    // skipped when it reaches the front and swept when the queue doubles. (A std::set of the same pairs cost
    // ~0.4 ms a step at 1M tokens: ~2,000 selected device blocks re-stamped, each an erase and an insert.)
    std::deque<std::pair<int64_t, int32_t>> device_lru_;
    std::vector<int64_t> queued_;  // the stamp of a block's live device_lru_ entry, -1: none
    void push_lru(int32_t block);
    bool live(const std::pair<int64_t, int32_t>& e) const;
    std::vector<int32_t> free_device_, free_host_;  // stacks; lowest frames first
    int64_t now_ = 1;
    int64_t limit_;                       // the backed-off promotion limit, 1..max_promotions_
    // At the limit of 1, steps between probes: doubles (up to kMaxProbeGap) each time a single promotion is not
    // read again, back to 1 when a promotion is; no promotion before step next_probe_.
    static constexpr int64_t kMaxProbeGap = 32;
    int64_t probe_gap_ = 1, next_probe_ = 0;
    std::vector<int32_t> promoted_last_;  // the blocks the last end_step promoted
    TierStats stats_;
};

}  // namespace megactx
