#include "parallel/rendezvous.h"

#include <arpa/inet.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace megactx {

using Clock = std::chrono::steady_clock;

namespace {

std::string errno_text() { return std::strerror(errno); }

Clock::time_point deadline_after(double seconds) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int ms_until(Clock::time_point deadline) {
    if (deadline == Clock::time_point::max()) return -1;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30)));
}

std::string where(const DistOptions& o) { return fmt::format("{}:{}", o.host, o.port); }

struct AddrInfo {
    addrinfo* list = nullptr;
    ~AddrInfo() {
        if (list) freeaddrinfo(list);
    }
};

void resolve(const DistOptions& o, bool passive, AddrInfo& out) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    const std::string port = std::to_string(o.port);
    const int rc = getaddrinfo(o.host.c_str(), port.c_str(), &hints, &out.list);
    MEGACTX_CHECK(rc == 0, "--dist-init-addr {}: cannot resolve '{}': {}", where(o), o.host, gai_strerror(rc));
}

void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string identity_text(const NodeIdentity& id) {
    Writer w;
    w.u64(id.size());
    for (const auto& [k, v] : id) {
        w.str(k);
        w.str(v);
    }
    return w.data();
}

NodeIdentity parse_identity(Reader& r) {
    NodeIdentity id(r.u64());
    for (auto& [k, v] : id) {
        k = r.str();
        v = r.str();
    }
    return id;
}

// The first field where `theirs` differs from `mine`, in words; empty when they match.
std::string identity_mismatch(const NodeIdentity& mine, const NodeIdentity& theirs, int64_t node) {
    std::map<std::string, std::string> t(theirs.begin(), theirs.end());
    for (const auto& [k, v] : mine) {
        const auto it = t.find(k);
        if (it == t.end()) return fmt::format("node {} sent no {} (node 0: {})", node, k, v);
        if (it->second != v) return fmt::format("{} differs: {} on node {}, {} on node 0", k, it->second, node, v);
    }
    if (theirs.size() != mine.size())
        return fmt::format("node {} sent {} identity fields, node 0 {}", node, theirs.size(), mine.size());
    return "";
}

std::string ranks_text(const std::vector<int64_t>& nodes) {
    std::string s;
    for (int64_t n : nodes) s += (s.empty() ? "" : ", ") + std::to_string(n);
    return s;
}

// gloo's key-value store on node 0: the ranks of node 0 use it directly, the other nodes through their control
// connection (served by serve_store).
class ServedStore final : public gloo::rendezvous::Store {
  public:
    explicit ServedStore(Clock::time_point deadline) : deadline_(deadline) {}
    void set(const std::string& key, const std::vector<char>& data) override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            map_[key] = data;
        }
        cv_.notify_all();
    }
    bool try_get(const std::string& key, std::vector<char>& out) {
        std::lock_guard<std::mutex> lock(mu_);
        const auto it = map_.find(key);
        if (it == map_.end()) return false;
        out = it->second;
        return true;
    }
    std::vector<char> get(const std::string& key) override {
        wait({key});
        std::vector<char> out;
        try_get(key, out);
        return out;
    }
    void wait(const std::vector<std::string>& keys) override {
        std::unique_lock<std::mutex> lock(mu_);
        const bool ok = cv_.wait_until(lock, deadline_, [&] {
            for (const auto& k : keys)
                if (map_.count(k) == 0) return false;
            return true;
        });
        MEGACTX_CHECK(ok, "--dist-timeout: the ranks' transport addresses did not all arrive in time");
    }
    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

  private:
    Clock::time_point deadline_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::string, std::vector<char>> map_;
};

