// NumPy .npy files (version 1.0, little-endian float32, C order): the `logits` output and test fixtures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megactx {

struct NpyArray {
    std::vector<int64_t> shape;
    std::vector<float> data;
};

// Writes to a temporary name and renames, so no partial file is left behind on failure.
void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const float* data);
// Reads '<f4' (or '<f8', converted) arrays in C order.
NpyArray read_npy_f32(const std::string& path);

}  // namespace megactx
