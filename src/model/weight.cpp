#include "model/weight.h"

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

std::vector<float> load_vector(const TensorStore& store, const std::string& name, int64_t n) {
    const Weight w = load_weight(store, name, n, 0);
    std::vector<float> out(static_cast<size_t>(n));
    w.row_f32(0, out.data());
    return out;
}

}  // namespace megactx