// The same store seen from another node: requests over the control connection to node 0.
class ClientStore final : public gloo::rendezvous::Store {
  public:
    ClientStore(Connection& c, Clock::time_point deadline) : c_(c), deadline_(deadline) {}
    void set(const std::string& key, const std::vector<char>& data) override {
        Writer w;
        w.str(key);
        w.vec(data);
        std::lock_guard<std::mutex> lock(mu_);
        c_.send(kMsgStoreSet, w.data());
    }
    std::vector<char> get(const std::string& key) override {
        for (;;) {
            std::vector<char> out;
            if (try_get(key, out)) return out;
            MEGACTX_CHECK(Clock::now() < deadline_,
                          "--dist-timeout: the ranks' transport addresses did not all arrive in time");
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
    void wait(const std::vector<std::string>& keys) override {
        for (const auto& k : keys) get(k);
    }
    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

  private:
    bool try_get(const std::string& key, std::vector<char>& out) {
        Writer w;
        w.str(key);
        std::lock_guard<std::mutex> lock(mu_);
        c_.send(kMsgStoreGet, w.data());
        uint32_t type = 0;
        std::string body;
        MEGACTX_CHECK(c_.recv(type, body, deadline_) && type == kMsgStoreValue,
                      "tensor parallel: node 0 closed the connection while the ranks connected");
        Reader r(body);
        if (r.u64() == 0) return false;
        out = r.vec<char>();
        return true;
    }

    Connection& c_;
    Clock::time_point deadline_;
    std::mutex mu_;
};

// Node 0 answers node `node`'s store requests until it says it is connected.
void serve_store(Connection& c, ServedStore& store, Clock::time_point deadline, int64_t node) {
    for (;;) {
        uint32_t type = 0;
        std::string body;
        MEGACTX_CHECK(c.recv(type, body, deadline),
                      "tensor parallel: node {} closed the connection while the ranks "
                      "connected",
                      node);
        if (type == kMsgStoreDone) return;
        Reader r(body);
        const std::string key = r.str();
        if (type == kMsgStoreSet) {
            store.set(key, r.vec<char>());
        } else {
            MEGACTX_CHECK(type == kMsgStoreGet, "tensor parallel: node {} sent message {} while the ranks connected",
                          node, type);
            std::vector<char> v;
            Writer w;
            const bool found = store.try_get(key, v);
            w.u64(found ? 1 : 0);
            if (found) w.vec(v);
            c.send(kMsgStoreValue, w.data());
        }
    }
}

}  // namespace

std::pair<std::string, int> parse_host_port(const std::string& addr, const std::string& flag) {
    const size_t colon = addr.rfind(':');
    MEGACTX_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < addr.size(), "{} must be HOST:PORT, got '{}'",
                  flag, addr);
    std::string host = addr.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    const std::string port_text = addr.substr(colon + 1);
    int port = 0;
    for (char c : port_text) {
        MEGACTX_CHECK(c >= '0' && c <= '9' && port <= 65535, "{}: port must be a number in 1..65535, got '{}'", flag,
                      port_text);
        port = port * 10 + (c - '0');
    }
    MEGACTX_CHECK(port >= 1 && port <= 65535, "{}: port must be a number in 1..65535, got '{}'", flag, port_text);
    return {host, port};
}

Connection::~Connection() {
    if (fd_ >= 0) close(fd_);
}

void Connection::send(uint32_t type, const std::string& body) {
    std::string frame(12, '\0');
    const uint64_t n = body.size();
    std::memcpy(frame.data(), &type, 4);
    std::memcpy(frame.data() + 4, &n, 8);
    frame += body;
    size_t done = 0;
    while (done < frame.size()) {
        const ssize_t k = ::send(fd_, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        MEGACTX_CHECK(k > 0, "tensor parallel: the peer node is gone ({})", errno_text());
        done += static_cast<size_t>(k);
    }
}

bool Connection::recv(uint32_t& type, std::string& body, Clock::time_point deadline) {
    auto read_exact = [&](char* p, size_t n, bool first) {
        size_t done = 0;
        while (done < n) {
            pollfd pf{fd_, POLLIN, 0};
            const int pr = poll(&pf, 1, ms_until(deadline));
            if (pr < 0 && errno == EINTR) continue;
            MEGACTX_CHECK(pr != 0, "--dist-timeout: no answer from the peer node in time");
            MEGACTX_CHECK(pr > 0, "tensor parallel: poll: {}", errno_text());
            const ssize_t k = ::recv(fd_, p + done, n - done, 0);
            if (k < 0 && errno == EINTR) continue;
            if (k == 0 && first && done == 0) return false;
            MEGACTX_CHECK(k > 0, "tensor parallel: the peer node is gone ({})",
                          k == 0 ? std::string("connection closed mid-message") : errno_text());
            done += static_cast<size_t>(k);
        }
        return true;
    };
    char head[12];
    if (!read_exact(head, sizeof head, true)) return false;
    uint64_t n = 0;
    std::memcpy(&type, head, 4);
    std::memcpy(&n, head + 4, 8);
    MEGACTX_CHECK(n <= (uint64_t{1} << 32), "tensor parallel: a message of {} bytes from the peer node", n);
    body.resize(n);
    if (n > 0) read_exact(body.data(), n, false);
    return true;
}

void Connection::shutdown() { ::shutdown(fd_, SHUT_RDWR); }

std::string Connection::local_address() const {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len);
    char buf[INET6_ADDRSTRLEN] = {};
    if (ss.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
    } else {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
    }
    return buf;
}

void Reader::bytes(void* p, size_t n) {
    MEGACTX_CHECK(n <= in_.size() - pos_, "tensor parallel: a truncated message ({} bytes, {} more wanted)", in_.size(),
                  n);
    if (n > 0) std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
}

