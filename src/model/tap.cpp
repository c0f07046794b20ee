#include "model/tap.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "io/npy.h"

namespace megactx {

Tap& Tap::instance() {
    static Tap t;
    return t;
}

Tap::Tap() {
    if (const char* d = std::getenv("MEGACTX_TAP_DIR")) {
        dir_ = d;
        std::filesystem::create_directories(dir_);
    }
}

void Tap::operator()(Ops& ops, const Tensor& t, const char* name, int64_t layer) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::I32) {
        std::vector<int32_t> iv(v.size());
        ops.download(t, iv.data());
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(iv[i]);
    } else {
        ops.download(t, v.data());
    }
    const std::string path = fmt::format("{}/f{:04d}_l{:02d}_{}.npy", dir_, std::max<int64_t>(forward_, 0),
                                         layer < 0 ? 99 : layer, name);
    write_npy_f32(path, t.shape, v.data());
}

}  // namespace megactx
