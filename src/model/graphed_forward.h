// Decode steps through recorded graphs (Ops::record / Ops::replay; CUDA graphs on the GPU). A decode step's
// forward is ~30 ops per layer, each one or more kernel launches plus host work: at batch 1 that host time, not
// the GPU, sets the step time. A replay issues the whole step as one graph launch.
//
// One graph per shape: the number of sequences, the block-table capacity bucket (the next power of two of the
// blocks the step needs, at least 16 = 1,024 tokens) and which rows want logits. A shape's first step runs
// eagerly (first-use weight uploads and kernel attributes cannot be recorded), its second is recorded, later
// ones replay it with the step's tokens, positions, slots and block tables (BatchPlan::host_inputs, padded to
// the bucket). Eager and recorded steps of a shape run the same padded plan, so they launch the same kernels.
//
// Eligible: batches of 1 token per sequence, at most 32 sequences (the MoE's few-token path keeps the step free
// of host syncs), a model on one device, no tap. Anything else, or a backend without graphs, or
// MEGACTX_GRAPHS=0, runs GlmDsaModel::forward. A step that cannot be recorded turns graphs off (with a line on
// stderr) and runs eagerly: the result is the same either way.
//
// The tensors of a returned ForwardResult live in the graph's memory: they hold until the next step of that
// shape. Each graph keeps its activations reserved (at long contexts mostly the indexer's score rows and top-k
// scratch, up to ~0.3 GB), so at most kMaxGraphs graphs and max_bytes of them are kept: the least recently used
// goes first.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "model/batch.h"
#include "model/glm_dsa.h"

namespace megactx {

class KvCache;

class GraphedForward {
  public:
    GraphedForward(const GlmDsaModel& model, Ops& ops, KvCache& kv, int64_t max_bytes = kMaxBytes);
    ~GraphedForward();

    ForwardResult forward(const Batch& batch);

    struct Stats {
        int64_t eager = 0, recorded = 0, replayed = 0, evicted = 0;
        int64_t graphs = 0, bytes = 0;  // kept now
    };
    const Stats& stats() const { return stats_; }
    bool enabled() const { return enabled_; }

    static constexpr int64_t kMaxSequences = 32;
    static constexpr size_t kMaxGraphs = 32;
    static constexpr int64_t kMaxBytes = int64_t{2} << 30;

  private:
    using Key = std::tuple<int64_t, int64_t, std::vector<bool>>;  // sequences, padded blocks, logit rows
    struct Entry {
        bool seen = false;
        std::unique_ptr<OpsGraph> graph;
        ForwardResult result;
        std::list<Key>::iterator lru;
    };
    // The padded block count for the batch, or 0 when it does not qualify.
    int64_t bucket(const Batch& batch) const;
    void evict_lru();  // the least recently used entry

    const GlmDsaModel& model_;
    Ops& ops_;
    KvCache& kv_;
    int64_t max_bytes_;
    bool enabled_ = true;
    std::map<Key, Entry> graphs_;
    std::list<Key> lru_;  // most recent first
    Stats stats_;
};

}  // namespace megactx
