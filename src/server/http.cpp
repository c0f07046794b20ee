#include "server/http.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>

namespace megactx {

struct HttpServer::Impl {
    httplib::Server svr;
    std::function<std::string(int, const std::string&)> error_body;
};

HttpServer::HttpServer(const HttpServerConfig& config) : impl_(std::make_unique<Impl>()), config_(config) {
    const int n = config.n_threads;
    impl_->svr.new_task_queue = [n] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    impl_->svr.set_payload_max_length(config.max_body_bytes);
    impl_->svr.set_keep_alive_max_count(1000);
    impl_->svr.set_read_timeout(60, 0);
    impl_->svr.set_write_timeout(60, 0);
    impl_->svr.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty()) return;
        std::string message = res.status == 413   ? "request body too large"
                              : res.status == 404 ? "no such endpoint"
                                                  : "request failed";
        if (impl_->error_body) {
            res.set_content(impl_->error_body(res.status, message), "application/json");
        }
    });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::set_error_body(std::function<std::string(int, const std::string&)> make) {
    impl_->error_body = std::move(make);
}

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler handler) {
    auto adapt = [handler](const httplib::Request& req, httplib::Response& res) {
        HttpRequest r;
        r.method = req.method;
        r.path = req.path;
        r.body = req.body;
        for (const auto& [k, v] : req.headers) {
            std::string key = k;
            std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
            r.headers[key] = v;
        }
        HttpResponse out = handler(r);
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
        impl_->svr.Get(path, adapt);
    } else {
        impl_->svr.Post(path, adapt);
    }
}

bool HttpServer::bind(std::string* error) {
    if (config_.port == 0) {
        port_ = impl_->svr.bind_to_any_port(config_.host);
    } else {
        port_ = impl_->svr.bind_to_port(config_.host, config_.port) ? config_.port : -1;
    }
    if (port_ <= 0) {
        if (error) *error = "cannot listen on " + config_.host + ":" + std::to_string(config_.port);
        return false;
    }
    return true;
}

void HttpServer::serve() { impl_->svr.listen_after_bind(); }

void HttpServer::stop() {
    if (impl_) impl_->svr.stop();
}

}  // namespace megactx
