// ThreadComm: the ranks of a group are threads of one process; collectives meet at a barrier and move data through
// host memory (Ops::download / Ops::upload), so they work for any backend — the CPU backend's tensor parallelism,
// and several ranks on one GPU (which NCCL refuses: one rank per device). Sums run in rank order, so every rank
// gets bit-identical values and the result does not depend on thread timing.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ops/ops.h"
#include "parallel/comm.h"

namespace megactx {

// What the ranks of one group share: a reusable barrier and one host buffer per rank.
class ThreadCommGroup {
public:
    explicit ThreadCommGroup(int size);
    int size() const { return size_; }
    void barrier();  // throws Error once the group is aborted
    void abort();
    std::vector<uint8_t>& buffer(int rank) { return buffers_[static_cast<size_t>(rank)]; }

private:
    int size_;
    std::mutex mu_;
    std::condition_variable cv_;
    int waiting_ = 0;
    uint64_t generation_ = 0;
    bool aborted_ = false;
    std::vector<std::vector<uint8_t>> buffers_;
};

class ThreadComm final : public Comm {
public:
    ThreadComm(std::shared_ptr<ThreadCommGroup> group, int rank, Ops& ops);
    int rank() const override { return rank_; }
    int size() const override { return group_->size(); }
    void all_reduce_sum(Tensor& t) override;
    void all_gather_cols(const Tensor& part, Tensor& full) override;
    void broadcast(Tensor& t, int root) override;
    void abort() override { group_->abort(); }

private:
    void post(const Tensor& t);  // this rank's tensor → its host buffer

    std::shared_ptr<ThreadCommGroup> group_;
    int rank_;
    Ops& ops_;
};

// One ThreadComm per rank, rank r moving data with *ops[r].
std::vector<std::unique_ptr<Comm>> make_thread_comms(const std::vector<Ops*>& ops);

}  // namespace megactx
