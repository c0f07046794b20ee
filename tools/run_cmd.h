// `megactx run`: one prompt in, the answer streamed to the terminal as it is generated (like llama-cli), or a
// chat on stdin with --interactive. The prompt is rendered with the model's chat format as the server renders
// it (--raw: sent as a plain completion), the reasoning goes to stderr and the answer to stdout.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "engine_setup.h"
#include "engine/loader.h"

namespace megactx {

struct RunOptions {
    EngineOptions engine;  // model directory, engine settings, backend hooks
    BackendFlags backend;
    std::string prompt, prompt_file, system;
    bool think = true;  // the server's default (chat::ChatOptions::enable_thinking)
    bool raw = false, interactive = false, quiet = false, print_prompt = false, ignore_eos = false;
    int64_t max_new_tokens = 256;
    float temperature = 0, top_p = 1, min_p = 0;
    int64_t top_k = 0;
    uint64_t seed = 0;
    std::vector<std::string> stop;
    // Set by add_run_command: whether the sampling flags were given (else generation_config.json decides).
    CLI::Option *temperature_opt = nullptr, *top_p_opt = nullptr, *top_k_opt = nullptr, *seed_opt = nullptr;
    CLI::Option *prompt_opt = nullptr, *prompt_file_opt = nullptr;
};

CLI::App* add_run_command(CLI::App& app, RunOptions& o);
// o.engine.model_dir must be set (main resolves the default model). Returns the exit code.
int run_main(RunOptions& o);

}  // namespace megactx
