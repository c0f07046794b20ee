#include "parallel/comm_thread.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace megactx {

namespace {
size_t tensor_bytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * dtype_size(t.dtype); }
}  // namespace

ThreadCommGroup::ThreadCommGroup(int size) : size_(size), buffers_(static_cast<size_t>(size)) {
    MEGACTX_CHECK(size >= 1, "ThreadCommGroup: size must be >= 1, got {}", size);
}

void ThreadCommGroup::barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    MEGACTX_CHECK(!aborted_, "tensor parallel: another rank failed; the group is aborted");
    const uint64_t gen = generation_;
    if (++waiting_ == size_) {
        waiting_ = 0;
        ++generation_;
        cv_.notify_all();
        return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    MEGACTX_CHECK(generation_ != gen, "tensor parallel: another rank failed; the group is aborted");
}

void ThreadCommGroup::abort() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        aborted_ = true;
    }
    cv_.notify_all();
}

ThreadComm::ThreadComm(std::shared_ptr<ThreadCommGroup> group, int rank, Ops& ops)
    : group_(std::move(group)), rank_(rank), ops_(ops) {
    MEGACTX_CHECK(rank >= 0 && rank < group_->size(), "ThreadComm: rank {} outside a group of {}", rank,
                  group_->size());
}

void ThreadComm::post(const Tensor& t) {
    std::vector<uint8_t>& b = group_->buffer(rank_);
    b.resize(tensor_bytes(t));
    if (!b.empty()) ops_.download(t, b.data());
}

void ThreadComm::all_reduce_sum(Tensor& t) {
    MEGACTX_CHECK(t.dtype == DType::F32, "all_reduce_sum: expected F32, got {}", dtype_name(t.dtype));
    post(t);
    group_->barrier();  // every rank has posted
    const size_t n = static_cast<size_t>(t.numel());
    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < size(); ++r) {  // rank order: the same bits on every rank
        const auto* p = reinterpret_cast<const float*>(group_->buffer(r).data());
        MEGACTX_CHECK(group_->buffer(r).size() == n * 4, "all_reduce_sum: rank {} posted {} bytes, rank {} {}", r,
                      group_->buffer(r).size(), rank_, n * 4);
        for (size_t i = 0; i < n; ++i) sum[i] += p[i];
    }
    group_->barrier();  // every rank has read every buffer
    if (n > 0) ops_.upload(sum.data(), t);
}

void ThreadComm::all_gather_cols(const Tensor& part, Tensor& full) {
    MEGACTX_CHECK(part.dtype == DType::F32 && full.dtype == DType::F32, "all_gather_cols: expected F32 tensors");
    const int64_t n = part.dim(0), w = part.numel() / std::max<int64_t>(n, 1);
    MEGACTX_CHECK(full.numel() == part.numel() * size(), "all_gather_cols: full has {} values, expected {}",
                  full.numel(), part.numel() * size());
    post(part);
    group_->barrier();
    std::vector<float> out(static_cast<size_t>(full.numel()));
    const int64_t W = w * size();
    for (int r = 0; r < size(); ++r) {
        const auto* p = reinterpret_cast<const float*>(group_->buffer(r).data());
        for (int64_t i = 0; i < n; ++i) std::memcpy(out.data() + i * W + r * w, p + i * w, static_cast<size_t>(w) * 4);
    }
    group_->barrier();
    if (!out.empty()) ops_.upload(out.data(), full);
}

void ThreadComm::broadcast(Tensor& t, int root) {
    MEGACTX_CHECK(root >= 0 && root < size(), "broadcast: root {} outside a group of {}", root, size());
    if (rank_ == root) post(t);
    group_->barrier();
    if (rank_ != root) {
        const std::vector<uint8_t>& b = group_->buffer(root);
        MEGACTX_CHECK(b.size() == tensor_bytes(t), "broadcast: root sent {} bytes, rank {} expects {}", b.size(),
                      rank_, tensor_bytes(t));
        if (!b.empty()) ops_.upload(b.data(), t);
    }
    group_->barrier();
}

std::vector<std::unique_ptr<Comm>> make_thread_comms(const std::vector<Ops*>& ops) {
    auto group = std::make_shared<ThreadCommGroup>(static_cast<int>(ops.size()));
    std::vector<std::unique_ptr<Comm>> out;
    for (size_t r = 0; r < ops.size(); ++r) out.push_back(std::make_unique<ThreadComm>(group, static_cast<int>(r), *ops[r]));
    return out;
}

}  // namespace megactx
