// The BPE model over token ids: merges applied lowest rank first, leftmost first among equal ranks (what the
// Rust and JS implementations both compute). Short words use a rank array rescanned per merge; long words a
// heap over a linked list of symbols. Whole words are cached.
#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace megactx::tok {

namespace {
constexpr size_t kLongWord = 48;        // symbols; above this the heap version is faster
constexpr size_t kMaxCachedBytes = 128;  // longer pre-tokens are not cached
constexpr size_t kCacheEntries = 1 << 16;
}  // namespace

void MergeTable::reserve(size_t n) {
    size_t cap = 16;
    shift_ = 60;
    while (cap < 2 * n + 16) {
        cap <<= 1;
        --shift_;
    }
    table_.assign(cap, Entry{});
    mask_ = cap - 1;
}

void MergeTable::insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    size_t i = slot(key);
    while (table_[i].key != kEmpty && table_[i].key != key) i = (i + 1) & mask_;
    table_[i] = {key, rank, id};  // a repeated merge keeps its last rank, as in the reference implementations
}

void Bpe::build(const nlohmann::json& m, const std::string& where) {
    MEGACTX_CHECK(m.is_object(), "{}: 'model' must be an object", where);
    const std::string type = m.value("type", std::string("BPE"));
    MEGACTX_CHECK(type == "BPE", "{}: unsupported model type '{}' (only BPE is supported)", where, type);
    for (const char* unsupported : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        MEGACTX_CHECK(!m.contains(unsupported) || m[unsupported].is_null() ||
                          (m[unsupported].is_string() && m[unsupported].get<std::string>().empty()),
                      "{}: BPE '{}' is not supported", where, unsupported);
    }
    MEGACTX_CHECK(m.contains("vocab") && m["vocab"].is_object(), "{}: model.vocab must be an object", where);
    vocab.reserve(m["vocab"].size());
    for (const auto& [k, v] : m["vocab"].items()) {
        MEGACTX_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < INT32_MAX,
                      "{}: model.vocab['{}'] is not a valid id", where, k);
        vocab.emplace(k, v.get<int32_t>());
    }
    auto get_bool = [&](const char* key) { return m.contains(key) && m[key].is_boolean() && m[key].get<bool>(); };
    ignore_merges_ = get_bool("ignore_merges");
    byte_fallback_ = get_bool("byte_fallback");
    fuse_unk_ = get_bool("fuse_unk");
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
        const auto it = vocab.find(m["unk_token"].get<std::string>());
        MEGACTX_CHECK(it != vocab.end(), "{}: model.unk_token '{}' is not in the vocabulary", where,
                      m["unk_token"].get<std::string>());
        unk_id = it->second;
    }
    const auto& bytes = utf8::byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
        const auto it = vocab.find(bytes[b]);
        byte_ids_[b] = it == vocab.end() ? -1 : it->second;
        const auto fb = vocab.find(fmt::format("<0x{:02X}>", b));
        fallback_ids_[b] = fb == vocab.end() ? -1 : fb->second;
    }
    const nlohmann::json empty = nlohmann::json::array();
    const auto& merges = m.contains("merges") && !m["merges"].is_null() ? m["merges"] : empty;
    MEGACTX_CHECK(merges.is_array(), "{}: model.merges must be a list", where);
    merges_.reserve(merges.size());
    std::string a, b;
    for (size_t r = 0; r < merges.size(); ++r) {
        const auto& e = merges[r];
        if (e.is_string()) {
            const std::string& s = e.get_ref<const std::string&>();
            const size_t sp = s.find(' ');
            MEGACTX_CHECK(sp != std::string::npos, "{}: model.merges[{}] '{}' is not 'a b'", where, r, s);
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else {
            MEGACTX_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                          "{}: model.merges[{}] is neither 'a b' nor [a, b]", where, r);
            a = e[0].get<std::string>();
            b = e[1].get<std::string>();
        }
        const auto ia = vocab.find(a), ib = vocab.find(b), im = vocab.find(a + b);
        MEGACTX_CHECK(ia != vocab.end() && ib != vocab.end() && im != vocab.end(),
                      "{}: model.merges[{}] ('{}', '{}') uses a token that is not in the vocabulary", where, r, a, b);
        merges_.insert(ia->second, ib->second, static_cast<int32_t>(r), im->second);
    }
}

