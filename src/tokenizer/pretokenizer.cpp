// Pre-tokenizers: Split, ByteLevel, Digits and Sequence, with the Rust tokenizers library's split behaviours.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace megactx::tok {

namespace {

// GPT-2's pre-tokenization regex, as the ByteLevel pre-tokenizer applies it when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

bool get_bool(const nlohmann::json& j, const char* key, bool fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    return j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

Behavior parse_behavior(const nlohmann::json& j, const std::string& where) {
    const std::string b = j.value("behavior", std::string("Isolated"));
    if (b == "Removed") return Behavior::Removed;
    if (b == "Isolated") return Behavior::Isolated;
    if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
    if (b == "MergedWithNext") return Behavior::MergedWithNext;
    if (b == "Contiguous") return Behavior::Contiguous;
    MEGACTX_FAIL("{}: pre_tokenizer Split has unsupported behavior '{}' (expected Removed, Isolated, "
                 "MergedWithPrevious, MergedWithNext or Contiguous)",
                 where, b);
}

size_t char_len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

}  // namespace

void PreTokenizer::build(const nlohmann::json& j, const std::string& where) {
    if (j.is_null()) return;
    add(j, where);
    for (size_t i = 0; i + 1 < steps_.size(); ++i) {
        MEGACTX_CHECK(!steps_[i].byte_level,
                      "{}: pre_tokenizer ByteLevel followed by another pre-tokenizer is not supported", where);
    }
    byte_level_ = !steps_.empty() && steps_.back().byte_level;
}

void PreTokenizer::add(const nlohmann::json& j, const std::string& where) {
    MEGACTX_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
                  "{}: pre_tokenizer entry without a 'type': {}", where, j.dump().substr(0, 200));
    const std::string type = j["type"].get<std::string>();
    if (type == "Sequence") {
        MEGACTX_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(),
                      "{}: pre_tokenizer Sequence without a 'pretokenizers' list", where);
        for (const auto& p : j["pretokenizers"]) add(p, where);
    } else if (type == "Split") {
        Step s;
        MEGACTX_CHECK(j.contains("pattern") && j["pattern"].is_object(), "{}: pre_tokenizer Split without 'pattern'",
                      where);
        const auto& p = j["pattern"];
        if (p.contains("Regex") && p["Regex"].is_string()) {
            s.re = std::make_shared<Regex>(p["Regex"].get<std::string>(), false, where + ": pre_tokenizer Split");
        } else if (p.contains("String") && p["String"].is_string()) {
            s.re = std::make_shared<Regex>(p["String"].get<std::string>(), true, where + ": pre_tokenizer Split");
        } else {
            MEGACTX_FAIL("{}: pre_tokenizer Split pattern must hold 'Regex' or 'String': {}", where, p.dump());
        }
        s.behavior = parse_behavior(j, where);
        s.invert = get_bool(j, "invert", false);
        steps_.push_back(std::move(s));
    } else if (type == "ByteLevel") {
        Step s;
        s.byte_level = true;
        s.add_prefix_space = get_bool(j, "add_prefix_space", true);
        if (get_bool(j, "use_regex", true)) s.re = std::make_shared<Regex>(kGpt2Pattern, false, where + ": ByteLevel");
        steps_.push_back(std::move(s));
    } else if (type == "Digits") {
        // Rust splits on char::is_numeric (general category N): one piece per digit, or per run of digits.
        Step s;
        const bool individual = get_bool(j, "individual_digits", false);
        s.re = std::make_shared<Regex>(individual ? "\\p{N}" : "\\p{N}+", false, where + ": Digits");
        steps_.push_back(std::move(s));
    } else {
        MEGACTX_FAIL("{}: unsupported pre_tokenizer type '{}' (supported: Split, ByteLevel, Digits, Sequence)", where,
                     type);
    }
}

void PreTokenizer::split(const Step& s, std::string_view piece, std::vector<std::string_view>& out) const {
    struct Seg {
        size_t b, e;
        bool match;
    };
    thread_local std::vector<Seg> segs;
    segs.clear();
    const size_t n = piece.size();
    size_t prev = 0, start = 0, b = 0, e = 0;
    while (start <= n && s.re->find(piece, start, b, e)) {
        if (b > prev) segs.push_back({prev, b, false});
        segs.push_back({b, e, true});
        prev = e;
        if (e > b) {
            start = e;
        } else {
            if (b >= n) break;
            start = b + char_len(static_cast<unsigned char>(piece[b]));  // step past an empty match
        }
    }
    if (prev < n) segs.push_back({prev, n, false});
    if (s.invert) {
        for (auto& g : segs) g.match = !g.match;
    }
    auto emit = [&](size_t from, size_t to) {
        if (to > from) out.push_back(piece.substr(from, to - from));
    };
    // The Rust library's fold for the merging behaviours: a segment for which join(is_match, previous is_match)
    // holds extends the last piece, any other starts a new one; MergedWithNext walks from the end.
    auto fold = [&](bool backwards, auto join) {
        std::vector<std::pair<size_t, size_t>> acc;
        bool prev_match = false;
        for (size_t k = 0; k < segs.size(); ++k) {
            const Seg& g = segs[backwards ? segs.size() - 1 - k : k];
            if (join(g.match, prev_match) && !acc.empty()) {
                (backwards ? acc.back().first : acc.back().second) = backwards ? g.b : g.e;
            } else {
                acc.push_back({g.b, g.e});
            }
            prev_match = g.match;
        }
        if (backwards) std::reverse(acc.begin(), acc.end());
        for (const auto& [x, y] : acc) emit(x, y);
    };
    switch (s.behavior) {
        case Behavior::Isolated:
            for (const auto& g : segs) emit(g.b, g.e);
            break;
        case Behavior::Removed:
            for (const auto& g : segs) {
                if (!g.match) emit(g.b, g.e);
            }
            break;
        case Behavior::MergedWithPrevious:
            // A delimiter joins the piece before it (unless that piece was itself a delimiter).
            fold(false, [](bool match, bool prev_match) { return match && !prev_match; });
            break;
        case Behavior::MergedWithNext:
            // The mirror image: a delimiter joins the piece after it.
            fold(true, [](bool match, bool prev_match) { return match && !prev_match; });
            break;
        case Behavior::Contiguous:
            // Adjacent segments of the same kind join.
            fold(false, [](bool match, bool prev_match) { return match == prev_match; });
            break;
    }
}

void PreTokenizer::run(std::string_view text, std::vector<std::string_view>& out,
                       std::deque<std::string>& scratch) const {
    out.clear();
    if (text.empty()) return;
    out.push_back(text);
    thread_local std::vector<std::string_view> next;
    for (const Step& s : steps_) {
        next.clear();
        for (std::string_view piece : out) {
            if (s.byte_level && s.add_prefix_space && piece.front() != ' ') {
                std::string& spaced = scratch.emplace_back();
                spaced.reserve(piece.size() + 1);
                spaced += ' ';
                spaced += piece;
                piece = spaced;
            }
            if (s.re) {
                split(s, piece, next);
            } else {
                next.push_back(piece);
            }
        }
        out.swap(next);
    }
}

}  // namespace megactx::tok
