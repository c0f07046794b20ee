// `megactx eval`: evaluation tasks run through the engine. `eval niah`: the needle-in-a-haystack grid
// (eval/niah.h) → a table on stdout, --out JSON and a --png heatmap.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine_setup.h"
#include "server/serve.h"

namespace megactx {

struct EvalOptions {
    ServeOptions engine;  // model directory, engine settings, backend hooks
    BackendFlags backend;
    CLI::App* niah = nullptr;
    std::string haystack;  // default: haystack.txt in the model directory
    std::string lengths = "1024,2048,4096";
    std::string depths = "0,0.25,0.5,0.75,1";
    int64_t samples = 5;
    uint64_t seed = 0;
    std::string out, png;
    std::string write_document;  // write the grid's first sample's user message here and stop
    bool quiet = false;
};

CLI::App* add_eval_command(CLI::App& app, EvalOptions& o);
// o.engine.model_dir must be set (main resolves the default model). Returns the exit code.
int eval_main(EvalOptions& o);

}  // namespace megactx
