// libFuzzer target: arbitrary bytes as a safetensors file image. A megactx::Error is the expected answer to bad
// input; any other exception, a crash or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const auto tensors = megactx::SafetensorsFile::parse(data, size, "fuzz.safetensors");
        for (const auto& [name, t] : tensors) {
            // Every accepted tensor must lie inside the input and agree with its dtype and shape.
            if (t.data < data || t.data + t.nbytes > data + size) __builtin_trap();
            if (t.dtype_known && static_cast<size_t>(t.numel()) * megactx::dtype_size(t.dtype) != t.nbytes)
                __builtin_trap();
        }
    } catch (const megactx::Error&) {
    }
    return 0;
}
