#include "engine/scheduler.h"

#include <algorithm>

namespace megactx {

int64_t blocks_needed(const Sequence& s, int64_t n_total) {
    const int64_t have = static_cast<int64_t>(s.kv.blocks.size());
    const int64_t need = (n_total + kBlockSize - 1) / kBlockSize;
    return std::max<int64_t>(need - have, 0);
}

SchedulePlan schedule(const SchedulerConfig& cfg, const std::vector<Sequence*>& running,
                      const std::deque<Sequence*>& waiting, const BlockAllocator& blocks,
                      const std::function<PrefixMatch(const Sequence&)>& prefix_match) {
    SchedulePlan plan;
    int64_t budget = cfg.max_num_batched_tokens;
    int64_t available = blocks.n_available();

    // Running sequences, oldest first; when one cannot grow, the newest are preempted.
    std::vector<Sequence*> live(running.begin(), running.end());
    auto preempt_at = [&](size_t j) {
        Sequence* v = live[j];
        plan.preempted.push_back(v);
        for (int32_t b : v->kv.blocks) available += blocks.refcount(b) == 1;  // shared blocks stay in use
        live.erase(live.begin() + static_cast<long>(j));
    };

    // 1. decode tokens (sequences with exactly one token left to feed)
    for (size_t i = 0; i < live.size() && budget > 0;) {
        Sequence* s = live[i];
        if (s->n_remaining() != 1) {
            ++i;
            continue;
        }
        // With speculative decoding the last token comes with its drafts (verified in the same forward); a
        // short budget verifies fewer of them.
        const int64_t n = std::min<int64_t>(1 + static_cast<int64_t>(s->drafts.size()), budget);
        const int64_t need = blocks_needed(*s, s->n_computed + n);
        while (need > available && live.size() > i + 1) preempt_at(live.size() - 1);
        if (need > available) {  // nothing newer left to preempt: this one goes back to waiting
            preempt_at(i);
            continue;
        }
        available -= need;
        plan.chunks.push_back({s, n});
        budget -= n;
        ++i;
    }

    // 2. prefill chunks of running sequences, then admissions, under the remaining budget
    for (Sequence* s : live) {
        if (budget <= 0) break;
        if (s->n_remaining() <= 1) continue;
        const int64_t n = std::min(s->n_remaining(), budget);
        const int64_t need = blocks_needed(*s, s->n_computed + n);
        if (need > available) continue;
        available -= need;
        plan.chunks.push_back({s, n});
        budget -= n;
    }
    int64_t n_running = static_cast<int64_t>(live.size());
    for (Sequence* s : waiting) {
        if (budget <= 0 || n_running >= cfg.max_num_seqs) break;
        // Admission control: the whole remaining prompt must fit now, keeping one block of headroom per
        // running sequence so that decodes do not immediately preempt the newcomer.
        // Reviving a cached block and allocating a fresh one both take one available block, so only
        // matched blocks that another sequence is using come for free.
        const PrefixMatch m = prefix_match(*s);
        const int64_t total_blocks = (static_cast<int64_t>(s->tokens.size()) + kBlockSize - 1) / kBlockSize;
        const int64_t need_all = std::max<int64_t>(total_blocks - m.n_shared, 0);
        if (need_all + n_running > available) break;  // FIFO: later requests do not overtake
        const int64_t start = m.n_blocks * kBlockSize;
        const int64_t n = std::min(static_cast<int64_t>(s->tokens.size()) - start, budget);
        const int64_t need = std::max<int64_t>((start + n + kBlockSize - 1) / kBlockSize - m.n_shared, 0);
        available -= need;
        plan.admitted.push_back(s);
        plan.chunks.push_back({s, n});
        budget -= n;
        ++n_running;
    }
    return plan;
}

}  // namespace megactx
