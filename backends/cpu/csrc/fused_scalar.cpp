// Portable layer kernels: the element-wise ops of fused_body.h and a linear over the packed panels,
// as plain loops the compiler vectorises for the build target (any CPU, aarch64 included).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fused_api.h"

#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")  // see fused_body.h
namespace paged_cpu {
namespace scalar_fused {

#include "fused_body.h"

void f16_to_float_row(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_f16(src[i]);
}

void float_to_f16_row(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_f16(src[i]);
}

// acc[R][16] = x rows r0 .. r0 + R against one panel.
template <Elem W, int R>
void panel_tile(const LinearArgs& a, const Store<W>* panel, int64_t r0, float* acc) {
  const float* x = a.x + r0 * a.ldx;
  for (int i = 0; i < R * kPanel; ++i) acc[i] = 0.0f;
  for (int64_t k = 0; k < a.in_features; ++k) {
    float w[kPanel];
    panel_row<W>(panel + k * kPanel, w);
    for (int r = 0; r < R; ++r) {
      const float xv = x[r * a.ldx + k];
      for (int j = 0; j < kPanel; ++j) acc[r * kPanel + j] += xv * w[j];
    }
  }
}

template <Elem W>
void linear_panels(const LinearArgs& a, int64_t begin, int64_t end) {
  float acc[kMaxTileRows * kPanel];
  for (int64_t p = begin; p < end; ++p) {
    const Store<W>* panel = static_cast<const Store<W>*>(a.w) + p * a.in_features * kPanel;
    for_row_tiles(a.rows, [&](auto rows, int64_t r0) {
      panel_tile<W, decltype(rows)::value>(a, panel, r0, acc);
      store_panel(a, acc, decltype(rows)::value, r0, p);
    });
  }
}

void linear(const LinearArgs& a, int64_t begin, int64_t end) {
  switch (a.w_type) {
    case Elem::F32: linear_panels<Elem::F32>(a, begin, end); break;
    case Elem::BF16: linear_panels<Elem::BF16>(a, begin, end); break;
    case Elem::F16: linear_panels<Elem::F16>(a, begin, end); break;
  }
}

void hadamard_vector(const void* in, void* out, Elem type, int64_t d, int64_t b, float scale, float* scratch) {
  hadamard_vector_loops(in, out, type, d, b, scale, scratch);
}

const FusedKernels kKernels{"scalar", &rms_any, &silu_any, &rotary_rows, &linear, &hadamard_any};

}  // namespace scalar_fused
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const FusedKernels* scalar_fused_kernels() { return &scalar_fused::kKernels; }

}  // namespace paged_cpu
