// A small HTTP server facade so that only http.cpp includes cpp-httplib (design.md §3). Handlers get a plain
// request and return a plain response; a streaming response provides a function that writes chunks until it
// returns (write() returns false once the client has gone).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace megactx {

struct HttpRequest {
    std::string method, path, body;
    std::map<std::string, std::string> headers;  // lower-case names
    std::string header(const std::string& name) const {
        const auto it = headers.find(name);
        return it == headers.end() ? "" : it->second;
    }
};

using ChunkWriter = std::function<bool(const std::string&)>;

struct HttpResponse {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::function<void(const ChunkWriter&)> stream;  // set: body is ignored and chunks are streamed
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerConfig {
    std::string host = "127.0.0.1";
    int port = 8000;  // 0: pick a free port (see bound_port)
    size_t max_body_bytes = 32 << 20;
    int n_threads = 256;  // each streaming response holds one thread for its duration
};

class HttpServer {
public:
    explicit HttpServer(const HttpServerConfig& config);
    ~HttpServer();

    void route(const std::string& method, const std::string& path, HttpHandler handler);
    // Response for requests no route matches and for bodies over the limit.
    void set_error_body(std::function<std::string(int status, const std::string& message)> make);
    // Binds; returns false (with the reason in error) when the address cannot be bound.
    bool bind(std::string* error);
    int bound_port() const { return port_; }
    // Serves until stop(); call after bind().
    void serve();
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    HttpServerConfig config_;
    int port_ = 0;
};

}  // namespace megactx
