// Portable multi-LoRA row kernels (lora_body.h) with a plain dot product the compiler may vectorise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fused_api.h"
#include "lora_api.h"

namespace paged_cpu {
namespace scalar_lora {

#include "fused_body.h"

void f16_to_float_row(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_f16(src[i]);
}

void float_to_f16_row(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_f16(src[i]);
}

// 8 independent partial sums, added pairwise at the end.
template <Elem W>
float dot(const float* x, const Store<W>* w, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j] * load<W>(w, i + j);
  for (; i < n; ++i) acc[0] += x[i] * load<W>(w, i);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

template <Elem W>
void dots(const float* x, const Store<W>* w, int64_t n, int64_t count, float* out) {
  for (int64_t j = 0; j < count; ++j) out[j] = dot<W>(x, w + j * n, n);
}

#include "lora_body.h"

const LoraKernels kKernels{"scalar", &shrink, &expand};

}  // namespace scalar_lora

const LoraKernels* scalar_lora_kernels() { return &scalar_lora::kKernels; }

}  // namespace paged_cpu
