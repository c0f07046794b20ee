#include "parallel/comm_solo.h"

#include <algorithm>

#include "core/error.h"

namespace megactx {

SoloRankComm::SoloRankComm(Ops& ops, int rank, int size) : ops_(ops), rank_(rank), size_(size) {
    MEGACTX_CHECK(size >= 2 && rank >= 0 && rank < size, "SoloRankComm: rank {} of {} (a group has 2 ranks or more)",
                  rank, size);
}

void SoloRankComm::all_reduce_sum(Tensor& t) { (void)t; }

void SoloRankComm::broadcast(Tensor& t, int root) {
    (void)t;
    MEGACTX_CHECK(root >= 0 && root < size_, "broadcast: root {} outside a group of {}", root, size_);
}

void SoloRankComm::all_gather_cols(const Tensor& part, Tensor& full) {
    MEGACTX_CHECK(part.dtype == DType::F32 && full.dtype == DType::F32, "all_gather_cols: expected F32 tensors");
    MEGACTX_CHECK(full.numel() == part.numel() * size_, "all_gather_cols: full has {} values, expected {}",
                  full.numel(), part.numel() * size_);
    const int64_t n = part.dim(0), w = part.numel() / std::max<int64_t>(n, 1);
    if (n == 0) return;
    // [zeros of the ranks before | part | zeros of the ranks after]
    Tensor after;
    if (rank_ + 1 < size_) {
        after = ops_.alloc(DType::F32, {n, (size_ - 1 - rank_) * w});
        ops_.zero(after);
    }
    if (rank_ == 0) {
        ops_.concat_cols(part, after, full);
        return;
    }
    Tensor before = ops_.alloc(DType::F32, {n, rank_ * w});
    ops_.zero(before);
    if (rank_ + 1 == size_) {
        ops_.concat_cols(before, part, full);
        return;
    }
    Tensor head = ops_.alloc(DType::F32, {n, (rank_ + 1) * w});
    ops_.concat_cols(before, part, head);
    ops_.concat_cols(head, after, full);
}

}  // namespace megactx
