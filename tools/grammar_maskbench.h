// `megactx grammar maskbench`: the JSON Schema front end and the token masks over MaskBench (guidance-ai/
// jsonschemabench, maskbench/data: one file per schema, {"schema": ..., "tests": [{"valid": bool, "data": ...}]}).
// Each schema is compiled with JSON Schema's defaults (additionalProperties true); each test instance is written as
// MaskBench writes it (Python's json.dumps: ", " and ": " separators, non-ASCII raw), tokenized without BOS and walked
// token by token through the masks, one MaskCache per schema shared by its instances (as the server shares one per
// compiled grammar). A valid instance must have every token allowed and the end-of-sequence token allowed after it;
// an invalid one must meet a refused token or no end-of-sequence at its end. Schemas run in a worker process under
// a timer, so a compile or a mask that runs past the limit (or crashes) is counted, a new worker takes the next
// schema and the run goes on.
#pragma once

#include <string>
#include <vector>

namespace megactx {

struct MaskbenchOptions {
    std::string data_dir;   // maskbench/data
    std::string model;      // tokenizer.json's directory
    std::string json_out;   // summary as JSON (empty: none)
    int limit = 0;          // the first N files of the shard (0: all)
    int shard = 0, n_shards = 1;
    int timeout_ms = 10000; // a compile or one mask past this: the schema counts as a timeout
    int max_whitespace = 16;
    std::string per_schema_out;           // one JSON line per schema as it finishes, mask times included
    std::vector<std::string> merge_files;  // summarize these per-schema files (shards) instead of running
};

// A compile error's reason, for counting: the message without its "json schema: " prefix and "(at /pointer)", with
// double-quoted text as "…" and numbers as N ('keyword' names stay).
std::string compile_error_reason(const std::string& message);

// Runs the benchmark (or merges o.merge_files); prints the summary (and writes o.json_out). Returns 0 when no valid instance was rejected and
// no invalid one accepted, 1 otherwise.
int run_maskbench(const MaskbenchOptions& o);

}  // namespace megactx
