// Rotary position embedding as one model applies it (model-spec §2.4): the frequencies, the factor on cos and
// sin, and which dims pair up. io/config.cpp resolves it from config.json (plain RoPE or YaRN); the ops apply it.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace megactx {

struct Rope {
    std::vector<float> inv_freq;  // [dim / 2]: pair i turns by pos · inv_freq[i] (fp32 angle, as transformers)
    float scale = 1.0f;           // cos and sin are multiplied by it (YaRN's attention factor; 1 for plain RoPE)
    bool interleaved = true;      // pairs (2i, 2i+1); false: (i, i + dim/2), the half-split (NeoX) layout

    int64_t dim() const { return 2 * static_cast<int64_t>(inv_freq.size()); }

    // Plain RoPE: inv_freq[i] = 1 / theta^(2i/dim), in fp32 as transformers computes it.
    static Rope plain(float theta, int64_t dim, bool interleaved = true) {
        Rope r;
        r.interleaved = interleaved;
        r.inv_freq.resize(static_cast<size_t>(dim / 2));
        for (int64_t i = 0; i < dim / 2; ++i) {
            r.inv_freq[static_cast<size_t>(i)] =
                1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
        }
        return r;
    }
};

}  // namespace megactx
