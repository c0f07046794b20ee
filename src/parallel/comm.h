// Collectives between the ranks of a tensor-parallel group (issue 6; design.md §6). Each rank owns one Ops (one
// device) and one Comm; every rank calls the same collectives in the same order with tensors of the same shape.
// Two implementations: ThreadComm (comm_thread.h: ranks are threads of one process, data moves through host
// memory with Ops::download / Ops::upload — the CPU backend's transport, and a 2-rank run on one GPU) and the
// NCCL communicator of the CUDA backend (cuda_backend.h: make_nccl_comms, on the CudaOps stream).
#pragma once

#include "core/error.h"
#include "ops/tensor.h"

namespace megactx {

// A collective failed because a rank of another process left (its connections closed).
class PeerGone : public Error {
  public:
    using Error::Error;
};

class Comm {
public:
    virtual ~Comm() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;

    // t = Σ over ranks of t, in place, f32 (every rank gets the same values).
    virtual void all_reduce_sum(Tensor& t) = 0;
    // full[:, r·w : (r + 1)·w] = part of rank r.                  part [n, w] f32, full [n, size · w] f32
    virtual void all_gather_cols(const Tensor& part, Tensor& full) = 0;
    // t = root's t (any dtype; the bytes are copied).
    virtual void broadcast(Tensor& t, int root) = 0;
    // Called when a rank fails mid-forward: wakes the ranks waiting in a collective (their calls then throw) so
    // no thread hangs; the communicator is unusable afterwards. Any thread may call it.
    virtual void abort() = 0;
    // True when the collectives are device ops alone (no host synchronisation, no other thread): a forward can
    // then be recorded as one CUDA graph, as on one device (SoloRankComm).
    virtual bool on_device_only() const { return false; }
};

}  // namespace megactx