size_t Reader::count(size_t elem) {
    const uint64_t n = u64();
    MEGACTX_CHECK(n <= (in_.size() - pos_) / elem, "tensor parallel: a malformed message (a length of {})", n);
    return static_cast<size_t>(n);
}

std::unique_ptr<Rendezvous> Rendezvous::join(const DistOptions& o, const NodeIdentity& identity) {
    MEGACTX_CHECK(o.nnodes >= 2, "--nnodes must be 2 or more for a rendezvous, got {}", o.nnodes);
    MEGACTX_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank {} with --nnodes {}: must be 0..{}",
                  o.node_rank, o.nnodes, o.nnodes - 1);
    // gloo writes to its sockets without MSG_NOSIGNAL: a peer that died would end this process with SIGPIPE before
    // the error naming it is printed. EPIPE it is.
    signal(SIGPIPE, SIG_IGN);
    std::unique_ptr<Rendezvous> rv(new Rendezvous(o));
    rv->peers_.resize(static_cast<size_t>(o.node_rank == 0 ? o.nnodes : 1));
    if (o.node_rank == 0) {
        rv->lead(identity);
    } else {
        rv->follow(identity);
    }
    return rv;
}

Rendezvous::~Rendezvous() = default;

void Rendezvous::lead(const NodeIdentity& identity) {
    const Clock::time_point deadline = deadline_after(o_.timeout_s);
    AddrInfo ai;
    resolve(o_, true, ai);
    int lfd = -1;
    std::string bind_error;
    for (addrinfo* a = ai.list; a != nullptr && lfd < 0; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // a restart while old connections linger
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
            lfd = fd;
            break;
        }
        bind_error = errno == EADDRINUSE ? fmt::format("port {} is already in use", o_.port) : errno_text();
        close(fd);
    }
    MEGACTX_CHECK(lfd >= 0, "--dist-init-addr {}: node 0 cannot listen: {}", where(o_), bind_error);
    Connection listener(lfd);

    std::vector<bool> arrived(static_cast<size_t>(o_.nnodes), false);
    arrived[0] = true;
    int64_t n_arrived = 1;
    auto reject_all = [&](const std::string& why) {
        for (auto& p : peers_)
            if (p) {
                try {
                    p->send(kMsgReject, why);
                } catch (const Error&) {
                }
            }
    };
    std::vector<std::unique_ptr<Connection>> pending;  // connected, hello not read yet
    while (n_arrived < o_.nnodes) {
        pollfd pf{lfd, POLLIN, 0};
        const int pr = poll(&pf, 1, ms_until(deadline));
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) {
            std::vector<int64_t> missing;
            for (int64_t k = 1; k < o_.nnodes; ++k)
                if (!arrived[static_cast<size_t>(k)]) missing.push_back(k);
            const std::string why =
                fmt::format("--dist-timeout {} s: node{} {} did not reach node 0 at {}", o_.timeout_s,
                            missing.size() > 1 ? "s" : "", ranks_text(missing), where(o_));
            reject_all(why);
            MEGACTX_FAIL("{}", why);
        }
        const int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        set_nodelay(fd);
        auto c = std::make_unique<Connection>(fd);
        int64_t node = 0, their_nnodes = 0;
        NodeIdentity theirs;
        try {
            uint32_t type = 0;
            std::string body;
            if (!c->recv(type, body, std::min(deadline, Clock::now() + std::chrono::seconds(10))) || type != kMsgHello)
                continue;
            Reader r(body);
            node = static_cast<int64_t>(r.u64());
            their_nnodes = static_cast<int64_t>(r.u64());
            theirs = parse_identity(r);
        } catch (const Error&) {
            continue;  // not a megactx node (or one that gave up): keep waiting for the real ones
        }
        std::string why;
        if (their_nnodes != o_.nnodes) {
            why = fmt::format("node {} was started with --nnodes {}, node 0 with --nnodes {}", node, their_nnodes,
                              o_.nnodes);
        } else if (node < 1 || node >= o_.nnodes) {
            why = fmt::format("a node with --node-rank {} arrived; --nnodes {} allows 1..{} besides node 0", node,
                              o_.nnodes, o_.nnodes - 1);
        } else if (arrived[static_cast<size_t>(node)]) {
            why = fmt::format("two nodes were started with --node-rank {}", node);
        } else {
            const std::string diff = identity_mismatch(identity, theirs, node);
            if (!diff.empty()) why = fmt::format("node {} does not match node 0: {}", node, diff);
        }
        if (!why.empty()) {
            c->send(kMsgReject, why);
            reject_all(why);
            MEGACTX_FAIL("{}", why);
        }
        arrived[static_cast<size_t>(node)] = true;
        ++n_arrived;
        peers_[static_cast<size_t>(node)] = std::move(c);
    }
    for (int64_t k = 1; k < o_.nnodes; ++k) peers_[static_cast<size_t>(k)]->send(kMsgAccept, "");
    local_address_ = peers_[1]->local_address();
}

