// The scheduling policy of one engine step (design.md §4): decode tokens first, then prefill chunks under a
// per-step token budget; admission control against free KV blocks; preemption of the newest request when a
// running one cannot grow. Policy only: it reads sequence state and the allocator and returns a plan; the
// engine carries it out.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "engine/sequence.h"
#include "kv/block_allocator.h"

namespace megactx {

struct SchedulerConfig {
    int64_t max_num_seqs = 64;
    int64_t max_num_batched_tokens = 2048;  // tokens per step (decode + prefill chunks)
};

struct ScheduledChunk {
    Sequence* seq;
    int64_t n_tokens;  // tokens to feed, starting at seq->n_computed (a decode: the last token, then drafts)
};

struct SchedulePlan {
    std::vector<ScheduledChunk> chunks;  // decode chunks first, then prefill chunks
    std::vector<Sequence*> preempted;    // running sequences to evict (KV freed, back to waiting)
    std::vector<Sequence*> admitted;     // waiting sequences that start running this step
};

// Blocks a sequence needs to hold `n_total` tokens, beyond those it has.
int64_t blocks_needed(const Sequence& s, int64_t n_total);

// What the prefix cache holds for a waiting sequence: its first n_blocks blocks, n_shared of which are
// currently referenced by other sequences (the rest are cached but unreferenced).
struct PrefixMatch {
    int64_t n_blocks = 0;
    int64_t n_shared = 0;
};

// running: in admission order; waiting: FIFO. An admitted sequence's first chunk starts after its prefix
// match, which the engine applies (retaining the matched blocks) before allocating anything.
SchedulePlan schedule(const SchedulerConfig& cfg, const std::vector<Sequence*>& running,
                      const std::deque<Sequence*>& waiting, const BlockAllocator& blocks,
                      const std::function<PrefixMatch(const Sequence&)>& prefix_match);

}  // namespace megactx