void Bpe::initial_symbols(std::string_view piece, bool byte_level, std::vector<int32_t>& syms) const {
    syms.clear();
    if (byte_level) {
        for (char c : piece) {
            const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
            if (id >= 0) {
                syms.push_back(id);
            } else if (unk_id >= 0 && !(fuse_unk_ && !syms.empty() && syms.back() == unk_id)) {
                syms.push_back(unk_id);
            }
        }
        return;
    }
    size_t i = 0;
    while (i < piece.size()) {
        const size_t start = i;
        utf8::next_cp(piece, i);
        const std::string_view ch = piece.substr(start, i - start);
        const auto it = vocab.find(ch);
        if (it != vocab.end()) {
            syms.push_back(it->second);
            continue;
        }
        if (byte_fallback_) {
            bool all = true;
            for (char c : ch) all &= fallback_ids_[static_cast<unsigned char>(c)] >= 0;
            if (all) {
                for (char c : ch) syms.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
                continue;
            }
        }
        if (unk_id >= 0 && !(fuse_unk_ && !syms.empty() && syms.back() == unk_id)) syms.push_back(unk_id);
    }
}

void Bpe::merge(std::vector<int32_t>& syms) const {
    const size_t n0 = syms.size();
    if (n0 < 2) return;
    if (n0 > kLongWord) return merge_long(syms);
    // ranks[i], ids[i]: the merge of (syms[i], syms[i+1]), INT_MAX when none.
    int32_t ranks[kLongWord], ids[kLongWord];
    size_t n = n0;
    auto look = [&](size_t i) {
        const MergeTable::Entry* e = merges_.find(syms[i], syms[i + 1]);
        ranks[i] = e ? e->rank : INT_MAX;
        ids[i] = e ? e->id : -1;
    };
    for (size_t i = 0; i + 1 < n; ++i) look(i);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; ++i) {
            if (ranks[i] < ranks[best]) best = i;
        }
        if (ranks[best] == INT_MAX) break;
        syms[best] = ids[best];
        for (size_t i = best + 1; i + 1 < n; ++i) {
            syms[i] = syms[i + 1];
            ranks[i] = ranks[i + 1];
            ids[i] = ids[i + 1];
        }
        --n;
        if (best > 0) look(best - 1);
        if (best + 1 < n) {
            look(best);
        } else {
            ranks[best] = INT_MAX;
        }
    }
    syms.resize(n);
}

void Bpe::merge_long(std::vector<int32_t>& syms) const {
    const int n = static_cast<int>(syms.size());
    std::vector<int> prev(n), next(n);
    for (int i = 0; i < n; ++i) {
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
        int32_t rank;
        int pos, right;
        int32_t left_id, right_id;
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int i) {
        if (i < 0) return;
        const int j = next[i];
        if (j < 0) return;
        if (const MergeTable::Entry* e = merges_.find(syms[i], syms[j])) heap.push({e->rank, i, j, syms[i], syms[j]});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    std::vector<char> alive(n, 1);
    while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        // Skip candidates made stale by an earlier merge.
        if (!alive[c.pos] || next[c.pos] != c.right || syms[c.pos] != c.left_id || syms[c.right] != c.right_id) continue;
        syms[c.pos] = merges_.find(c.left_id, c.right_id)->id;
        alive[c.right] = 0;
        next[c.pos] = next[c.right];
        if (next[c.pos] >= 0) prev[next[c.pos]] = c.pos;
        push(prev[c.pos]);
        push(c.pos);
    }
    std::vector<int32_t> out;
    for (int i = 0; i >= 0 && i < n; i = next[i]) out.push_back(syms[i]);
    syms.swap(out);
}

void Bpe::encode(std::string_view piece, bool byte_level, std::vector<int32_t>& out) const {
    if (piece.empty()) return;
    if (byte_level && piece.size() == 1 && byte_ids_[static_cast<unsigned char>(piece[0])] >= 0) {
        out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
        return;
    }
    if (ignore_merges_) {
        // A pre-token that is itself in the vocabulary is taken whole.
        std::string key;
        if (byte_level) {
            const auto& table = utf8::byte_to_unicode();
            for (char c : piece) key += table[static_cast<unsigned char>(c)];
        }
        const auto it = vocab.find(byte_level ? std::string_view(key) : piece);
        if (it != vocab.end()) {
            out.push_back(it->second);
            return;
        }
    }
    const bool cacheable = piece.size() <= kMaxCachedBytes;
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_->mu);
        const auto it = cache_->map.find(piece);
        if (it != cache_->map.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    thread_local std::vector<int32_t> syms;
    initial_symbols(piece, byte_level, syms);
    merge(syms);
    out.insert(out.end(), syms.begin(), syms.end());
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_->mu);
        if (cache_->map.size() >= kCacheEntries) cache_->map.clear();
        cache_->map.emplace(std::string(piece), syms);
    }
}

}  // namespace megactx::tok
