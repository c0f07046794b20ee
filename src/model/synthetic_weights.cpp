#include "model/synthetic_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "core/error.h"
#include "model/gen_model.h"

namespace megactx {

namespace {

// splitmix64; an approximately normal value from four 16-bit uniforms (Irwin-Hall, variance 1): fast enough for a
// 2 GB pool, and bounded (|z| <= 3.5), so FP8 values never saturate.
uint64_t next(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
float normal(uint64_t& s) {
    const uint64_t r = next(s);
    float sum = 0.0f;
    for (int i = 0; i < 4; ++i) sum += static_cast<float>((r >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
    return (sum - 2.0f) * 1.7320508f;
}

// FP8 matrices hold e4m3(kFp8Scale · z); their weight_scale_inv 1 / (kFp8Scale · sqrt(cols)) makes the weight's
// standard deviation 1 / sqrt(cols), as gen-model's.
constexpr float kFp8Scale = 64.0f;
constexpr size_t kStride = 64;  // bytes between two matrices' first bytes in a pool

struct Memory {
    std::map<DType, std::vector<uint8_t>> pools;         // matrices' values by dtype
    std::map<int64_t, std::vector<float>> scales;        // block scales by the matrix's block columns
    std::vector<std::vector<uint8_t>> vectors;           // norms and biases, one each
};

void fill_pool(std::vector<uint8_t>& pool, DType t, float std, uint64_t seed) {
    const size_t n = pool.size() / dtype_size(t);
    constexpr size_t kChunk = size_t{1} << 16;
#pragma omp parallel for schedule(static)
    for (size_t c0 = 0; c0 < n; c0 += kChunk) {
        uint64_t s = seed ^ (c0 * 0xd1b54a32d192ed03ull);
        for (size_t i = c0; i < std::min(n, c0 + kChunk); ++i) {
            const float z = normal(s);
            if (t == DType::F8_E4M3) {
                pool[i] = f32_to_fp8e4m3(kFp8Scale * z);
            } else if (t == DType::BF16) {
                const uint16_t h = f32_to_bf16(std * z);
                std::memcpy(pool.data() + 2 * i, &h, 2);
            } else {
                const float f = std * z;
                std::memcpy(pool.data() + 4 * i, &f, 4);
            }
        }
    }
}

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::unique_ptr<TensorStore> synthetic_store(const ModelConfig& c, DType linear_dtype, uint64_t seed) {
    MEGACTX_CHECK(linear_dtype == DType::F32 || linear_dtype == DType::BF16 || linear_dtype == DType::F8_E4M3,
                  "synthetic weights: linears must be f32, bf16 or fp8");
    const std::vector<TensorToWrite> plan = model_tensors(c, linear_dtype, seed, false);
    auto mem = std::make_shared<Memory>();
    // Each pool: its largest matrix plus kStride bytes per matrix, so every matrix starts at a distinct address.
    std::map<DType, std::pair<size_t, size_t>> need;  // dtype -> (largest matrix bytes, matrices)
    for (const TensorToWrite& t : plan) {
        if (ends_with(t.name, ".weight_scale_inv")) {  // one array of scales per block-column count, sized first
            std::vector<float>& s = mem->scales[t.shape[1]];
            s.resize(std::max(s.size(), static_cast<size_t>(t.shape[0] * t.shape[1])),
                     1.0f / (kFp8Scale * std::sqrt(static_cast<float>(t.shape[1] * 128))));
            continue;
        }
        if (t.shape.size() != 2) continue;
        auto& [largest, count] = need[t.dtype];
        largest = std::max(largest, static_cast<size_t>(t.shape[0] * t.shape[1]) * dtype_size(t.dtype));
        ++count;
    }
    // bf16 / f32 matrices (embeddings, LM head, router, indexer gates, MTP projection in an FP8 model) all read the
    // hidden state: values of standard deviation 1 / sqrt(hidden).
    const float std_h = 1.0f / std::sqrt(static_cast<float>(c.hidden_size));
    uint64_t pool_seed = seed * 0x9e3779b97f4a7c15ull + 1;
    for (const auto& [t, n] : need) {
        std::vector<uint8_t>& pool = mem->pools[t];
        pool.resize(n.first + n.second * kStride);
        fill_pool(pool, t, std_h, pool_seed++);
    }
    std::map<DType, size_t> used;  // matrices placed per pool
    std::map<std::string, TensorInfo> infos;
    uint64_t vec_seed = seed ^ 0x5eed5eed5eedull;
    for (const TensorToWrite& t : plan) {
        TensorInfo info;
        info.name = t.name;
        info.file = "(synthetic)";
        info.dtype_name = dtype_name(t.dtype);
        info.dtype_known = true;
        info.dtype = t.dtype;
        info.shape = t.shape;
        info.nbytes = static_cast<size_t>(info.numel()) * dtype_size(t.dtype);
        if (ends_with(t.name, ".weight_scale_inv")) {
            info.data = reinterpret_cast<const uint8_t*>(mem->scales[t.shape[1]].data());
        } else if (t.shape.size() == 2) {
            size_t& k = used[t.dtype];
            info.data = mem->pools[t.dtype].data() + kStride * k++;
        } else {
            // Norm weights around 1, biases around 0 (gen-model's means and spread).
            const bool norm = ends_with(t.name, "norm.weight");
            std::vector<uint8_t> b(info.nbytes);
            for (int64_t i = 0; i < t.shape[0]; ++i) {
                const float v = (norm ? 1.0f : 0.0f) + 0.1f * normal(vec_seed);
                if (t.dtype == DType::BF16) {
                    const uint16_t h = f32_to_bf16(v);
                    std::memcpy(b.data() + 2 * i, &h, 2);
                } else {
                    std::memcpy(b.data() + 4 * i, &v, 4);
                }
            }
            mem->vectors.push_back(std::move(b));
            info.data = mem->vectors.back().data();
        }
        infos.emplace(t.name, std::move(info));
    }
    return std::make_unique<TensorStore>(fmt::format("synthetic {} model", dtype_name(linear_dtype)), std::move(infos),
                                         std::move(mem));
}

}  // namespace megactx
