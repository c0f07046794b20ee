// Point-to-point transfers between pipeline stages (issue 53; design.md §6): rank (s, t) — stage s, rank t of the
// stage's tensor-parallel group — sends each micro-batch's hidden states (and the IndexShare top-k when the next
// stage starts inside a group of shared layers) to rank (s + 1, t); rank (P − 1, 0) sends the logits to rank 0.
// Ranks are global (s · tp + t). Messages from one rank to another arrive in the order they were sent, and every
// receiver knows the size of what it waits for (both sides split the batch alike), so a message is bytes only.
// Two implementations: ThreadPipes (stages are threads of one process; below) and GlooPipe (stages in several
// processes, comm_gloo.h).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace megactx {

class Pipe {
  public:
    virtual ~Pipe() = default;
    virtual int rank() const = 0;  // this end's global rank
    // Queues `bytes` bytes for global rank `to` and returns without waiting for the receiver (the data is
    // copied or kept until flush()).
    virtual void send(int to, const void* data, size_t bytes) = 0;
    // Waits for the next message from global rank `from`; throws megactx::Error when its size is not `bytes`, and
    // PeerGone when the sender's process is gone.
    virtual void recv(int from, void* data, size_t bytes) = 0;
    // Waits until every message this end sent has left it.
    virtual void flush() = 0;
    // A rank failed mid-forward: wakes the ranks of this process waiting in recv (they throw); the pipes are
    // unusable afterwards.
    virtual void abort() = 0;
};

// The pipes of ranks that are threads of one process: one mailbox per (sender, receiver) pair, in host memory.
class ThreadPipes {
  public:
    // The end of global rank `rank`; the object must outlive it.
    std::unique_ptr<Pipe> end(int rank);

    void send(int from, int to, const void* data, size_t bytes);
    void recv(int from, int to, void* data, size_t bytes);
    void abort();

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::pair<int, int>, std::deque<std::vector<uint8_t>>> boxes_;
    bool aborted_ = false;
};

}  // namespace megactx
