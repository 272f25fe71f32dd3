// AVX-512 (F, BW, VL, DQ) + FMA + F16C build of the packed-weight linear (quant_body.h): 16-lane vectors
// as zmm registers, so every decoded weight vector and every fused multiply-add covers twice the AVX2
// build's weights. Used only when set_quant_isa("avx512") asks for it (fused_ops.cpp says why).
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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#pragma GCC optimize("no-trapping-math")  // see fused_body.h
namespace paged_cpu {
namespace avx512_quant {

#include "fused_body.h"

#define PAGED_FORCE_INLINE __attribute__((always_inline))

constexpr int kLanes = 16;
constexpr int kVecRegs = 32;

using VF = __m512;
using VI = __m512i;

PAGED_FORCE_INLINE inline VF vzero() { return _mm512_setzero_ps(); }
PAGED_FORCE_INLINE inline VF vset1(float s) { return _mm512_set1_ps(s); }
PAGED_FORCE_INLINE inline VF vload(const float* p) { return _mm512_loadu_ps(p); }
PAGED_FORCE_INLINE inline void vstore(float* p, VF a) { _mm512_storeu_ps(p, a); }
PAGED_FORCE_INLINE inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
PAGED_FORCE_INLINE inline VF vmul(VF a, VF b) { return _mm512_mul_ps(a, b); }
PAGED_FORCE_INLINE inline VF vadd(VF a, VF b) { return _mm512_add_ps(a, b); }
// The two 256-bit halves added: 8 partial sums, then as the AVX2 build reduces them.
PAGED_FORCE_INLINE inline __m256 fold(VF a) {
  return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
// vsum and vsum4 reduce the folded 8 lanes by one tree (as the AVX2 build's), so an output summed by
// either has the same bits (batch invariance, quant_body.h).
PAGED_FORCE_INLINE inline float vsum(VF v) {
  const __m256 a = fold(v);
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, a), _mm256_hadd_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}
PAGED_FORCE_INLINE inline void vsum4(VF a, VF b, VF c, VF d, float* out) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(fold(a), fold(b)), _mm256_hadd_ps(fold(c), fold(d)));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}
PAGED_FORCE_INLINE inline VI vu8(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
PAGED_FORCE_INLINE inline VI vi8(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
PAGED_FORCE_INLINE inline VI vand(VI a, int m) { return _mm512_and_si512(a, _mm512_set1_epi32(m)); }
PAGED_FORCE_INLINE inline VI vsrl(VI a, int n) { return _mm512_srli_epi32(a, static_cast<unsigned>(n)); }
PAGED_FORCE_INLINE inline VI vsll(VI a, int n) { return _mm512_slli_epi32(a, static_cast<unsigned>(n)); }
PAGED_FORCE_INLINE inline VI vor(VI a, VI b) { return _mm512_or_si512(a, b); }
PAGED_FORCE_INLINE inline VI vsubi(VI a, int s) { return _mm512_sub_epi32(a, _mm512_set1_epi32(s)); }
PAGED_FORCE_INLINE inline VF vcvt(VI a) { return _mm512_cvtepi32_ps(a); }
PAGED_FORCE_INLINE inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
PAGED_FORCE_INLINE inline VF vset1_f16(const uint8_t* p) { return vset1(f16_at(p)); }

#include "quant_body.h"

// No q8 path of its own: the VNNI build of quant_avx2.cpp runs it on 256-bit vectors (fused_ops.cpp).
const QuantKernels kKernels{"avx512", &quant_stream, &quant_dequant_dot, nullptr};

}  // namespace avx512_quant
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const QuantKernels* avx512_quant_kernels() { return &avx512_quant::kKernels; }
}  // namespace paged_cpu
#else
namespace paged_cpu {
const QuantKernels* avx512_quant_kernels() { return nullptr; }
}  // namespace paged_cpu
#endif
