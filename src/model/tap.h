// Debug taps (style.md): with the environment variable MEGACTX_TAP_DIR set, every named intermediate of the
// forward pass is written as DIR/f{forward:04d}_l{layer:02d}_{name}.npy (float32; int32 tensors converted),
// so a diff against a reference finds the first wrong layer. Off (one branch per tap) otherwise.
#pragma once

#include <cstdint>
#include <string>

#include "ops/ops.h"

namespace megactx {

class Tap {
public:
    static Tap& instance();
    bool enabled() const { return !dir_.empty() && !muted(); }
    // Mutes taps on the calling thread (tensor-parallel followers: only rank 0's intermediates are written).
    static void mute_this_thread() { muted() = true; }
    void begin_forward() { ++forward_; }
    void operator()(Ops& ops, const Tensor& t, const char* name, int64_t layer = -1);

private:
    Tap();
    static bool& muted() {
        thread_local bool m = false;
        return m;
    }
    std::string dir_;
    int64_t forward_ = -1;
};

inline void tap(Ops& ops, const Tensor& t, const char* name, int64_t layer = -1) {
    Tap& tp = Tap::instance();
    if (tp.enabled()) tp(ops, t, name, layer);
}

}  // namespace megactx
