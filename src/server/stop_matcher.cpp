#include "server/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace megactx {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
    for (const auto& s : stops_) max_len_ = std::max(max_len_, s.size());
}

std::string StopMatcher::push(const std::string& piece, bool* matched) {
    *matched = false;
    if (matched_) return "";
    held_ += piece;
    size_t first = std::string::npos;
    for (const auto& s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
        matched_ = true;
        *matched = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }
    if (max_len_ == 0) return std::exchange(held_, "");
    // Keep the last max_len - 1 bytes (a stop string could still start there), moved back to a character start.
    if (held_.size() < max_len_) return "";
    size_t cut = held_.size() - (max_len_ - 1);
    while (cut > 0 && (static_cast<unsigned char>(held_[cut]) & 0xC0) == 0x80) --cut;
    std::string out = held_.substr(0, cut);
    held_.erase(0, cut);
    return out;
}

std::string StopMatcher::flush() {
    if (matched_) return "";
    return std::exchange(held_, "");
}

}  // namespace megactx
