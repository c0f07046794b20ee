#include "tokenizer/bpe_train.h"

#include <map>

#include "tokenizer/tokenizer_impl.h"

namespace megactx {

nlohmann::json train_byte_level_bpe(std::string_view text, const nlohmann::json& pre_tokenizer, size_t max_merges) {
    tok::PreTokenizer pre;
    pre.build(pre_tokenizer, "train_byte_level_bpe");
    std::deque<std::string> scratch;
    std::vector<std::string_view> pieces;
    pre.run(text, pieces, scratch);

    // Distinct words with their counts, each as a list of symbols (byte-level strings).
    const auto& bytes = utf8::byte_to_unicode();
    std::map<std::string, int64_t> counts;
    for (std::string_view p : pieces) ++counts[std::string(p)];
    std::vector<std::pair<std::vector<std::string>, int64_t>> words;
    for (const auto& [w, c] : counts) {
        std::vector<std::string> syms;
        for (char ch : w) syms.push_back(bytes[static_cast<unsigned char>(ch)]);
        words.push_back({std::move(syms), c});
    }

    nlohmann::json vocab = nlohmann::json::object();
    int32_t next_id = 0;
    for (int b = 0; b < 256; ++b) vocab[bytes[b]] = next_id++;
    nlohmann::json merges = nlohmann::json::array();
    for (size_t m = 0; m < max_merges; ++m) {
        std::map<std::pair<std::string, std::string>, int64_t> pairs;
        for (const auto& [syms, c] : words) {
            for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += c;
        }
        const std::pair<std::string, std::string>* best = nullptr;
        int64_t best_count = 1;
        for (const auto& [p, c] : pairs) {
            if (c > best_count) {  // strict: the first (smallest) pair wins ties
                best = &p;
                best_count = c;
            }
        }
        if (best == nullptr) break;
        const std::string a = best->first, b = best->second, ab = a + b;
        merges.push_back({a, b});
        if (!vocab.contains(ab)) vocab[ab] = next_id++;
        for (auto& [syms, c] : words) {
            std::vector<std::string> out;
            for (size_t i = 0; i < syms.size(); ++i) {
                if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
                    out.push_back(ab);
                    ++i;
                } else {
                    out.push_back(syms[i]);
                }
            }
            syms.swap(out);
        }
    }
    return {{"type", "BPE"},          {"dropout", nullptr},           {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
            {"byte_fallback", false}, {"ignore_merges", false},       {"vocab", vocab},
            {"merges", merges}};
}

}  // namespace megactx
