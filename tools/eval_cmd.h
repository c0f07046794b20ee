// `megactx eval`: evaluation tasks run through the engine over a grid of lengths × depths → a table on stdout, --out
// JSON and a --png heatmap. `eval niah`: the needle in a haystack (eval/niah.h); `eval facts`: facts asked in
// words, with absent facts to refuse (eval/facts.h), held-out frames and keys unless --in-distribution.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine_setup.h"
#include "engine/loader.h"

namespace megactx {

struct EvalOptions {
    EngineOptions engine;  // model directory, engine settings, backend hooks
    BackendFlags backend;
    CLI::App* niah = nullptr;
    CLI::App* facts = nullptr;
    std::string haystack;  // default: haystack.txt in the model directory
    std::string lengths = "1024,2048,4096";
    std::string depths = "0,0.25,0.5,0.75,1";
    int64_t samples = 5;
    uint64_t seed = 0;
    std::string out, png;
    std::string write_document;  // write the grid's first sample's user message here and stop
    // eval facts
    int64_t absent = 1;            // absent-fact samples per cell
    bool in_distribution = false;  // the training split's frames and keys instead of the held-out ones
    std::string write_jsonl;       // write every sample of the grid (prompt, reference answer) here and stop
    bool quiet = false;
};

CLI::App* add_eval_command(CLI::App& app, EvalOptions& o);
// o.engine.model_dir must be set (main resolves the default model). Returns the exit code.
int eval_main(EvalOptions& o);

}  // namespace megactx
