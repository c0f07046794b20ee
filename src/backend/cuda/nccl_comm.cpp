// NCCL communicators for a tensor-parallel group in one process (parallel/comm.h): one rank per GPU, created
// together with ncclCommInitAll; every collective is enqueued on the rank's CudaOps stream (no host sync), so it
// orders with the model's kernels. NCCL refuses two ranks on one device; several ranks on one GPU use
// ThreadComm instead (parallel/comm_thread.h).
#include <algorithm>
#include <atomic>
#include <set>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

#ifndef MEGACTX_HAS_NCCL
namespace megactx {
std::vector<std::unique_ptr<Comm>> make_nccl_comms(const std::vector<Ops*>&) {
    MEGACTX_FAIL("this megactx was built without NCCL (nccl.h / libnccl not found next to the CUDA toolkit)");
}
}  // namespace megactx
#else
#include <nccl.h>

namespace megactx {

using cuda::CudaOps;

namespace {

#define MEGACTX_NCCL_CHECK(expr)                                                                   \
    do {                                                                                           \
        const ncclResult_t r_ = (expr);                                                            \
        MEGACTX_CHECK(r_ == ncclSuccess, "NCCL: {} failed: {} ({})", #expr, ncclGetErrorString(r_), \
                      ncclGetLastError(nullptr) ? ncclGetLastError(nullptr) : "");                 \
    } while (0)

class NcclComm final : public Comm {
public:
    NcclComm(ncclComm_t comm, CudaOps& ops, int rank, int size) : comm_(comm), ops_(ops), rank_(rank), size_(size) {}
    ~NcclComm() override {
        if (!aborted_.exchange(true)) ncclCommDestroy(comm_);
    }
    void abort() override {
        if (!aborted_.exchange(true)) ncclCommAbort(comm_);  // NCCL kernels waiting for a peer return
    }
    int rank() const override { return rank_; }
    int size() const override { return size_; }

    void all_reduce_sum(Tensor& t) override {
        MEGACTX_CHECK(t.dtype == DType::F32, "all_reduce_sum: expected F32, got {}", dtype_name(t.dtype));
        ops_.bind_thread();
        MEGACTX_NCCL_CHECK(ncclAllReduce(t.data, t.data, static_cast<size_t>(t.numel()), ncclFloat32, ncclSum, comm_,
                                         ops_.stream()));
    }

    void all_gather_cols(const Tensor& part, Tensor& full) override {
        MEGACTX_CHECK(part.dtype == DType::F32 && full.dtype == DType::F32, "all_gather_cols: expected F32 tensors");
        MEGACTX_CHECK(full.numel() == part.numel() * size_, "all_gather_cols: full has {} values, expected {}",
                      full.numel(), part.numel() * size_);
        ops_.bind_thread();
        const int64_t n = part.dim(0), w = part.numel() / std::max<int64_t>(n, 1);
        // ranks' blocks one after another [size, n, w], then each block into its columns of [n, size · w]
        Tensor stacked = ops_.alloc(DType::F32, {size_, n, w});
        MEGACTX_NCCL_CHECK(ncclAllGather(part.data, stacked.data, static_cast<size_t>(part.numel()), ncclFloat32, comm_,
                                         ops_.stream()));
        for (int r = 0; r < size_; ++r) {
            MEGACTX_CHECK(cudaMemcpy2DAsync(full.f32() + r * w, static_cast<size_t>(w * size_) * 4,
                                            stacked.f32() + r * n * w, static_cast<size_t>(w) * 4,
                                            static_cast<size_t>(w) * 4, static_cast<size_t>(n),
                                            cudaMemcpyDeviceToDevice, ops_.stream()) == cudaSuccess,
                          "all_gather_cols: cudaMemcpy2DAsync failed");
        }
    }

    void broadcast(Tensor& t, int root) override {
        MEGACTX_CHECK(root >= 0 && root < size_, "broadcast: root {} outside a group of {}", root, size_);
        ops_.bind_thread();
        const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
        MEGACTX_NCCL_CHECK(ncclBroadcast(t.data, t.data, bytes, ncclUint8, root, comm_, ops_.stream()));
    }

private:
    ncclComm_t comm_;
    std::atomic<bool> aborted_{false};
    CudaOps& ops_;
    int rank_, size_;
};

}  // namespace

std::vector<std::unique_ptr<Comm>> make_nccl_comms(const std::vector<Ops*>& ops) {
    const int n = static_cast<int>(ops.size());
    std::vector<CudaOps*> cuda;
    std::vector<int> devices;
    for (Ops* o : ops) {
        auto* c = dynamic_cast<CudaOps*>(o);
        MEGACTX_CHECK(c != nullptr, "NCCL communicators need CudaOps backends");
        cuda.push_back(c);
        devices.push_back(c->device());
    }
    MEGACTX_CHECK(std::set<int>(devices.begin(), devices.end()).size() == devices.size(),
                  "NCCL: one rank per GPU (NCCL refuses two ranks on one device); use the thread transport for that");
    std::vector<ncclComm_t> comms(static_cast<size_t>(n));
    MEGACTX_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
    std::vector<std::unique_ptr<Comm>> out;
    for (int r = 0; r < n; ++r) out.push_back(std::make_unique<NcclComm>(comms[static_cast<size_t>(r)], *cuda[static_cast<size_t>(r)], r, n));
    return out;
}

}  // namespace megactx
#endif  // MEGACTX_HAS_NCCL
