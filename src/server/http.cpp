#include "server/http.h"

#include <dirent.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace megactx {

namespace {

using Clock = std::chrono::steady_clock;

// Per worker thread: when the request being served started, and the handler's note for its access line. The
// logger runs on the same thread once the response (streamed or not) has been written.
thread_local Clock::time_point t_start;
thread_local bool t_started = false;
thread_local std::function<std::string()> t_note;

std::string numeric_host(const sockaddr* a, socklen_t len) {
    char host[NI_MAXHOST];
    if (getnameinfo(a, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return "";
    return host;
}

int port_of(const sockaddr_storage& a) {
    if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
    if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
    return -1;
}

// The descriptor of the connection a request came on: cpp-httplib does not hand it to handlers, so it is found
// among the process's sockets by its two endpoints (unique while the connection is open). -1 if not found.
int find_connection_socket(const std::string& remote_addr, int remote_port, int local_port) {
    DIR* d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    while (const dirent* e = readdir(d)) {
        if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
        const int fd = std::atoi(e->d_name);
        struct stat st {};
        if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        sockaddr_storage peer{}, self{};
        socklen_t pl = sizeof peer, sl = sizeof self;
        if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
        if (port_of(peer) != remote_port) continue;
        if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) != 0 || port_of(self) != local_port) continue;
        if (numeric_host(reinterpret_cast<sockaddr*>(&peer), pl) != remote_addr) continue;
        found = fd;
        break;
    }
    closedir(d);
    return found;
}

// Whether the peer of `fd` is still there, without consuming anything: an orderly close reads as 0 bytes.
bool socket_alive(int fd) {
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, 0);
    if (r <= 0) return true;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return false;
    char c;
    const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

std::function<bool()> connection_probe(const httplib::Request& req) {
    struct State {
        int fd = -2;  // -2: not looked up yet
    };
    auto st = std::make_shared<State>();
    const std::string addr = req.remote_addr;
    const int remote_port = req.remote_port, local_port = req.local_port;
    return [st, addr, remote_port, local_port] {
        if (st->fd == -2) st->fd = find_connection_socket(addr, remote_port, local_port);
        return st->fd < 0 || socket_alive(st->fd);
    };
}

// Answers `status` with `body` and has cpp-httplib close the connection afterwards: a provider that writes the
// whole body and then reports failure ends the keep-alive loop. Used where unread request bytes may follow.
void answer_and_close(httplib::Response& res, int status, std::string body) {
    res.status = status;
    res.set_header("Connection", "close");
    if (body.empty()) body = "{}";
    auto shared = std::make_shared<std::string>(std::move(body));
    res.set_content_provider(shared->size(), "application/json",
                             [shared](size_t offset, size_t length, httplib::DataSink& sink) {
                                 sink.write(shared->data() + offset, length);
                                 return false;
                             });
}

struct BodyError {
    int status = 0;  // 0: the body was read
    std::string message;
    bool close = false;  // the body was not read to its end: the connection cannot carry another request
};

// Reads a request body through a counting receiver (see http.h).
BodyError read_body(const httplib::Request& req, const httplib::ContentReader& reader, size_t max_bytes,
                    std::string* body) {
    const std::string te = req.get_header_value("Transfer-Encoding");
    const bool chunked = strcasecmp(te.c_str(), "chunked") == 0;
    if (!te.empty() && !chunked) {
        return {400, fmt::format("Transfer-Encoding '{}' is not supported (send Content-Length or chunked)", te), true};
    }
    if (!chunked && !req.has_header("Content-Length")) return {};  // no body (RFC 9112 §6.3)
    if (!chunked) {
        const std::string cl = req.get_header_value("Content-Length");
        const bool digits = !cl.empty() && cl.size() <= 19 &&
                            std::all_of(cl.begin(), cl.end(), [](unsigned char c) { return std::isdigit(c); });
        if (!digits) return {400, fmt::format("Content-Length '{}' is not a byte count", cl), true};
        if (std::stoull(cl) > max_bytes) {
            reader([](const char*, size_t) { return true; });  // cpp-httplib skips the declared bytes
            return {413, fmt::format("request body too large ({} bytes; the limit is {})", cl, max_bytes)};
        }
    }
    // Past the limit the rest is read and dropped, up to kDrainBytes, so that a client still sending gets the 413
    // rather than a reset connection; a longer body is cut off there and the connection closed.
    constexpr size_t kDrainBytes = size_t{16} << 20;
    bool over = false;
    size_t dropped = 0;
    const bool ok = reader([&](const char* data, size_t n) {
        if (!over && body->size() + n <= max_bytes) {
            body->append(data, n);
            return true;
        }
        if (!over) body->clear();
        over = true;
        dropped += n;
        return dropped <= kDrainBytes;
    });
    if (over) return {413, fmt::format("request body too large (more than the limit of {} bytes)", max_bytes), !ok};
    if (!ok) return {400, "the request body could not be read (malformed chunked encoding or a timeout)", true};
    return {};
}

// A body error's answer; the connection is closed only where unread body bytes may follow (a closed socket with
// unread input is reset, and the client may lose the answer with it).
void answer_error(httplib::Response& res, const BodyError& e, std::string body) {
    if (e.close) {
        answer_and_close(res, e.status, std::move(body));
    } else {
        res.status = e.status;
        res.set_content(body, "application/json");
    }
}

}  // namespace

