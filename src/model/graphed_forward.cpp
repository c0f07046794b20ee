#include "model/graphed_forward.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "kv/kv_cache.h"
#include "model/tap.h"

namespace megactx {

GraphedForward::GraphedForward(const GlmDsaModel& model, Ops& ops, KvCache& kv, int64_t max_bytes)
    : model_(model), ops_(ops), kv_(kv), max_bytes_(max_bytes) {
    const char* env = std::getenv("MEGACTX_GRAPHS");
    enabled_ = ops.can_record() && (env == nullptr || std::strcmp(env, "0") != 0);
}

GraphedForward::~GraphedForward() = default;

void GraphedForward::evict_lru() {
    auto it = graphs_.find(lru_.back());
    if (it->second.graph) {
        --stats_.graphs;
        stats_.bytes -= it->second.graph->bytes;
        ++stats_.evicted;
    }
    graphs_.erase(it);
    lru_.pop_back();
}

int64_t GraphedForward::bucket(const Batch& b) const {
    const int64_t n = b.n_tokens();
    if (!enabled_ || n == 0 || n > kMaxSequences || !model_.single_device() || Tap::instance().enabled()) return 0;
    if (b.block_tables.size() != static_cast<size_t>(n) || b.pad_blocks != 0) return 0;
    int64_t need = 1;
    for (int64_t i = 0; i < n; ++i) {
        if (b.seq[static_cast<size_t>(i)] != i) return 0;  // one token per sequence, in order
        need = std::max<int64_t>(need, b.pos[static_cast<size_t>(i)] / kBlockSize + 1);
    }
    int64_t pad = 16;
    while (pad < need) pad *= 2;
    return pad;
}

ForwardResult GraphedForward::forward(const Batch& batch) {
    const int64_t pad = bucket(batch);
    if (pad == 0) return model_.forward(ops_, batch, kv_);
    Batch b = batch;
    b.pad_blocks = pad;
    std::vector<bool> rows = b.want_logits;
    if (rows.empty()) rows.assign(static_cast<size_t>(b.n_tokens()), true);
    const Key key{b.n_tokens(), pad, rows};
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
        if (graphs_.size() >= kMaxGraphs) evict_lru();
        lru_.push_front(key);
        it = graphs_.emplace(key, Entry{}).first;
        it->second.lru = lru_.begin();
    } else {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
    }
    Entry& e = it->second;
    if (!e.seen) {  // first step of this shape: eager, with the padded plan the graph will have
        e.seen = true;
        ++stats_.eager;
        return model_.forward(ops_, b, kv_);
    }
    // What forward checks first: bad input must not reach a recording (it would turn graphs off) or a replay
    // (which runs no host code of the model).
    model_.check_batch(b);
    if (!e.graph) {
        ForwardResult r;
        try {
            e.graph = ops_.record([&] { r = model_.forward(ops_, b, kv_); });
        } catch (const std::exception& ex) {
            std::fprintf(stderr, "megactx: CUDA graphs off, a decode step could not be recorded: %s\n", ex.what());
            e.graph.reset();
        }
        if (!e.graph) {  // nothing ran while recording: run the step eagerly, and eagerly from now on
            enabled_ = false;
            graphs_.clear();
            lru_.clear();
            stats_.graphs = stats_.bytes = 0;
            ++stats_.eager;
            return model_.forward(ops_, b, kv_);
        }
        e.result = r;
        ++stats_.recorded;
        ++stats_.graphs;
        stats_.bytes += e.graph->bytes;
        // Over the memory cap: older graphs go (this one, the most recent, stays).
        while (stats_.bytes > max_bytes_ && lru_.size() > 1) evict_lru();
    }
    e.graph->inputs = BatchPlan::host_inputs(b);
    ops_.replay(*e.graph);
    ++stats_.replayed;
    return e.result;
}

}  // namespace megactx
