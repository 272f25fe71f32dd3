// Quantized KV caches: write_kv's int8 / float8 path (the rule of paged_core.contract.kv_quant).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace paged_cpu {

// Quantizes each [T, KVH, D] key and value vector with its own float16 scale, bit for bit as
// paged_core.api.quantize_kv does (scale = float16(max|x| / QMAX), at least 2**-24; elements
// clamp(x / scale, -QMAX, QMAX) rounded half to even for int8, cast as torch casts for float8), into the
// layout of kernel_api.h: data bytes in the tile (keys in pairs), the scale in the tile's scale row.
// `slot` holds T checked slots (-1: skipped).
void write_kv_quantized(const at::Tensor& key, const at::Tensor& value, const at::Tensor& kv_cache,
                        const int64_t* slot);

}  // namespace paged_cpu