struct HttpServer::Impl {
    httplib::Server svr;
    std::function<std::string(int, const std::string&)> error_body;
    std::function<void(int, const std::string&)> access_log;
    std::function<void(int)> status_hook;
    std::map<std::string, std::vector<std::string>> methods;  // path -> methods routed
    std::atomic<int> state{0};                                // 0 before serve(), 1 in serve(), 2 after
    std::atomic<bool> stop_requested{false};
    std::atomic<bool> stopped{false};  // cpp-httplib's stop() called

    std::string error_json(int status, const std::string& message) const {
        return error_body ? error_body(status, message) : std::string();
    }
    // 404 for an unknown path, 405 with Allow for a known one.
    void not_routed(const httplib::Request& req, httplib::Response& res) const {
        const auto it = methods.find(req.path);
        if (it == methods.end()) {
            res.status = 404;
            res.set_content(error_json(404, fmt::format("no such endpoint: {} {}", req.method, req.path)),
                            "application/json");
            return;
        }
        std::string allow;
        for (const std::string& m : it->second) allow += (allow.empty() ? "" : ", ") + m;
        res.status = 405;
        res.set_header("Allow", allow);
        res.set_content(error_json(405, fmt::format("{} takes {}, not {}", req.path, allow, req.method)),
                        "application/json");
    }
};

HttpServer::HttpServer(const HttpServerConfig& config) : impl_(std::make_unique<Impl>()), config_(config) {
    const int n = config.n_threads;
    impl_->svr.new_task_queue = [n] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    impl_->svr.set_payload_max_length(config.max_body_bytes);
    impl_->svr.set_keep_alive_max_count(1000);
    impl_->svr.set_read_timeout(60, 0);
    // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, with which a second server binds a port that is
    // in use and the kernel splits the connections between the two.
    impl_->svr.set_socket_options([](int sock) {
        const int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    impl_->svr.set_write_timeout(60, 0);
    impl_->svr.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
        t_start = Clock::now();
        t_started = true;
        return httplib::Server::HandlerResponse::Unhandled;
    });
    impl_->svr.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty() || res.has_header("Connection")) return;
        const std::string message = res.status == 413   ? "request body too large"
                                    : res.status == 404 ? "no such endpoint"
                                    : res.status == 400 ? "malformed HTTP request"
                                                        : "request failed";
        if (impl_->error_body) res.set_content(impl_->error_body(res.status, message), "application/json");
    });
    impl_->svr.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
        if (impl_->status_hook) impl_->status_hook(res.status);
    });
    impl_->svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
        std::string note = t_note ? t_note() : "";
        t_note = nullptr;
        const std::string secs =
            t_started ? fmt::format("{:.3f}s", std::chrono::duration<double>(Clock::now() - t_start).count()) : "-";
        t_started = false;
        if (!impl_->access_log) return;
        impl_->access_log(res.status, fmt::format("{}:{} \"{} {}\" {}{}{} {}", req.remote_addr, req.remote_port, req.method,
                                      req.path, res.status, note.empty() ? "" : " ", note, secs));
    });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::set_error_body(std::function<std::string(int, const std::string&)> make) {
    impl_->error_body = std::move(make);
}

void HttpServer::set_status_hook(std::function<void(int)> hook) { impl_->status_hook = std::move(hook); }

