#include "parallel/comm_gloo.h"

#include <gloo/allgather.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace megactx {

namespace {
size_t tensor_bytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * dtype_size(t.dtype); }
}  // namespace

GlooComm::GlooComm(std::shared_ptr<gloo::Context> context, Ops& ops)
    : context_(std::move(context)), ops_(ops), rank_(context_->rank), size_(context_->size) {}

std::vector<uint8_t> GlooComm::gather(const void* in, size_t bytes) {
    std::vector<uint8_t> out(bytes * static_cast<size_t>(size_));
    if (bytes == 0) return out;
    std::vector<uint8_t> mine(static_cast<const uint8_t*>(in), static_cast<const uint8_t*>(in) + bytes);
    gloo::AllgatherOptions o(context_);
    o.setInput(mine.data(), bytes);
    o.setOutput(out.data(), out.size());
    try {
        gloo::allgather(o);
    } catch (const std::exception& e) {
        throw PeerGone(fmt::format("tensor parallel: rank {}: another rank is gone ({})", rank_, e.what()));
    }
    return out;
}

void GlooComm::all_reduce_sum(Tensor& t) {
    MEGACTX_CHECK(t.dtype == DType::F32, "all_reduce_sum: expected F32, got {}", dtype_name(t.dtype));
    const size_t n = static_cast<size_t>(t.numel());
    std::vector<float> mine(n);
    if (n > 0) ops_.download(t, mine.data());
    const std::vector<uint8_t> all = gather(mine.data(), n * 4);
    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < size_; ++r) {  // rank order, as ThreadComm: the same bits on every rank
        const auto* p = reinterpret_cast<const float*>(all.data()) + static_cast<size_t>(r) * n;
        for (size_t i = 0; i < n; ++i) sum[i] += p[i];
    }
    if (n > 0) ops_.upload(sum.data(), t);
}

void GlooComm::all_gather_cols(const Tensor& part, Tensor& full) {
    MEGACTX_CHECK(part.dtype == DType::F32 && full.dtype == DType::F32, "all_gather_cols: expected F32 tensors");
    const int64_t n = part.dim(0), w = part.numel() / std::max<int64_t>(n, 1);
    MEGACTX_CHECK(full.numel() == part.numel() * size_, "all_gather_cols: full has {} values, expected {}",
                  full.numel(), part.numel() * size_);
    std::vector<float> mine(static_cast<size_t>(part.numel()));
    if (!mine.empty()) ops_.download(part, mine.data());
    const std::vector<uint8_t> all = gather(mine.data(), mine.size() * 4);
    std::vector<float> out(static_cast<size_t>(full.numel()));
    const int64_t W = w * size_;
    for (int r = 0; r < size_; ++r) {
        const float* p = reinterpret_cast<const float*>(all.data()) + static_cast<size_t>(r) * mine.size();
        for (int64_t i = 0; i < n; ++i) std::memcpy(out.data() + i * W + r * w, p + i * w, static_cast<size_t>(w) * 4);
    }
    if (!out.empty()) ops_.upload(out.data(), full);
}

void GlooComm::broadcast(Tensor& t, int root) {
    MEGACTX_CHECK(root >= 0 && root < size_, "broadcast: root {} outside a group of {}", root, size_);
    const size_t bytes = tensor_bytes(t);
    if (bytes == 0) return;
    std::vector<uint8_t> buf(bytes);
    if (rank_ == root) ops_.download(t, buf.data());
    gloo::BroadcastOptions o(context_);
    o.setOutput(buf.data(), bytes);
    o.setRoot(root);
    try {
        gloo::broadcast(o);
    } catch (const std::exception& e) {
        throw PeerGone(fmt::format("tensor parallel: rank {}: another rank is gone ({})", rank_, e.what()));
    }
    if (rank_ != root) ops_.upload(buf.data(), t);
}

GlooPipe::GlooPipe(std::shared_ptr<gloo::Context> context)
    : context_(std::move(context)), rank_(context_->rank), size_(context_->size),
      sent_(static_cast<size_t>(size_), 0), received_(static_cast<size_t>(size_), 0) {}

GlooPipe::~GlooPipe() {
    try {
        flush();
    } catch (...) {  // a peer gone: nothing left to deliver to
    }
}

uint64_t GlooPipe::slot(int from, int to, uint64_t index) const {
    // Above the slots gloo's collectives take from the context (Context::nextSlot counts from 0), and distinct
    // for every (sender, receiver, message).
    const auto n = static_cast<uint64_t>(size_);
    return (uint64_t{1} << 62) | ((index * n + static_cast<uint64_t>(from)) * n + static_cast<uint64_t>(to));
}

void GlooPipe::send(int to, const void* data, size_t bytes) {
    MEGACTX_CHECK(to >= 0 && to < size_ && to != rank_, "pipeline: rank {} cannot send to rank {} of {}", rank_, to,
                  size_);
    Pending p;
    const auto* b = static_cast<const uint8_t*>(data);
    p.data.assign(b, b + bytes);
    p.data.resize(std::max<size_t>(bytes, 1));  // gloo wants a buffer even for an empty message
    p.buffer = context_->createUnboundBuffer(p.data.data(), p.data.size());
    p.buffer->send(to, slot(rank_, to, sent_[static_cast<size_t>(to)]++), 0, p.data.size());
    pending_.push_back(std::move(p));
}

void GlooPipe::recv(int from, void* data, size_t bytes) {
    MEGACTX_CHECK(from >= 0 && from < size_ && from != rank_, "pipeline: rank {} cannot receive from rank {} of {}",
                  rank_, from, size_);
    std::vector<uint8_t> in(std::max<size_t>(bytes, 1));
    auto buffer = context_->createUnboundBuffer(in.data(), in.size());
    try {
        buffer->recv(from, slot(from, rank_, received_[static_cast<size_t>(from)]++), 0, in.size());
        buffer->waitRecv();
    } catch (const std::exception& e) {
        throw PeerGone(fmt::format("pipeline: rank {}: rank {} is gone ({})", rank_, from, e.what()));
    }
    if (bytes > 0) std::memcpy(data, in.data(), bytes);
}

void GlooPipe::flush() {
    try {
        for (auto& p : pending_) p.buffer->waitSend();
    } catch (const std::exception& e) {
        pending_.clear();
        throw PeerGone(fmt::format("pipeline: rank {}: a receiver is gone ({})", rank_, e.what()));
    }
    pending_.clear();
}

}  // namespace megactx
