#include "model/gen_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/bpe_train.h"

namespace megactx {

using json = nlohmann::json;

namespace {

// GLM-4's pre-tokenization pattern.
constexpr const char* kGlmPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Tokens that are markup inside the assistant's text (kept by skip_special_tokens, so parsers see them).
bool is_markup(const std::string& s) {
    return s.find("think") != std::string::npos || s.find("tool_") != std::string::npos ||
           s.find("arg_") != std::string::npos;
}

// Training text for the merges: plain English prose and a little code, written for this purpose.
constexpr const char* kTrainingText = R"(
The model reads the prompt one token at a time and writes the answer the same way. A token is a short piece
of text: often a whole common word such as "the", "and" or "model", sometimes part of a longer word, and for
rare text a single byte. The tokenizer learns which pieces to keep by counting the pairs of symbols that
appear most often in its training text and merging them, again and again, until the vocabulary is full.
When the user asks a question, the assistant thinks about it first and then answers. It can call a tool when
it needs information it does not have: the tool returns a response, and the assistant reads that response
before it continues. Long documents, source code and conversations with many turns all become tokens in the
same way, so a context of a million tokens can hold a whole code base or several books at once.
There are numbers too: 1, 2, 3, 10, 42, 100, 256, 1024, 2048, 65536 and 1048576 appear in many places.
The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun by the window.
Questions and answers: What is the capital of France? Paris is the capital of France. How many days are in
a week? There are seven days in a week. Where does the sun rise? The sun rises in the east and sets in the west.

def attention(query, keys, values, scale):
    scores = [scale * sum(q * k for q, k in zip(query, key)) for key in keys]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [sum(w * v[i] for w, v in zip(weights, values)) / total for i in range(len(values[0]))]

int main(int argc, char** argv) {
    std::vector<int> tokens = tokenize(argv[1]);
    for (size_t i = 0; i < tokens.size(); ++i) {
        printf("%d\n", tokens[i]);
    }
    return 0;
}

const response = await client.chat.completions.create({ model: "glm", messages: [{ role: "user", content: "hello" }] });
console.log(response.choices[0].message.content);
{"name": "get_weather", "arguments": {"city": "Berlin", "unit": "celsius"}, "result": {"temperature": 21}}
)";

void write_json(const std::filesystem::path& path, const json& j) {
    std::ofstream out(path);
    out << j.dump(2) << "\n";
    MEGACTX_CHECK(out.good(), "{}: cannot write", path.string());
}

}  // namespace

const std::vector<std::string>& glm_special_tokens() {
    static const std::vector<std::string> tokens = {
        "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
        "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
        "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
        "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "/nothink", "<think>",
        "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
        "<tool_response>", "</tool_response>"};
    return tokens;
}

int32_t glm_special_id(int64_t vocab_size, const std::string& name) {
    const auto& s = glm_special_tokens();
    const auto it = std::find(s.begin(), s.end(), name);
    MEGACTX_CHECK(it != s.end(), "'{}' is not a GLM special token", name);
    return static_cast<int32_t>(vocab_size - static_cast<int64_t>(s.size()) + (it - s.begin()));
}

json glm_pre_tokenizer() {
    const json split = {{"type", "Split"}, {"pattern", {{"Regex", kGlmPattern}}}, {"behavior", "Isolated"},
                        {"invert", false}};
    const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                             {"use_regex", false}};
    return {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}};
}

int64_t glm_max_merges(int64_t vocab_size) {
    const int64_t n_special = static_cast<int64_t>(glm_special_tokens().size());
    MEGACTX_CHECK(vocab_size >= 256 + n_special,
                  "vocab size {} is too small: a byte-level tokenizer with the {} GLM special tokens needs at least {}",
                  vocab_size, n_special, 256 + n_special);
    return vocab_size - 256 - n_special;
}

void write_glm_tokenizer(const std::string& out_dir, int64_t vocab_size, const json& bpe_model) {
    namespace fs = std::filesystem;
    const int64_t first_special = 256 + glm_max_merges(vocab_size);
    for (const auto& [token, id] : bpe_model.at("vocab").items()) {
        MEGACTX_CHECK(id.get<int64_t>() < first_special, "BPE token '{}' has id {}: the GLM special tokens start at {}",
                      token, id.get<int64_t>(), first_special);
    }
    json added = json::array();
    for (const auto& s : glm_special_tokens()) {
        const bool special = !is_markup(s);
        added.push_back({{"id", glm_special_id(vocab_size, s)}, {"content", s}, {"single_word", false},
                         {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", special}});
    }
    const json tokenizer = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", nullptr},
        {"pre_tokenizer", glm_pre_tokenizer()},
        {"post_processor",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}},
        {"model", bpe_model}};
    const json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                         {"eos_token", "<|endoftext|>"},
                         {"pad_token", "<|endoftext|>"},
                         {"clean_up_tokenization_spaces", false},
                         {"model_max_length", 1048576},
                         {"do_lower_case", false},
                         {"remove_space", false}};
    write_json(fs::path(out_dir) / "tokenizer.json", tokenizer);
    write_json(fs::path(out_dir) / "tokenizer_config.json", config);
}

void write_glm_tokenizer(const std::string& out_dir, int64_t vocab_size) {
    const auto max_merges = static_cast<size_t>(std::min<int64_t>(glm_max_merges(vocab_size), 4096));
    write_glm_tokenizer(out_dir, vocab_size, train_byte_level_bpe(kTrainingText, glm_pre_tokenizer(), max_merges));
}

}  // namespace megactx
