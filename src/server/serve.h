// `megactx serve`: the OpenAI-compatible server process — HTTP up first (503 while loading), then the model,
// tokenizer and engine; SIGINT/SIGTERM stop taking requests, abort the ones in flight and exit 0. A signal while
// loading exits at once; a load failure closes the port and exits 1.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/loader.h"

namespace megactx {

// What `serve` adds to the engine's options: where and how it listens.
struct ServeOptions : EngineOptions {
    std::string host = "127.0.0.1";
    int port = 8000;
    std::string served_model_name;  // empty: the model directory's name
    std::string api_key;
    int64_t max_body_bytes = 32 << 20;
    bool access_log = true;      // one line per request on stderr
    double log_interval_s = 10;  // a throughput line this often while there is work (0: never)
};

// The API's model name for a directory: its last component, whatever the trailing slashes ("megactx" if none).
std::string served_name_for(const std::string& model_dir);

// Runs until SIGINT/SIGTERM; returns the process exit code (a load failure exits the process with status 1).
int serve_main(const ServeOptions& options);

}  // namespace megactx
