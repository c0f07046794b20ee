// `megactx grammar`: the structured-output grammar engine offline, so a user can debug a schema without a server.
// `check`: does a text match a JSON Schema, regex, GBNF grammar or choice list, token by token through the engine's
// own masks (exit 0 when it does, 1 when not, naming the first token refused, 2 for a grammar that does not
// compile); `compile`: the grammar's size, its compile time and the first mask's; `bench`: mask time per token over
// a directory of JSON Schemas and instances (NAME.schema.json + NAME.instance.json), the figures; `masks`:
// the allowed tokens at every token boundary of a text, and the vocabulary, as JSON (grammar_masks.h);
// `maskbench`: MaskBench's schemas and instances (grammar_maskbench.h).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "grammar/token_mask.h"
#include "grammar_maskbench.h"

namespace megactx {

class Tokenizer;

struct GrammarOptions {
    CLI::App* check = nullptr;
    CLI::App* compile = nullptr;
    CLI::App* bench = nullptr;
    CLI::App* masks = nullptr;
    CLI::App* maskbench = nullptr;
    MaskbenchOptions mb;
    std::string mb_shard;  // "i/n"
    std::string bench_dir, json_out;
    std::string model;  // tokenizer.json's directory (default: the embedded model)
    std::string json_schema_file, regex, grammar_file;
    std::vector<std::string> choices;
    std::string text, text_file;
    std::string jsonl;         // masks: one text per line, each a JSON string
    bool bytes_only = false;   // check the bytes alone, without the tokenizer
    bool print_gbnf = false;   // compile: print the internal grammar as GBNF
    bool print_vocab = false;  // masks: print the vocabulary instead
    int max_whitespace = 16;
    bool no_cache = false;     // bench: no MaskCache
    bool strict = false;       // JSON Schema: additionalProperties false unless the schema says otherwise
};

// The vocabulary as the engine masks it (engine/constraint.h): special tokens never allowed, the tokenizer's EOS
// ending the output.
std::shared_ptr<const grammar::TokenVocab> load_vocab(const Tokenizer& tok);

CLI::App* add_grammar_command(CLI::App& app, GrammarOptions& o);
// o.model must be set (main resolves the default model). Returns the exit code.
int grammar_main(const GrammarOptions& o);

}  // namespace megactx
