// The interface between the multi-LoRA ops (lora_ops.cpp) and their per-ISA row kernels (lora_scalar.cpp,
// lora_avx2.cpp). No torch headers: the kernel files are compiled for their own instruction sets.
//
// The row kernels serve tokens whose adapter run is too short for a GEMM (decode batches mixing adapters):
// one token at a time, its row widened to fp32, the adapter's A or B read in place in its dtype and
// widened in registers. Sums are fp32; nothing is rounded before the single rounding of y.
#pragma once

#include <cstdint>

#include "fused_api.h"

namespace paged_cpu {

// shrink: out[t, r] = x[t] . a[slots[t], r] for the tokens tokens[begin, end) (each with slots[t] >= 0).
struct LoraShrinkArgs {
  const void* x;          // row t at x + t * ldx elements, unit stride within a row
  int64_t ldx;
  Elem x_type;
  const void* a;          // [S, R, K] contiguous
  Elem a_type;
  int64_t rank;           // R
  int64_t in_features;    // K
  const int64_t* tokens;  // the token indices to compute
  const int64_t* slots;   // [T]
  float* out;             // [T, R] contiguous fp32
};

// expand: y[t, n] = round(y[t, n] + shrunk[t] . b[slots[t], n]) for the tokens tokens[begin, end).
struct LoraExpandArgs {
  void* y;                // row t at y + t * ldy elements, unit stride within a row
  int64_t ldy;
  Elem y_type;
  const float* shrunk;    // row t at shrunk + t * lds, unit stride
  int64_t lds;
  const void* b;          // [S, N, R] contiguous
  Elem b_type;
  int64_t rank;           // R
  int64_t out_features;   // N
  const int64_t* tokens;
  const int64_t* slots;
};

using LoraShrinkFn = void (*)(const LoraShrinkArgs&, int64_t begin, int64_t end);
using LoraExpandFn = void (*)(const LoraExpandArgs&, int64_t begin, int64_t end);

struct LoraKernels {
  const char* name;
  LoraShrinkFn shrink;
  LoraExpandFn expand;
};

const LoraKernels* scalar_lora_kernels();
const LoraKernels* avx2_lora_kernels();  // nullptr when not built (non-x86 or not GCC)

}  // namespace paged_cpu
