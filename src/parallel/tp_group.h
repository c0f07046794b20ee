// A tensor / expert parallel group in one process (issue 6; design.md §6): rank r is one thread with its own Ops
// (device r), Comm, model shard (GlmDsaModel's sharding constructor) and KV cache. Rank 0's model is the one the
// engine or the runner drives, with rank 0's Ops and KV cache; each of its forwards runs the same forward on
// every follower thread at once (the Batch is shared read-only: same tokens, positions and block ids, so every
// rank's cache has the same layout), and the collectives inside the model meet. Followers make their KV cache
// with rank 0's block counts, format and host tier when the engine or runner makes rank 0's
// (GlmDsaModel::prepare_kv); with a host tier they replay rank 0's tier events before each forward
// (KvCache::TierEvent), so every rank's blocks are placed and dropped alike while each moves its own rows.
// Across processes (node_group.h) a group holds the ranks [first_rank, first_rank + ranks here) of the whole
// group; on node 0 it also sends each forward to the other nodes' groups and waits for their answers.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/glm_dsa.h"
#include "parallel/comm.h"
#include "parallel/node_group.h"
#include "parallel/pipe.h"
#include "parallel/shard_plan.h"

namespace megactx {

class TensorParallelGroup final : public RankFollowers {
public:
    // One communicator per rank over the backends of one pipeline stage's ranks in this process (called once a
    // stage; once for the whole group without pipeline parallelism).
    using CommFactory = std::function<std::vector<std::unique_ptr<Comm>>(const std::vector<Ops*>&)>;
    // The pipes of the global ranks [first, first + count) (pipeline stages in several processes).
    using PipeFactory = std::function<std::vector<std::unique_ptr<Pipe>>(int64_t first, int64_t count)>;

    // ops[r] is rank r's backend (ops.size() = o.n_gpus); make_comms builds one communicator per rank over them.
    TensorParallelGroup(const std::string& dir, const ParallelOptions& o, std::vector<std::unique_ptr<Ops>> ops,
                        const CommFactory& make_comms);
    // The ranks [first_rank, first_rank + ops.size()) of o.n_gpus, the others in other processes; `remote`
    // (node 0 only) reaches the other nodes' groups.
    TensorParallelGroup(const std::string& dir, const ParallelOptions& o, std::vector<std::unique_ptr<Ops>> ops,
                        const CommFactory& make_comms, int64_t first_rank, std::unique_ptr<FollowerNodes> remote);
    // With pipeline stages (o.pp > 1) in several processes: `make_pipes` links this process's ranks to the other
    // stages' (nullptr: every stage is here, linked through host memory).
    TensorParallelGroup(const std::string& dir, const ParallelOptions& o, std::vector<std::unique_ptr<Ops>> ops,
                        const CommFactory& make_comms, int64_t first_rank, std::unique_ptr<FollowerNodes> remote,
                        const PipeFactory& make_pipes);
    ~TensorParallelGroup() override;
    TensorParallelGroup(const TensorParallelGroup&) = delete;
    TensorParallelGroup& operator=(const TensorParallelGroup&) = delete;

    GlmDsaModel& model() { return *models_[0]; }
    // GlmDsaModel::override_indexer_hadamard on every rank of this process, before the first forward.
    void override_indexer_hadamard(std::optional<bool> on) {
        for (auto& m : models_) m->override_indexer_hadamard(on);
    }
    Ops& ops() { return *ops_[0]; }
    int size() const { return static_cast<int>(ops_.size()); }
    const ShardPlan& plan() const { return plan_; }

    void prepare(KvCache& kv0) override;
    void begin_forward(const Batch& batch, const KvCache& kv0) override;
    void begin_mtp_forward(const Batch& batch, const KvCache& kv0, const MtpInputs& in) override;
    void end_forward() override;
    // Aborts every rank's communicator (the group cannot run again).
    bool abort(const std::exception_ptr& cause) override;
    // Called by abort() first. A node other than 0 ends its process there (gloo cannot release this node's other
    // ranks from a collective that waits for the failed one).
    void set_abort_handler(std::function<void(const std::exception_ptr&)> h) { abort_handler_ = std::move(h); }

    // Runs fn(rank, ops, kv) on every follower's thread (its device current), with its KV cache made like kv0
    // first; returns when all are done (rethrows a follower's error). Benchmarks fill the followers' pools so.
    // Not with ranks in other processes.
    using FollowerJob = std::function<void(int rank, Ops& ops, KvCache& kv)>;
    void run_on_followers(const KvCache& kv0, const FollowerJob& fn);

private:
    void follower_loop(int rank);
    void start(const KvCache& kv0, FollowerJob job);
    // The same step to the other nodes (node 0 of several; nothing otherwise).
    void send_remote(uint32_t type, const KvCache& kv0, const Batch* batch, const MtpInputs* mtp);

    ShardPlan plan_;
    std::vector<std::unique_ptr<Ops>> ops_;
    std::unique_ptr<FollowerNodes> remote_;
    std::function<void(const std::exception_ptr&)> abort_handler_;
    std::vector<std::unique_ptr<Comm>> comms_;
    std::unique_ptr<ThreadPipes> thread_pipes_;  // stages linked in this process
    std::vector<std::unique_ptr<Pipe>> pipes_;   // per rank here (pipeline stages only)
    std::vector<std::unique_ptr<GlmDsaModel>> models_;
    std::vector<std::unique_ptr<KvCache>> kv_;  // followers' caches (kv_[0] unused: rank 0's is the caller's)
    std::vector<std::thread> threads_;

    std::mutex mu_;
    std::condition_variable cv_;
    uint64_t job_ = 0;     // forwards started
    int running_ = 0;      // followers still in the current forward
    FollowerJob job_fn_;   // the current job (a forward, or run_on_followers' function)
    int64_t n_blocks_ = 0, n_device_blocks_ = 0;  // both tiers; the device tier's
    KvFormat format_ = KvFormat::F32;
    KvTierOptions tier_;  // n_host_blocks 0: no host tier
    // The host tier: rank 0's cache (prepare) and its tier events, replayed by each follower before its job and
    // cleared once every follower has run it.
    KvCache* kv0_ = nullptr;
    const KvCache* started_kv0_ = nullptr;
    bool stop_ = false;
    std::exception_ptr error_;
};

}  // namespace megactx
