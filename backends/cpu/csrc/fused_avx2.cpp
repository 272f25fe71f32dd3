// AVX2 + F16C build of the element-wise layer kernels (fused_body.h, vectorised by the compiler).
// Deliberately without FMA: the reference rounds every product and sum, and so must these.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fused_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC: #pragma GCC target
#include <immintrin.h>

namespace paged_cpu {
namespace avx2_linear {
void linear(const LinearArgs& a, int64_t begin, int64_t end);  // linear_avx2.cpp (with FMA)
}  // namespace avx2_linear
}  // namespace paged_cpu

// System headers first, then the target pragma over this file's own code (see isa_avx512.cpp).
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#pragma GCC optimize("no-trapping-math")  // see fused_body.h
namespace paged_cpu {
namespace avx2_fused {
#include "fused_body.h"

// F16C: 8 values per instruction, round to nearest even; the last n % 8 through a padded row.
void f16_to_float_row(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  if (i < n) {
    alignas(16) uint16_t tail[8] = {};
    alignas(32) float out[8];
    std::memcpy(tail, src + i, static_cast<size_t>(n - i) * 2);
    _mm256_store_ps(out, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tail))));
    std::memcpy(dst + i, out, static_cast<size_t>(n - i) * 4);
  }
}

void float_to_f16_row(const float* src, int64_t n, uint16_t* dst) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRound));
  if (i < n) {
    alignas(32) float tail[8] = {};
    alignas(16) uint16_t out[8];
    std::memcpy(tail, src + i, static_cast<size_t>(n - i) * 4);
    _mm_store_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(_mm256_load_ps(tail), kRound));
    std::memcpy(dst + i, out, static_cast<size_t>(n - i) * 2);
  }
}

const FusedKernels kKernels{"avx2", &rms_any, &silu_any, &rotary_rows, &avx2_linear::linear};
}  // namespace avx2_fused
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const FusedKernels* avx2_fused_kernels() { return &avx2_fused::kKernels; }
}  // namespace paged_cpu
#else
namespace paged_cpu {
const FusedKernels* avx2_fused_kernels() { return nullptr; }
}  // namespace paged_cpu
#endif
