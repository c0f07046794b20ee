#include "parallel/pipe.h"

#include <cstring>

#include "core/error.h"

namespace megactx {

namespace {

class ThreadPipe final : public Pipe {
  public:
    ThreadPipe(ThreadPipes& hub, int rank) : hub_(hub), rank_(rank) {}
    int rank() const override { return rank_; }
    void send(int to, const void* data, size_t bytes) override { hub_.send(rank_, to, data, bytes); }
    void recv(int from, void* data, size_t bytes) override { hub_.recv(from, rank_, data, bytes); }
    void flush() override {}  // send copies
    void abort() override { hub_.abort(); }

  private:
    ThreadPipes& hub_;
    int rank_;
};

}  // namespace

std::unique_ptr<Pipe> ThreadPipes::end(int rank) { return std::make_unique<ThreadPipe>(*this, rank); }

void ThreadPipes::send(int from, int to, const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    {
        std::lock_guard<std::mutex> lock(mu_);
        MEGACTX_CHECK(!aborted_, "pipeline: rank {}: the group was aborted", from);
        boxes_[{from, to}].emplace_back(p, p + bytes);
    }
    cv_.notify_all();
}

void ThreadPipes::recv(int from, int to, void* data, size_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& box = boxes_[{from, to}];
    cv_.wait(lock, [&] { return aborted_ || !box.empty(); });
    MEGACTX_CHECK(!aborted_, "pipeline: rank {}: the group was aborted while it waited for rank {}", to, from);
    MEGACTX_CHECK(box.front().size() == bytes, "pipeline: rank {} expected {} bytes from rank {}, got {}", to, bytes,
                  from, box.front().size());
    if (bytes > 0) std::memcpy(data, box.front().data(), bytes);
    box.pop_front();
}

void ThreadPipes::abort() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        aborted_ = true;
    }
    cv_.notify_all();
}

}  // namespace megactx
