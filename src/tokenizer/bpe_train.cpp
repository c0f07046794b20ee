// Incremental byte-level BPE training.
//
// Words are the distinct pre-tokens, each a list of symbol ids with its number of occurrences. For every
// adjacent pair of symbols the trainer keeps its count over all words and the words that contain it (a list
// that may also name words that lost the pair since; they are skipped). A max-heap orders (count, pair) with
// the tie-break of the definition; an entry whose count is no longer the pair's is stale and dropped when it
// comes to the top (each change of a count pushes a fresh entry). Applying a merge rewrites only the words in
// the pair's list: their old pairs are subtracted and their new pairs added, which keeps every count exact
// whatever the overlaps ("a a a", "ab ab").
#include "tokenizer/bpe_train.h"

#include <deque>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer_impl.h"

namespace megactx {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Word {
    std::vector<int32_t> syms;
    int64_t count = 0;
};

struct PairStats {
    int64_t count = 0;
    std::vector<int32_t> words;  // indices of the words holding the pair (and maybe some that no longer do)
};

struct HeapEntry {
    int64_t count;
    int32_t a, b;
};

bool has_pair(const std::vector<int32_t>& syms, int32_t a, int32_t b) {
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
        if (syms[i] == a && syms[i + 1] == b) return true;
    }
    return false;
}

// Replaces each non-overlapping (a, b), left to right, by `ab`.
void apply_merge(std::vector<int32_t>& syms, int32_t a, int32_t b, int32_t ab) {
    size_t out = 0;
    for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
            syms[out++] = ab;
            ++i;
        } else {
            syms[out++] = syms[i];
        }
    }
    syms.resize(out);
}

}  // namespace

struct BpeTrainer::State {
    tok::PreTokenizer pre;
    tok::StringMap<int64_t> counts;  // piece bytes → occurrences
    int64_t n_words = 0;
};

BpeTrainer::BpeTrainer(const nlohmann::json& pre_tokenizer) : state_(std::make_unique<State>()) {
    state_->pre.build(pre_tokenizer, "train_byte_level_bpe");
}

BpeTrainer::~BpeTrainer() = default;

void BpeTrainer::add_text(std::string_view text) {
    std::deque<std::string> scratch;
    std::vector<std::string_view> pieces;
    state_->pre.run(text, pieces, scratch);
    for (std::string_view p : pieces) {
        const auto it = state_->counts.find(p);
        if (it != state_->counts.end()) {
            ++it->second;
        } else {
            state_->counts.emplace(std::string(p), 1);
        }
    }
    state_->n_words += static_cast<int64_t>(pieces.size());
}

int64_t BpeTrainer::n_words() const { return state_->n_words; }

size_t BpeTrainer::n_distinct_words() const { return state_->counts.size(); }

nlohmann::json BpeTrainer::train(size_t max_merges, const std::function<void(size_t)>& on_merge) const {
    // Symbols are vocabulary ids: the byte-level characters at 0..255, then each new merged string.
    const auto& bytes = utf8::byte_to_unicode();
    std::vector<std::string> token(bytes.begin(), bytes.end());
    tok::StringMap<int32_t> id_of;
    for (int32_t i = 0; i < 256; ++i) id_of.emplace(token[i], i);

    std::vector<Word> words;
    words.reserve(state_->counts.size());
    for (const auto& [w, c] : state_->counts) {
        Word word;
        word.count = c;
        for (char ch : w) word.syms.push_back(static_cast<unsigned char>(ch));
        words.push_back(std::move(word));
    }

    std::unordered_map<uint64_t, PairStats> pairs;
    for (size_t w = 0; w < words.size(); ++w) {
        const auto& syms = words[w].syms;
        for (size_t i = 0; i + 1 < syms.size(); ++i) {
            PairStats& p = pairs[pair_key(syms[i], syms[i + 1])];
            p.count += words[w].count;
            if (p.words.empty() || p.words.back() != static_cast<int32_t>(w)) {
                p.words.push_back(static_cast<int32_t>(w));
            }
        }
    }

    // Top: the highest count, then the smallest (token[a], token[b]).
    const auto lower = [&token](const HeapEntry& x, const HeapEntry& y) {
        if (x.count != y.count) return x.count < y.count;
        const int c = token[x.a].compare(token[y.a]);
        return c != 0 ? c > 0 : token[x.b] > token[y.b];
    };
    std::vector<HeapEntry> initial;
    for (const auto& [k, p] : pairs) {
        if (p.count > 1) initial.push_back({p.count, static_cast<int32_t>(k >> 32), static_cast<int32_t>(k)});
    }
    std::priority_queue<HeapEntry, std::vector<HeapEntry>, decltype(lower)> heap(lower, std::move(initial));

    nlohmann::json vocab = nlohmann::json::object();
    for (int32_t i = 0; i < 256; ++i) vocab[token[i]] = i;
    nlohmann::json merges = nlohmann::json::array();
    std::unordered_map<uint64_t, int64_t> delta;  // count changes of one merge
    while (merges.size() < max_merges && !heap.empty()) {
        const HeapEntry top = heap.top();
        heap.pop();
        const uint64_t merged_key = pair_key(top.a, top.b);
        const auto it = pairs.find(merged_key);
        if (it == pairs.end() || it->second.count != top.count) continue;  // stale

        const int32_t a = top.a, b = top.b;
        std::string ab = token[a] + token[b];
        int32_t ab_id = 0;
        if (const auto found = id_of.find(ab); found != id_of.end()) {
            ab_id = found->second;
        } else {
            ab_id = static_cast<int32_t>(token.size());
            id_of.emplace(ab, ab_id);
            vocab[ab] = ab_id;
            token.push_back(std::move(ab));
        }
        merges.push_back({token[a], token[b]});

        // Afterwards no word holds (a, b): a merge leaves no (a, b) behind and makes only pairs with ab_id.
        const std::vector<int32_t> holders = std::move(it->second.words);
        pairs.erase(it);
        delta.clear();
        for (const int32_t w : holders) {
            Word& word = words[w];
            if (!has_pair(word.syms, a, b)) continue;
            for (size_t i = 0; i + 1 < word.syms.size(); ++i) {
                delta[pair_key(word.syms[i], word.syms[i + 1])] -= word.count;
            }
            apply_merge(word.syms, a, b, ab_id);
            for (size_t i = 0; i + 1 < word.syms.size(); ++i) {
                const uint64_t k = pair_key(word.syms[i], word.syms[i + 1]);
                delta[k] += word.count;
                // Pairs without ab_id were in the word before, so it is already on their lists.
                if (word.syms[i] == ab_id || word.syms[i + 1] == ab_id) {
                    std::vector<int32_t>& list = pairs[k].words;
                    if (list.empty() || list.back() != w) list.push_back(w);
                }
            }
        }
        for (const auto& [k, d] : delta) {
            if (d == 0 || k == merged_key) continue;
            const auto p = pairs.find(k);  // present: the pair was in a word before or is on a list now
            p->second.count += d;
            if (p->second.count == 0) {
                pairs.erase(p);
            } else if (p->second.count > 1) {
                heap.push({p->second.count, static_cast<int32_t>(k >> 32), static_cast<int32_t>(k)});
            }
        }
        if (on_merge) on_merge(merges.size());
    }
    return {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges}};
}

nlohmann::json train_byte_level_bpe(std::string_view text, const nlohmann::json& pre_tokenizer, size_t max_merges) {
    BpeTrainer trainer(pre_tokenizer);
    trainer.add_text(text);
    return trainer.train(max_merges);
}

}  // namespace megactx
