// One rank of a tensor / expert parallel group run alone, for benchmarks: the GPU work of rank r of an N-rank
// deployment (GLM-5.2 under TP 8 + EP 8 on one H200) without the other N − 1 GPUs. The collectives move nothing:
// an all-reduce leaves this rank's partial sum, a broadcast leaves the tensor as it is, an all-gather writes this
// rank's columns and zeros for the others' (so every value stays finite). The results are wrong by design; the
// time is the rank's compute, to which the collectives' cost is added separately. Device ops only, so a forward
// records as one CUDA graph.
#pragma once

#include "ops/ops.h"
#include "parallel/comm.h"

namespace megactx {

class SoloRankComm final : public Comm {
  public:
    SoloRankComm(Ops& ops, int rank, int size);
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void all_reduce_sum(Tensor& t) override;
    void all_gather_cols(const Tensor& part, Tensor& full) override;
    void broadcast(Tensor& t, int root) override;
    void abort() override {}
    bool on_device_only() const override { return true; }

  private:
    Ops& ops_;
    int rank_, size_;
};

}  // namespace megactx
