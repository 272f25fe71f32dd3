// The routing kernel's exp (moe_route_api.h): SLEEF's vector expf, which torch exports and its Vectorized<float>::exp()
// calls, so each lane is torch's. A partial vector is padded with zeros, as Vectorized::loadu(ptr, count) pads (lanes
// are independent, so the padding changes no used lane).
#include <cstdint>
#include <cstring>

#include "moe_route_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC: #pragma GCC target
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
extern "C" __m512 Sleef_expf16_u10(__m512);  // libtorch_cpu's SLEEF (the entry Vectorized<float>::exp() calls)

namespace paged_cpu {
namespace {

void exp_shifted_avx512(const float* x, float shift, float* out, int64_t n) {
  const __m512 s = _mm512_set1_ps(shift);
  for (int64_t i = 0; i < n; i += 16) {
    alignas(64) float lanes[16] = {};
    const int64_t m = n - i < 16 ? n - i : 16;
    std::memcpy(lanes, x + i, sizeof(float) * m);
    _mm512_store_ps(lanes, Sleef_expf16_u10(_mm512_sub_ps(_mm512_load_ps(lanes), s)));
    std::memcpy(out + i, lanes, sizeof(float) * m);
  }
}

}  // namespace
}  // namespace paged_cpu
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
extern "C" __m256 Sleef_expf8_u10(__m256);

namespace paged_cpu {
namespace {

void exp_shifted_avx2(const float* x, float shift, float* out, int64_t n) {
  const __m256 s = _mm256_set1_ps(shift);
  for (int64_t i = 0; i < n; i += 8) {
    alignas(32) float lanes[8] = {};
    const int64_t m = n - i < 8 ? n - i : 8;
    std::memcpy(lanes, x + i, sizeof(float) * m);
    _mm256_store_ps(lanes, Sleef_expf8_u10(_mm256_sub_ps(_mm256_load_ps(lanes), s)));
    std::memcpy(out + i, lanes, sizeof(float) * m);
  }
}

}  // namespace
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
ExpShiftedFn route_exp_avx512() { return &exp_shifted_avx512; }
ExpShiftedFn route_exp_avx2() { return &exp_shifted_avx2; }
}  // namespace paged_cpu
#else
namespace paged_cpu {
ExpShiftedFn route_exp_avx512() { return nullptr; }
ExpShiftedFn route_exp_avx2() { return nullptr; }
}  // namespace paged_cpu
#endif
