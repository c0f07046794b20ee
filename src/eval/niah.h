// Needle in a haystack (`megactx eval niah`): a passkey sentence hidden at a chosen depth of a long document
// built from a haystack text, and the question asking for it, over a grid of lengths × depths. The task
// format is specified byte for byte in docs/demo-model.md ("Needle-in-a-haystack format"); the demo model's
// training data is made with the same generator, so the two must not drift apart.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "eval/heatmap.h"
#include "tokenizer/tokenizer.h"

namespace megactx::niah {

inline constexpr std::string_view kQuestion = "What is the passkey? Answer with the number.";
inline constexpr int64_t kPasskeyMin = 10000, kPasskeyMax = 999999;
inline constexpr int64_t kMaxNewTokens = 12;

// "1024,2K,1M" → {1024, 2048, 1048576}: K = 1024, M = 1048576 (either case); each >= 1. Errors name `flag`.
std::vector<int64_t> parse_lengths(const std::string& list, const std::string& flag = "--lengths");
// "0,0.25,1" → depths, each in [0, 1].
std::vector<double> parse_depths(const std::string& list, const std::string& flag = "--depths");
// 4096 → "4K", 1048576 → "1M", 1000 → "1000".
std::string length_label(int64_t length);
// 0.25 → "0.25", 1 → "1" (at most three decimals, as the seed keys depths).
std::string depth_label(double depth);

// The haystack file: one paragraph per line ("\n"; a trailing "\r" is dropped), empty lines skipped.
std::vector<std::string> read_haystack(const std::string& path);

uint64_t splitmix64(uint64_t x);
// The std::mt19937_64 seed of sample `index` of cell (length, depth) under `seed`: splitmix64 chained over
// seed, length, round(depth · 1000) and index (docs/demo-model.md).
uint64_t sample_seed(uint64_t seed, int64_t length, double depth, int64_t index);

// `[gMASK]<sop><|user|>CONTENT<|assistant|><think></think>`: the GLM-5 rendering of one user message with
// thinking off and a generation prompt, exactly as the server renders it.
std::string render_prompt(const std::string& content);
std::string needle_sentence(int64_t passkey);  // "The passkey is N."

struct Sample {
    int64_t length = 0;  // the target L: the prompt has at most L tokens (at most max_tokens where that is less)
    double depth = 0;
    int64_t index = 0;
    int64_t passkey = 0;
    int64_t start_paragraph = 0;  // haystack line of the document's first paragraph
    int64_t n_paragraphs = 0;     // haystack paragraphs in the document (the needle not counted)
    int64_t needle_before = 0;    // the needle stands before document paragraph k (n_paragraphs: after the last)
    std::string content;          // the user message
    std::string prompt;           // render_prompt(content)
    std::vector<int32_t> tokens;  // prompt encoded (no special tokens added): size() <= length
    std::string answer;           // what a right answer holds: the passkey's digits, a fact's value, the refusal
    std::string reference;        // the answer the trained model writes ("The passkey is N.")
    bool absent = false;          // (eval facts) the asked fact is not in the document: the refusal is right
};

class SampleGenerator {
  public:
    // Encodes every paragraph once (each followed by "\n", as it stands in the document).
    SampleGenerator(const Tokenizer& tokenizer, std::vector<std::string> paragraphs);
    // max_tokens > 0 caps the prompt below `length` (a model whose context is L itself has no room for the answer
    // after an L-token prompt); the passkey and the document's start still follow from `length`.
    Sample make(int64_t length, double depth, int64_t index, uint64_t seed, int64_t max_tokens = 0) const;
    const std::vector<std::string>& paragraphs() const { return paragraphs_; }

