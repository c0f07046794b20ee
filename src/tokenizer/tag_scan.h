// Tag scanning shared by the output parsers: the leftmost of several literal tags, and how much of a text's end
// must be held back because it may still become one of them. Internal to src/tokenizer.
#pragma once

#include <algorithm>
#include <array>
#include <string_view>
#include <utility>

namespace megactx::chat {

// Leftmost occurrence of any tag in s (from `from`): {position, tag}; {npos, ""} when none. Empty tags are
// skipped. No tag of one set is a prefix of another, so at most one matches at a position.
template <size_t N>
std::pair<size_t, std::string_view> find_tag(std::string_view s, const std::array<std::string_view, N>& tags,
                                             size_t from = 0) {
    std::pair<size_t, std::string_view> best{std::string_view::npos, {}};
    for (std::string_view t : tags) {
        if (t.empty()) continue;
        const size_t p = s.find(t, from);
        if (p < best.first) best = {p, t};
    }
    return best;
}

// Length of the longest suffix of s that is a proper prefix of one of the tags (text that may still become one).
template <size_t N>
size_t tag_holdback(std::string_view s, const std::array<std::string_view, N>& tags) {
    size_t best = 0;
    for (std::string_view t : tags)
        for (size_t k = std::min(t.size() - (t.empty() ? 0 : 1), s.size()); k > best; --k)
            if (s.substr(s.size() - k) == t.substr(0, k)) {
                best = k;
                break;
            }
    return best;
}

}  // namespace megactx::chat
