// Decode steps through recorded graphs (Ops::record / Ops::replay; CUDA graphs on the GPU). A decode step's
// forward is ~30 ops per layer, each one or more kernel launches plus host work: at batch 1 that host time, not
// the GPU, sets the step time. A replay issues the whole step as one graph launch. Three kinds of step go
// through graphs: target decode steps, MTP verification steps (the last token and the drafts of each sequence,
// every row scored) and the MTP layer's draft steps (mtp_forward: step 0 over the rows just verified, with the
// MTP indexer; steps >= 1 with step 0's top-k).
//
// One graph per shape: the kind, each token's sequence, the block-table capacity bucket (the next power of two
// of the blocks the step needs, at least 16 = 1,024 tokens) and which rows want logits. A shape's first step
// runs eagerly (first-use weight uploads and kernel attributes cannot be recorded), its second is recorded,
// later ones replay it with the step's tokens, positions, slots and block tables (BatchPlan::host_inputs,
// padded to the bucket). Eager and recorded steps of a shape run the same padded plan, so they launch the same
// kernels. An MTP step's hidden input is copied into a buffer the graph reads, and a reused top-k is one more
// host input.
//
// Eligible: at most kMaxTokens tokens (the MoE's few-token paths, in passes of 32 beyond 32 tokens, keep the step
// free of host syncs; a batch of 32 sequences verifying 3 drafts each is 128 rows), each sequence's
// tokens consecutive; target steps only where every row wants logits (decode and verification, not prefill
// chunks); a model on one device, no tap. Anything else, or a backend without graphs, or MEGACTX_GRAPHS=0,
// runs GlmDsaModel::forward / mtp_forward. A shape that cannot be recorded runs eagerly from then on (with a
// line on stderr): the result is the same either way.
//
// The tensors of a returned ForwardResult live in the graph's memory: they hold until the next step of that
// shape. Each graph keeps its activations reserved (at long contexts mostly the indexer's score rows and top-k
// scratch, up to ~0.3 GB), so at most kMaxGraphs graphs and max_bytes of them are kept: the least recently used
// goes first.
#pragma once

#include <cstdint>
#include <functional>
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
    // GlmDsaModel::mtp_forward through graphs; `reuse_topk` ([n · index_topk] slots on the host) or nullptr.
    ForwardResult mtp_forward(const Batch& batch, const Tensor& hidden_in, const std::vector<int32_t>* reuse_topk);
    // The greedy MTP draft chain as one step (one graph; eager where graphs are off or the batches do not qualify):
    // step 0 over `b0` from `hidden_in` [b0 tokens, hidden] with the MTP indexer, asking logits for one row per
    // drafting sequence (`last_rows`: those rows of b0) or for every row of b0 (step 0 over whole verifications,
    // Engine::draft: last_rows picks each sequence's row); then step j = 1 .. steps.size() over `steps[j - 1]`
    // (one token per drafting sequence, in the same order, one position further each step), each embedding the
    // previous step's argmax from backend memory and reading its hidden state, over step 0's top-k rows when
    // `share`. The tokens in `steps` are placeholders. Returns the drafts on the host: [k][sequence],
    // k = steps.size() + 1 — one download for the whole chain.
    std::vector<int32_t> mtp_greedy_chain(const Batch& b0, const Tensor& hidden_in, const std::vector<int32_t>& last_rows,
                                          const std::vector<Batch>& steps, bool share);

    struct Stats {
        int64_t eager = 0, recorded = 0, replayed = 0, evicted = 0;
        int64_t unrecordable = 0;       // shapes whose recording failed (they run eagerly)
        int64_t shapes = 0;             // distinct step shapes seen (a shape evicted and seen again counts twice)
        int64_t graphs = 0, bytes = 0;  // kept now
    };
    const Stats& stats() const { return stats_; }
    bool enabled() const { return enabled_; }

    static constexpr int64_t kMaxTokens = 128;
    static constexpr size_t kMaxGraphs = 32;
    static constexpr int64_t kMaxBytes = int64_t{2} << 30;

  private:
    // The kind of step: a target forward, an MTP step with its indexer or with a reused top-k, or a greedy draft
    // chain of k steps (kChain + 2k + share).
    static constexpr int kTarget = 0, kMtpIndexer = 1, kMtpReuse = 2, kChain = 16;
    // kind, each token's sequence, padded blocks, logit rows
    using Key = std::tuple<int, std::vector<int32_t>, int64_t, std::vector<bool>>;
    struct Result {
        ForwardResult fwd;
        Tensor drafts;  // a chain's [k, sequences] int32
    };
    struct Entry {
        bool seen = false;
        bool unrecordable = false;
        std::unique_ptr<OpsGraph> graph;
        Result result;
        std::list<Key>::iterator lru;
    };
    // The padded block count for the batch, or 0 when it does not qualify.
    int64_t bucket(const Batch& batch) const;
    void evict_lru();  // the least recently used entry
    // The shared path: `body` runs the step on `b` (padded) — eagerly, or issued for recording; `inputs` gives the
    // host inputs a replay sends, in the order the body uploads them (built only for a replay).
    Result run(int kind, const Batch& b, const std::function<Result()>& body,
               const std::function<std::vector<std::vector<int32_t>>()>& inputs);
    // Copies `hidden_in` into mtp_hidden_ and returns the view the MTP graphs read.
    Tensor stage_hidden(const Tensor& hidden_in);

    const GlmDsaModel& model_;
    Ops& ops_;
    KvCache& kv_;
    int64_t max_bytes_;
    bool enabled_ = true;
    bool pad_only_ = false;  // MEGACTX_GRAPHS=pad: every eligible step eagerly with its padded plan, never recorded
    std::map<Key, Entry> graphs_;
    std::list<Key> lru_;  // most recent first
    Stats stats_;
    Tensor mtp_hidden_;  // [kMaxTokens, hidden]: the MTP graphs' hidden input
};

}  // namespace megactx
