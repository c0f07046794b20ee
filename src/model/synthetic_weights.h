// Synthetic weights for benchmarks at shapes no disk here holds: one rank of GLM-5.2 under TP 8 + EP 8 is 91 GiB
// of FP8, the GPU machine's disk 64 GiB, and gen-model would take minutes to write it. The store holds gen-model's
// tensor list for a config (model_tensors) without writing it: every matrix points into a pool of random values of
// its dtype, at an offset of its own (distinct addresses, so a backend that keys its device copies by address
// uploads each weight once, as from a checkpoint), and every vector and block scale is generated. Matrices share
// their pool's values; what the benchmarks measure (bytes read, routing spread by a random router) does not depend
// on them. Values are not gen-model's: a synthetic model is for timing, never for checking numbers.
#pragma once

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace megactx {

// The tensors of config `c` with linears in `linear_dtype` (F32, BF16 or F8_E4M3, as gen-model --dtype).
std::unique_ptr<TensorStore> synthetic_store(const ModelConfig& c, DType linear_dtype, uint64_t seed);

}  // namespace megactx
