// GlooComm: the ranks of a group are processes, possibly on several nodes (issue 53; design.md §6.4); data moves
// through host memory (Ops::download / Ops::upload) over gloo's TCP transport (the contexts come from
// Rendezvous::connect_gloo). The all-reduce is an all-gather followed by a sum in rank order on every rank, as
// ThreadComm sums, so a group of processes gives the bits of a group of threads and of one process.
#pragma once

#include <memory>
#include <vector>

#include "ops/ops.h"
#include "parallel/comm.h"

namespace gloo {
class Context;
}

namespace megactx {

class GlooComm final : public Comm {
  public:
    GlooComm(std::shared_ptr<gloo::Context> context, Ops& ops);
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void all_reduce_sum(Tensor& t) override;
    void all_gather_cols(const Tensor& part, Tensor& full) override;
    void broadcast(Tensor& t, int root) override;
    // gloo has no cancel: the ranks of other processes leave a collective when this process exits (their
    // connections close) or at the context's timeout; a rank of this process is not waiting here.
    void abort() override {}

  private:
    // every rank's `bytes` bytes of `in`, rank after rank
    std::vector<uint8_t> gather(const void* in, size_t bytes);

    std::shared_ptr<gloo::Context> context_;
    Ops& ops_;
    int rank_, size_;
};

}  // namespace megactx
