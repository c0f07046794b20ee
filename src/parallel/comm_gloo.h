// GlooComm: the ranks of a group are processes, possibly on several nodes (issue 53; design.md §6.4); data moves
// through host memory (Ops::download / Ops::upload) over gloo's TCP transport (the contexts come from
// Rendezvous::connect_gloo). The all-reduce is an all-gather followed by a sum in rank order on every rank, as
// ThreadComm sums, so a group of processes gives the bits of a group of threads and of one process.
#pragma once

#include <memory>
#include <vector>

#include "ops/ops.h"
#include "parallel/comm.h"
#include "parallel/pipe.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

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

// The pipe of one rank whose pipeline neighbours are in other processes, over the rank's gloo context (its pairs
// to every rank of the world). Sends are asynchronous (gloo's unbound buffers, kept until flush); each message
// between two ranks has its own slot, counted alike on both sides.
class GlooPipe final : public Pipe {
  public:
    explicit GlooPipe(std::shared_ptr<gloo::Context> context);
    ~GlooPipe() override;
    int rank() const override { return rank_; }
    void send(int to, const void* data, size_t bytes) override;
    void recv(int from, void* data, size_t bytes) override;
    void flush() override;
    // gloo cannot cancel: as GlooComm::abort.
    void abort() override {}

  private:
    struct Pending {
        std::vector<uint8_t> data;
        std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    };
    uint64_t slot(int from, int to, uint64_t index) const;

    std::shared_ptr<gloo::Context> context_;
    int rank_, size_;
    std::vector<uint64_t> sent_, received_;  // messages per peer
    std::vector<Pending> pending_;           // sends not yet flushed
};

}  // namespace megactx
