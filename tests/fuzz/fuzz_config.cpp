// libFuzzer target: arbitrary text as config.json. A megactx::Error is the expected answer to bad input; any other
// exception, a crash or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const megactx::ModelConfig c =
            megactx::parse_config_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
        // An accepted config has its per-layer facts resolved for every layer, and layer 0 is full.
        if (c.layer_full.size() != static_cast<size_t>(c.n_layers) ||
            c.layer_moe.size() != static_cast<size_t>(c.n_layers) || !c.layer_full[0])
            __builtin_trap();
    } catch (const megactx::Error&) {
    }
    return 0;
}