void Rendezvous::follow(const NodeIdentity& identity) {
    const Clock::time_point deadline = deadline_after(o_.timeout_s);
    std::string last_error = "no attempt";
    int fd = -1;
    while (fd < 0) {
        {
            AddrInfo ai;
            resolve(o_, false, ai);
            for (addrinfo* a = ai.list; a != nullptr && fd < 0; a = a->ai_next) {
                const int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
                if (s < 0) continue;
                if (connect(s, a->ai_addr, a->ai_addrlen) == 0) {
                    fd = s;
                } else {
                    last_error = errno_text();
                    close(s);
                }
            }
        }
        if (fd >= 0) break;
        MEGACTX_CHECK(Clock::now() < deadline, "--dist-timeout {} s: node {} could not reach node 0 at {} ({})",
                      o_.timeout_s, o_.node_rank, where(o_), last_error);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    set_nodelay(fd);
    peers_[0] = std::make_unique<Connection>(fd);
    Writer w;
    w.u64(static_cast<uint64_t>(o_.node_rank));
    w.u64(static_cast<uint64_t>(o_.nnodes));
    const std::string id = identity_text(identity);
    w.bytes(id.data(), id.size());
    peers_[0]->send(kMsgHello, w.data());
    uint32_t type = 0;
    std::string body;
    bool got = false;
    try {
        got = peers_[0]->recv(type, body, deadline);
    } catch (const Error&) {
        MEGACTX_FAIL("--dist-timeout {} s: node {} reached node 0 at {}, but not every node arrived in time",
                     o_.timeout_s, o_.node_rank, where(o_));
    }
    MEGACTX_CHECK(got, "node 0 at {} closed the connection during the rendezvous", where(o_));
    MEGACTX_CHECK(type != kMsgReject, "{}", body);
    MEGACTX_CHECK(type == kMsgAccept, "node 0 at {} answered message {} to the rendezvous", where(o_), type);
    local_address_ = peers_[0]->local_address();
}

std::vector<std::shared_ptr<gloo::Context>> Rendezvous::connect_gloo(int64_t first, int64_t count, int64_t size) {
    const Clock::time_point deadline = deadline_after(o_.timeout_s);
    gloo::transport::tcp::attr attr;
    attr.hostname = local_address_;
    std::shared_ptr<gloo::transport::Device> dev = gloo::transport::tcp::CreateDevice(attr);
    std::unique_ptr<gloo::rendezvous::Store> store;
    ServedStore* served = nullptr;
    if (o_.node_rank == 0) {
        auto s = std::make_unique<ServedStore>(deadline);
        served = s.get();
        store = std::move(s);
    } else {
        store = std::make_unique<ClientStore>(*peers_[0], deadline);
    }
    std::vector<std::shared_ptr<gloo::Context>> out(static_cast<size_t>(count));
    std::vector<std::exception_ptr> errors(static_cast<size_t>(count) + peers_.size());
    std::vector<std::thread> threads;
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000));
    for (int64_t i = 0; i < count; ++i) {
        threads.emplace_back([&, i] {
            try {
                auto ctx =
                    std::make_shared<gloo::rendezvous::Context>(static_cast<int>(first + i), static_cast<int>(size));
                ctx->setTimeout(timeout);
                ctx->connectFullMesh(*store, dev);
                out[static_cast<size_t>(i)] = ctx;
            } catch (...) {
                errors[static_cast<size_t>(i)] = std::current_exception();
            }
        });
    }
    if (served != nullptr) {
        for (int64_t k = 1; k < o_.nnodes; ++k) {
            threads.emplace_back([&, k] {
                try {
                    serve_store(*peers_[static_cast<size_t>(k)], *served, deadline, k);
                } catch (...) {
                    errors[static_cast<size_t>(count + k)] = std::current_exception();
                }
            });
        }
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors) {
        if (!e) continue;
        try {
            std::rethrow_exception(e);
        } catch (const Error&) {
            throw;
        } catch (const std::exception& x) {
            MEGACTX_FAIL("tensor parallel: node {} could not connect its ranks to the others: {}", o_.node_rank,
                         x.what());
        }
    }
    if (o_.node_rank != 0) peers_[0]->send(kMsgStoreDone, "");
    return out;
}

}  // namespace megactx
