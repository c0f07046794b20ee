// Tensor: a shaped view of backend memory (host for the CPU backend, device for CUDA) with shared
// ownership of its storage. Activations are fp32; indices int32. Shapes are outermost first.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace megactx {

struct Tensor {
    std::shared_ptr<void> storage;
    void* data = nullptr;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;

    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
    int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
    float* f32() const {
        MEGACTX_CHECK(dtype == DType::F32, "tensor: expected F32, got {}", dtype_name(dtype));
        return static_cast<float*>(data);
    }
    int32_t* i32() const {
        MEGACTX_CHECK(dtype == DType::I32, "tensor: expected I32, got {}", dtype_name(dtype));
        return static_cast<int32_t*>(data);
    }
};

// Rows [r0, r1) of t (outermost dimension) as a view of the same memory.
inline Tensor row_range(const Tensor& t, int64_t r0, int64_t r1) {
    MEGACTX_CHECK(0 <= r0 && r0 <= r1 && r1 <= t.dim(0), "row_range: rows [{}, {}) of {}", r0, r1, t.dim(0));
    Tensor v = t;
    const int64_t row_bytes = t.dim(0) > 0 ? t.numel() / t.dim(0) * static_cast<int64_t>(dtype_size(t.dtype)) : 0;
    v.data = static_cast<uint8_t*>(t.data) + r0 * row_bytes;
    v.shape[0] = r1 - r0;
    return v;
}

}  // namespace megactx
