#include "model/weight.h"

#include <cstring>

#include "core/error.h"
#include "io/safetensors.h"

namespace megactx {

void Weight::row_f32(int64_t r, float* out) const {
    const size_t esize = dtype_size(dtype);
    convert_to_f32(dtype, data + static_cast<size_t>(r * cols) * esize, out, static_cast<size_t>(cols));
    if (!scale_inv.empty()) {
        const int64_t n_col_blocks = (cols + block - 1) / block;
        const float* s = scale_inv.data() + (r / block) * n_col_blocks;
        for (int64_t j = 0; j < cols; ++j) out[j] *= s[j / block];
    }
}

void Weight::rows_f32(int64_t r0, int64_t n, float* out) const {
    for (int64_t i = 0; i < n; ++i) row_f32(r0 + i, out + i * cols);
}

static std::string scale_name(const std::string& name) {
    const std::string suffix = ".weight";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        return name.substr(0, name.size() - suffix.size()) + ".weight_scale_inv";
    }
    return name + "_scale_inv";
}

Weight load_weight(const TensorStore& store, const std::string& name, int64_t rows, int64_t cols) {
    const TensorInfo& t = cols > 0 ? store.get(name, {rows, cols}) : store.get(name, {rows});
    MEGACTX_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16 ||
                      t.dtype == DType::F8_E4M3,
                  "{}: tensor '{}' has dtype {}; weights must be F32, BF16, F16 or F8_E4M3", t.file, name,
                  t.dtype_name);
    Weight w;
    w.name = name;
    w.dtype = t.dtype;
    w.rows = rows;
    w.cols = cols > 0 ? cols : rows;
    if (cols == 0) w.rows = 1;
    w.data = t.data;
    const std::string sname = scale_name(name);
    if (t.dtype == DType::F8_E4M3) {
        MEGACTX_CHECK(store.has(sname), "{}: FP8 tensor '{}' has no block scales '{}'", t.file, name, sname);
        const int64_t br = (w.rows + w.block - 1) / w.block, bc = (w.cols + w.block - 1) / w.block;
        const TensorInfo& s = store.get(sname, {br, bc});
        MEGACTX_CHECK(s.dtype == DType::F32 || s.dtype == DType::BF16,
                      "{}: block scales '{}' have dtype {}; expected F32 or BF16", s.file, sname, s.dtype_name);
        w.scale_inv.resize(static_cast<size_t>(br * bc));
        convert_to_f32(s.dtype, s.data, w.scale_inv.data(), w.scale_inv.size());
    } else {
        MEGACTX_CHECK(!store.has(sname), "{}: tensor '{}' is {} but has block scales '{}' (only F8_E4M3 is scaled)",
                      t.file, name, t.dtype_name, sname);
    }
    return w;
}

Weight slice_weight(const Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    MEGACTX_CHECK(0 <= r0 && r0 < r1 && r1 <= w.rows && 0 <= c0 && c0 < c1 && c1 <= w.cols,
                  "{}: shard rows [{}, {}) cols [{}, {}) outside [{}, {}]", w.name, r0, r1, c0, c1, w.rows, w.cols);
    if (r0 == 0 && r1 == w.rows && c0 == 0 && c1 == w.cols) return w;
    const auto on_block = [&](int64_t x, int64_t end) { return x % w.block == 0 || x == end; };
    if (!w.scale_inv.empty() &&
        !(on_block(r0, w.rows) && on_block(r1, w.rows) && on_block(c0, w.cols) && on_block(c1, w.cols))) {
        // An FP8 shard off the scale-block grid (small test models): widened to F32, exactly (e4m3 · scale fits).
        Weight s = w;
        s.rows = r1 - r0;
        s.cols = c1 - c0;
        s.dtype = DType::F32;
        s.scale_inv.clear();
        auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(s.rows * s.cols) * 4);
        std::vector<float> row(static_cast<size_t>(w.cols));
        for (int64_t r = 0; r < s.rows; ++r) {
            w.row_f32(r0 + r, row.data());
            std::memcpy(buf->data() + static_cast<size_t>(r * s.cols) * 4, row.data() + c0, static_cast<size_t>(s.cols) * 4);
        }
        s.data = buf->data();
        s.owned = std::move(buf);
        return s;
    }
    Weight s = w;
    s.rows = r1 - r0;
    s.cols = c1 - c0;
    const size_t esize = dtype_size(w.dtype), row_bytes = static_cast<size_t>(s.cols) * esize;
    auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(s.rows) * row_bytes);
    for (int64_t r = 0; r < s.rows; ++r) {
        std::memcpy(buf->data() + static_cast<size_t>(r) * row_bytes,
                    w.data + (static_cast<size_t>(r0 + r) * static_cast<size_t>(w.cols) + static_cast<size_t>(c0)) * esize,
                    row_bytes);
    }
    s.data = buf->data();
    s.owned = std::move(buf);
    if (!w.scale_inv.empty()) {
        const int64_t bc = (w.cols + w.block - 1) / w.block;
        const int64_t sr0 = r0 / w.block, sr1 = (r1 + w.block - 1) / w.block;
        const int64_t sc0 = c0 / w.block, sc1 = (c1 + w.block - 1) / w.block;
        s.scale_inv.clear();
        for (int64_t i = sr0; i < sr1; ++i)
            for (int64_t j = sc0; j < sc1; ++j) s.scale_inv.push_back(w.scale_inv[static_cast<size_t>(i * bc + j)]);
    }
    return s;
}

std::vector<float> load_vector(const TensorStore& store, const std::string& name, int64_t n) {
    const Weight w = load_weight(store, name, n, 0);
    std::vector<float> out(static_cast<size_t>(n));
    w.row_f32(0, out.data());
    return out;
}

}  // namespace megactx
