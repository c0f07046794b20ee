// Ranks as processes on several nodes (issue 53; design.md §6.4): the rendezvous of the nodes over TCP and the
// control channel it leaves open. Node 0 listens on --dist-init-addr; nodes 1 … N − 1 connect (retrying until
// --dist-timeout) and send their identity: the megactx version, the model's config and weight files, the
// parallelism flags. Node 0 compares each field with its own, so a mismatch is an error naming the node and the
// field on both sides; a node missing at the deadline, a port in use and a rank number out of range are errors
// too. The connections then carry gloo's key-value exchange (connect_gloo) and node 0's step messages
// (node_group.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gloo {
class Context;
}

namespace megactx {

struct DistOptions {
    int64_t nnodes = 1;     // --nnodes
    int64_t node_rank = 0;  // --node-rank
    std::string host;       // --dist-init-addr HOST:PORT (or --master-addr / --master-port)
    int port = 0;
    double timeout_s = 300;  // --dist-timeout
};

// "HOST:PORT" (IPv4 address or name; "[v6]:PORT" too) → host and port; a clear error otherwise.
std::pair<std::string, int> parse_host_port(const std::string& addr, const std::string& flag);

// What every node must agree on, as named fields ("version", "config.json", ...).
using NodeIdentity = std::vector<std::pair<std::string, std::string>>;

// A connected TCP socket; framed messages: u32 type, u64 length, body.
class Connection {
  public:
    explicit Connection(int fd) : fd_(fd) {}
    ~Connection();
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    // Throws Error when the peer is gone.
    void send(uint32_t type, const std::string& body);
    // false on a clean end of stream (the peer closed); throws on an error or, with a deadline, when it passes.
    bool recv(uint32_t& type, std::string& body,
              std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
    void shutdown();                    // wakes a thread blocked in recv (which then sees the end of stream)
    std::string local_address() const;  // the address of this end (the interface that reaches the peer)

  private:
    int fd_;
};

class Rendezvous {
  public:
    // Blocks until every node has arrived and matches node 0's identity, or throws Error. Sets SIGPIPE to be
    // ignored (gloo writes to its sockets without MSG_NOSIGNAL).
    static std::unique_ptr<Rendezvous> join(const DistOptions& o, const NodeIdentity& identity);
    ~Rendezvous();

    int64_t node_rank() const { return o_.node_rank; }
    int64_t nnodes() const { return o_.nnodes; }
    const DistOptions& options() const { return o_; }
    // Node 0: its connection to node k (1 ≤ k < nnodes). Other nodes: their connection to node 0 (k = 0).
    Connection& peer(int64_t node) { return *peers_.at(static_cast<size_t>(node)); }
    // gloo contexts for the global ranks [first, first + count), each connected to every rank of the `size`
    // (the keys move over the control connections). Every node calls it once, at the same point.
    std::vector<std::shared_ptr<gloo::Context>> connect_gloo(int64_t first, int64_t count, int64_t size);

  private:
    explicit Rendezvous(const DistOptions& o) : o_(o) {}
    void lead(const NodeIdentity& identity);
    void follow(const NodeIdentity& identity);

    DistOptions o_;
    std::vector<std::unique_ptr<Connection>> peers_;  // indexed by node (node 0's own slot empty)
    std::string local_address_;                       // where this node's gloo pairs listen
};

// Message types of the control channel (the rendezvous, gloo's keys, node 0's steps).
enum : uint32_t {
    kMsgHello = 1,
    kMsgAccept,
    kMsgReject,
    kMsgStoreSet,
    kMsgStoreGet,
    kMsgStoreValue,
    kMsgStoreDone,
    kMsgPrepare,
    kMsgForward,
    kMsgMtpForward,
    kMsgStop,
    kMsgAbort,
    kMsgDone,
    kMsgError,
};

// Little-endian framing of message bodies.
class Writer {
  public:
    void u64(uint64_t v) { bytes(&v, sizeof v); }
    void str(const std::string& s) {
        u64(s.size());
        bytes(s.data(), s.size());
    }
    template <typename T>
    void vec(const std::vector<T>& v) {
        u64(v.size());
        bytes(v.data(), v.size() * sizeof(T));
    }
    void bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
    const std::string& data() const { return out_; }

  private:
    std::string out_;
};

class Reader {
  public:
    explicit Reader(const std::string& in) : in_(in) {}
    uint64_t u64() {
        uint64_t v = 0;
        bytes(&v, sizeof v);
        return v;
    }
    std::string str() {
        const uint64_t n = count(1);
        std::string s(in_.substr(pos_, n));
        pos_ += n;
        return s;
    }
    template <typename T>
    std::vector<T> vec() {
        std::vector<T> v(count(sizeof(T)));
        bytes(v.data(), v.size() * sizeof(T));
        return v;
    }
    void bytes(void* p, size_t n);

  private:
    size_t count(size_t elem);  // a length prefix, checked against what is left
    const std::string& in_;
    size_t pos_ = 0;
};

}  // namespace megactx
