// Routed experts (moe_ops.cpp): the kernel pieces it borrows from the packed linear and the layer ops, and its own
// AVX2 build for dense expert rows (moe_avx2.cpp).
//
// No torch headers, like fused_api.h.
#pragma once

#include <cstdint>

#include "fused_api.h"

namespace paged_cpu {

// What quant_linear and silu_and_mul use right now (defined in fused_ops.cpp, which owns the ISA switches), so that
// an expert's product is the one quant_linear would compute for its rows: the packed-weight kernels, the q8 path's
// kernels, the int8 activation levels for q4_0 / q4_1 (0 exact fp32, 1 or 2), and the layer kernels.
const QuantKernels& quant_kernels_in_use();
const Q8Kernels& q8_kernels_in_use();
int q8_activation_levels();
const FusedKernels& fused_kernels_in_use();

// Rows [begin, end) of the gated GELU (tanh approximation) of h [rows, 2I] fp32 (row stride 2I), into out [rows, I].
using GeluFn = void (*)(const float* h, int64_t inter, float* out, int64_t begin, int64_t end);

// Dense expert rows read in place: QuantArgs with `w` the expert's [N, K] rows of `Elem` (ldw bytes apart, unit
// stride within a row), `format` unused; `stream[type]` computes features [begin, end) of every row of a.x, each
// output summed in an order fixed by K alone (quant_body.h's tiles: batch-invariant).
struct DenseKernels {
  const char* name;
  QuantFn stream[3];  // by Elem: F32, BF16, F16
  GeluFn gelu;
};

// The AVX2 + FMA + F16C build; nullptr when not built or the CPU lacks it.
const DenseKernels* avx2_dense_kernels();

}  // namespace paged_cpu
