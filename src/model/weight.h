// A checkpoint matrix as the ops read it: [rows, cols] in the checkpoint's dtype, memory-mapped, with
// optional FP8 128×128 block scales (model-spec §7.2: W[i,j] = W8[i,j] · scale_inv[i/128, j/128]).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace megactx {

class TensorStore;

struct Weight {
    std::string name;
    DType dtype = DType::F32;
    int64_t rows = 0, cols = 0;
    const uint8_t* data = nullptr;  // no alignment guarantee (read through convert_to_f32)
    std::shared_ptr<const std::vector<uint8_t>> owned;  // set when `data` is a copy (a shard), not the mapping
    std::vector<float> scale_inv;   // FP8 only: [ceil(rows/128), ceil(cols/128)]
    int64_t block = 128;

    bool empty() const { return data == nullptr; }
    // Dequantizes row r into out[cols] (fp32).
    void row_f32(int64_t r, float* out) const;
    // Dequantizes rows [r0, r0 + n) into out[n, cols].
    void rows_f32(int64_t r0, int64_t n, float* out) const;
};

// Loads `name` ([rows, cols], or [rows] when cols == 0) and its `<stem>.weight_scale_inv` if present; checks
// shapes and dtypes and names the tensor in every error.
Weight load_weight(const TensorStore& store, const std::string& name, int64_t rows, int64_t cols);
// Rows [r0, r1) and columns [c0, c1) of `w` (a tensor-parallel shard), copied into memory the Weight owns, so
// a shard never aliases another weight's data. An FP8 shard keeps its 128×128 scale blocks when it starts and
// ends on them (real checkpoints); otherwise it is widened to F32, exactly. The whole matrix returns `w`.
Weight slice_weight(const Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1);
// A 1-D fp32 vector (norm weights, biases), converted from any supported dtype.
std::vector<float> load_vector(const TensorStore& store, const std::string& name, int64_t n);

}  // namespace megactx
