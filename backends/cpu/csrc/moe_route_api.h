// The routing kernel's exp (moe_route.cpp, moe_route_exp.cpp): torch's vectorized float exp, lane for lane.
//
// No torch headers, like fused_api.h.
#pragma once

#include <cstdint>

namespace paged_cpu {

// out[i] = exp(x[i] - shift) for i < n, each lane computed as torch's Vectorized<float>::exp() computes it for the
// CPU capability it dispatches to (SLEEF's expf, 16 or 8 lanes), so that a softmax built on it has torch's bits.
using ExpShiftedFn = void (*)(const float* x, float shift, float* out, int64_t n);

// The AVX-512 (16 lanes) and AVX2 (8 lanes) builds; nullptr where not built (not x86-64 GCC).
ExpShiftedFn route_exp_avx512();
ExpShiftedFn route_exp_avx2();

}  // namespace paged_cpu
