// A small HTTP server facade so that only http.cpp includes cpp-httplib (design.md §3). Handlers get a plain
// request and return a plain response; a streaming response provides a function that writes chunks until it
// returns (write() returns false once the client has gone).
//
// What the facade guarantees whatever the client sends:
// - request bodies are read through a counting receiver, so --max-body-bytes holds for Content-Length and
//   chunked bodies alike, before anything past the limit is buffered (413);
// - a POST with neither Content-Length nor Transfer-Encoding has an empty body (RFC 9112 §6.3), not one read
//   until the connection closes; a Transfer-Encoding other than chunked is a 400;
// - a known path asked with another method is a 405 with `Allow`, an unknown path a 404;
// - one access line per request (method, path, status, the handler's note, latency) goes to the log sink.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace megactx {

struct HttpRequest {
    std::string method, path, body;
    std::map<std::string, std::string> headers;  // lower-case names
    std::string remote;                           // "addr:port" of the client
    // False once the client has closed its connection (checked without reading; cheap enough to poll).
    std::function<bool()> client_connected = [] { return true; };
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
    // Extra words for the access line (token counts), read once the response has been written.
    std::function<std::string()> access_note;
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

    // `method` is GET or POST.
    void route(const std::string& method, const std::string& path, HttpHandler handler);
    // Response body for errors the facade answers itself (404, 405, 413, malformed HTTP).
    void set_error_body(std::function<std::string(int status, const std::string& message)> make);
    // Gets each response's status and access line (default: nowhere).
    void set_access_log(std::function<void(int status, const std::string& line)> log);
    // Gets each response's status before its first byte is written, so whatever it counts is visible to the next
    // request of a client that has read this response (the access log runs after the write).
    void set_status_hook(std::function<void(int status)> hook);
    // Binds; returns false (with the reason, errno's text included, in error) when the address cannot be bound.
    bool bind(std::string* error);
    int bound_port() const { return port_; }
    // Serves until stop(); call after bind(). Returns at once if stop() came first.
    void serve();
    // Safe from any thread, before, during or after serve().
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    HttpServerConfig config_;
    int port_ = 0;
};

}  // namespace megactx
