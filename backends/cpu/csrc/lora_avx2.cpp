// AVX2 + FMA + F16C multi-LoRA row kernels (lora_body.h): weights widened to fp32 in registers (bf16 by a
// shift, fp16 by F16C), four chains of 8-lane FMAs per dot product.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fused_api.h"
#include "lora_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC: #pragma GCC target
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace paged_cpu {
namespace avx2_lora {

#include "fused_body.h"

void f16_to_float_row(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = from_f16(src[i]);
}

void float_to_f16_row(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_f16(src[i]);
}

template <Elem W>
inline __m256 load8(const Store<W>* p) {
  if constexpr (W == Elem::F32) {
    return _mm256_loadu_ps(p);
  } else if constexpr (W == Elem::BF16) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

template <Elem W>
float dot(const float* x, const Store<W>* w, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load8<W>(w + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load8<W>(w + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), load8<W>(w + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), load8<W>(w + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load8<W>(w + i), a0);
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float sum = _mm_cvtss_f32(h);
  for (; i < n; ++i) sum += x[i] * load<W>(w, i);
  return sum;
}

// Eight dot products of x with consecutive rows of w at once: eight accumulators reduced together by a
// transposing tree of horizontal adds (7 instructions per 8 results instead of 4 per result).
template <Elem W>
void dots(const float* x, const Store<W>* w, int64_t n, int64_t count, float* out) {
  const int64_t body = n - n % 8;
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    __m256 acc[8];
    for (int q = 0; q < 8; ++q) acc[q] = _mm256_setzero_ps();
    for (int64_t i = 0; i < body; i += 8) {
      const __m256 xv = _mm256_loadu_ps(x + i);
      for (int q = 0; q < 8; ++q) acc[q] = _mm256_fmadd_ps(xv, load8<W>(w + (j + q) * n + i), acc[q]);
    }
    const __m256 h0 = _mm256_hadd_ps(acc[0], acc[1]), h1 = _mm256_hadd_ps(acc[2], acc[3]);
    const __m256 h2 = _mm256_hadd_ps(acc[4], acc[5]), h3 = _mm256_hadd_ps(acc[6], acc[7]);
    const __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3);
    __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
    if (body < n) {  // the last n % 8 terms of each row
      alignas(32) float tail[8];
      for (int q = 0; q < 8; ++q) {
        float t = 0.0f;
        for (int64_t i = body; i < n; ++i) t += x[i] * load<W>(w + (j + q) * n, i);
        tail[q] = t;
      }
      sum = _mm256_add_ps(sum, _mm256_load_ps(tail));
    }
    _mm256_storeu_ps(out + j, sum);
  }
  for (; j < count; ++j) out[j] = dot<W>(x, w + j * n, n);
}

#include "lora_body.h"

const LoraKernels kKernels{"avx2", &shrink, &expand};

}  // namespace avx2_lora
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const LoraKernels* avx2_lora_kernels() { return &avx2_lora::kKernels; }
}  // namespace paged_cpu

#else
namespace paged_cpu {
const LoraKernels* avx2_lora_kernels() { return nullptr; }
}  // namespace paged_cpu
#endif
