// AVX2 + FMA + F16C build of the packed-weight linear (quant_body.h): 8-lane vectors as ymm registers,
// bytes widened with vpmovzxbd / vpmovsxbd, fp16 scales converted with F16C.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "fused_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC: #pragma GCC target
#include <immintrin.h>

// System headers first, then the target pragma over this file's own code (see isa_avx512.cpp).
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("no-trapping-math")  // see fused_body.h
namespace paged_cpu {
namespace avx2_quant {

#include "fused_body.h"

using VF = __m256;
using VI = __m256i;

inline VF vzero() { return _mm256_setzero_ps(); }
inline VF vset1(float s) { return _mm256_set1_ps(s); }
inline VF vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VF a) { _mm256_storeu_ps(p, a); }
inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF vmul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF vadd(VF a, VF b) { return _mm256_add_ps(a, b); }
inline float vsum(VF a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline VI vu8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline VI vi8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline VI vand(VI a, int m) { return _mm256_and_si256(a, _mm256_set1_epi32(m)); }
inline VI vsrl(VI a, int n) { return _mm256_srli_epi32(a, n); }
inline VI vsll(VI a, int n) { return _mm256_slli_epi32(a, n); }
inline VI vor(VI a, VI b) { return _mm256_or_si256(a, b); }
inline VI vsubi(VI a, int s) { return _mm256_sub_epi32(a, _mm256_set1_epi32(s)); }
inline VF vcvt(VI a) { return _mm256_cvtepi32_ps(a); }
inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

#include "quant_body.h"

const QuantKernels kKernels{"avx2", &quant_stream, &quant_dequant_dot};

}  // namespace avx2_quant
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const QuantKernels* avx2_quant_kernels() { return &avx2_quant::kKernels; }
}  // namespace paged_cpu
#else
namespace paged_cpu {
const QuantKernels* avx2_quant_kernels() { return nullptr; }
}  // namespace paged_cpu
#endif