  private:
    const Tokenizer& tok_;
    std::vector<std::string> paragraphs_;
    std::vector<int64_t> cost_;  // tokens of paragraph + "\n"
    int64_t frame_ = 0;          // tokens of render_prompt("\n" + kQuestion)
};

// The first maximal run of ASCII digits in `output` equals N's decimal digits.
bool is_correct(std::string_view output, int64_t passkey);

struct Grid {
    std::vector<int64_t> lengths;
    std::vector<double> depths;
    int64_t samples = 5;  // per cell
    int64_t absent = 0;   // per cell, after the samples: documents without the asked fact (eval facts)
    uint64_t seed = 0;
};

// What run_grid evaluates: how a sample is made (index counts the cell's samples, then its absent ones) and judged.
struct Task {
    std::string name;  // "niah", "facts"
    std::function<Sample(int64_t length, double depth, int64_t index, uint64_t seed, int64_t max_tokens, bool absent)>
        make;
    std::function<bool(std::string_view output, const Sample& s)> correct;
    int64_t max_new_tokens = kMaxNewTokens;  // greedy, stopping at EOS
};
// The passkey task over a SampleGenerator (which must outlive the task).
Task passkey_task(const SampleGenerator& gen);

struct SampleResult {
    int64_t length = 0;
    double depth = 0;
    int64_t index = 0;
    int64_t passkey = 0;
    std::string answer;  // Sample::answer
    bool absent = false;
    int64_t prompt_tokens = 0;
    std::string output;  // the decoded answer (special tokens skipped)
    bool correct = false;
    SpecStats spec;  // MTP speculative decoding (--speculative-tokens): this answer's drafts
};

struct Cell {
    int64_t length = 0;
    double depth = 0;
    int64_t correct = 0, total = 0;
    int64_t prompt_tokens = 0;  // summed over the samples
    double accuracy() const { return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0; }
};

struct Report {
    std::string task = "niah";
    int64_t max_new_tokens = kMaxNewTokens;
    Grid grid;
    std::vector<SampleResult> results;  // lengths × depths × (samples + absent), in that order
    std::vector<Cell> cells;            // lengths × depths, the samples whose fact is in the document
    int64_t absent_correct = 0, absent_total = 0;  // the others: refused or not
    double prepare_s = 0;               // building and encoding the prompts
    double elapsed_s = 0;               // the engine: first submit to last answer
    int64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0;
    SpecStats spec;  // over all answers (verifications 0: no speculative decoding)

    const Cell& cell(size_t i_length, size_t i_depth) const { return cells[i_length * grid.depths.size() + i_depth]; }
    double accuracy() const;
    double length_accuracy(size_t i_length) const;
    double prefill_tokens_per_s() const;  // prompt tokens computed (not from the prefix cache) / elapsed_s
};

// Builds every sample, submits them all to the running engine at once (it batches what fits in its KV cache and
// queues the rest), greedy, at most kMaxNewTokens new tokens, stopping at EOS, and scores the answers. A length
// above the engine's max_model_len − kMaxNewTokens gets prompts of at most that many tokens (prompt_cap below), so
// `--lengths 1M` runs on a model whose context is 1M.
Report run_grid(Engine& engine, const Tokenizer& tokenizer, const std::vector<std::string>& haystack, const Grid& grid);
Report run_grid(Engine& engine, const Tokenizer& tokenizer, const Task& task, const Grid& grid);
// The longest prompt a sample may have under max_model_len: max_model_len − kMaxNewTokens.
int64_t prompt_cap(int64_t max_model_len);

// {task, model, device, seed, samples, lengths, depths, cells, accuracy, per_length, absent, elapsed_s,
// prefill_tokens_per_s, ...}: docs/demo-model.md lists the fields.
nlohmann::json report_json(const Report& r, const std::string& model, const std::string& device);
// {verifications, drafted, accepted, mean_acceptance_length, by_position: [{drafted, accepted}],
// acceptance_lengths: [verifications that accepted a drafts]}: the report's "speculative" field.
nlohmann::json spec_json(const SpecStats& s);
// Rows = depths, columns = lengths, percentages; a last row with each length's accuracy, then the absent facts'
// refusals when there are any.
std::string report_table(const Report& r);
Heatmap report_heatmap(const Report& r, const std::string& title);

}  // namespace megactx::niah