void HttpServer::set_access_log(std::function<void(int, const std::string&)> log) {
    impl_->access_log = std::move(log);
}

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler handler) {
    impl_->methods[path].push_back(method);
    auto run = [handler](const httplib::Request& req, httplib::Response& res, std::string body) {
        HttpRequest r;
        r.method = req.method;
        r.path = req.path;
        r.body = std::move(body);
        r.remote = fmt::format("{}:{}", req.remote_addr, req.remote_port);
        r.client_connected = connection_probe(req);
        for (const auto& [k, v] : req.headers) {
            std::string key = k;
            std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
            r.headers[key] = v;
        }
        HttpResponse out = handler(r);
        t_note = std::move(out.access_note);
        res.status = out.status;
        if (out.stream) {
            auto stream = std::move(out.stream);
            res.set_header("Cache-Control", "no-cache");
            res.set_chunked_content_provider(out.content_type, [stream](size_t, httplib::DataSink& sink) {
                stream([&sink](const std::string& chunk) {
                    return sink.is_writable() && sink.write(chunk.data(), chunk.size());
                });
                sink.done();
                return true;
            });
        } else {
            res.set_content(out.body, out.content_type);
        }
    };
    if (method == "GET") {
        impl_->svr.Get(path, [run](const httplib::Request& req, httplib::Response& res) { run(req, res, ""); });
        return;
    }
    const size_t max_bytes = config_.max_body_bytes;
    Impl* impl = impl_.get();
    impl_->svr.Post(path, httplib::Server::HandlerWithContentReader(
                              [run, max_bytes, impl](const httplib::Request& req, httplib::Response& res,
                                                     const httplib::ContentReader& reader) {
                                  std::string body;
                                  const BodyError e = read_body(req, reader, max_bytes, &body);
                                  if (e.status != 0) {
                                      answer_error(res, e, impl->error_json(e.status, e.message));
                                      return;
                                  }
                                  run(req, res, std::move(body));
                              }));
}

bool HttpServer::bind(std::string* error) {
    if (config_.port == 0) {
        port_ = impl_->svr.bind_to_any_port(config_.host);
    } else {
        port_ = impl_->svr.bind_to_port(config_.host, config_.port) ? config_.port : -1;
    }
    if (port_ > 0) return true;
    // cpp-httplib does not say why; binding a probe socket the same way does.
    std::string why = "the address could not be resolved";
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    const int gai = getaddrinfo(config_.host.c_str(), std::to_string(config_.port).c_str(), &hints, &res);
    if (gai != 0) {
        why = gai_strerror(gai);
    } else if (res) {
        const int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
        if (fd < 0) {
            why = std::strerror(errno);
        } else {
            const int yes = 1;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
            why = ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 ? "bind succeeded on retry; listen failed"
                                                                  : std::strerror(errno);
            close(fd);
        }
        freeaddrinfo(res);
    }
    if (error) *error = fmt::format("cannot listen on {}:{}: {}", config_.host, config_.port, why);
    return false;
}

void HttpServer::serve() {
    // Requests no route takes: the body is still read under the limit (or taken as empty), then 404 or 405.
    Impl* impl = impl_.get();
    const size_t max_bytes = config_.max_body_bytes;
    auto not_routed = [impl](const httplib::Request& req, httplib::Response& res) { impl->not_routed(req, res); };
    auto with_body = httplib::Server::HandlerWithContentReader(
        [impl, max_bytes](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
            std::string body;
            const BodyError e = read_body(req, reader, max_bytes, &body);
            if (e.status != 0) {
                answer_error(res, e, impl->error_json(e.status, e.message));
                return;
            }
            impl->not_routed(req, res);
        });
    impl_->svr.Get(".*", not_routed);
    impl_->svr.Post(".*", with_body);
    impl_->svr.Put(".*", with_body);
    impl_->svr.Patch(".*", with_body);
    impl_->svr.Delete(".*", with_body);

    impl_->state.store(1);
    if (!impl_->stop_requested.load()) impl_->svr.listen_after_bind();
    impl_->state.store(2);
}

void HttpServer::stop() {
    if (!impl_) return;
    impl_->stop_requested.store(true);
    // serve() either sees the request and never listens, or is listening (or about to): then wait until
    // cpp-httplib reports it running, since its stop() does nothing before that.
    if (impl_->state.load() == 1) {
        while (impl_->state.load() == 1 && !impl_->svr.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!impl_->stopped.exchange(true)) impl_->svr.stop();
    }
}

}  // namespace megactx
