// A half-open range of indices [begin, end): heads, columns, experts, layers.
#pragma once

#include <cstdint>

namespace megactx {

struct Range {
    int64_t begin = 0, end = 0;
    int64_t size() const { return end - begin; }
    bool contains(int64_t i) const { return begin <= i && i < end; }
    bool operator==(const Range&) const = default;
};

}  // namespace megactx
