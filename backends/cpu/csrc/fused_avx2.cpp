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

// Stages 1, 2 and 4 of an 8-lane vector: the partner lanes by a permute, both the sums and the differences
// computed, each lane keeping the one it owns (the low lane of a pair its sum lo + hi, the high lane lo - hi).
template <int kHigh>
inline __m256 stage_in_register(__m256 x, __m256 partner) {
  return _mm256_blend_ps(_mm256_add_ps(x, partner), _mm256_sub_ps(partner, x), kHigh);
}

// 8 values of type E to fp32 and back (bf16: the top half of the fp32 bits; round to nearest even, a NaN kept
// quiet, as to_bf16; fp16: F16C, round to nearest even, as float_to_f16_row).
template <Elem E>
inline __m256 load8(const Store<E>* p) {
  if constexpr (E == Elem::F32) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (E == Elem::F16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <Elem E>
inline void store8(Store<E>* p, __m256 x) {
  if constexpr (E == Elem::F32) {
    _mm256_storeu_ps(p, x);
  } else if constexpr (E == Elem::F16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    const __m256i b = _mm256_castps_si256(x);
    const __m256i high = _mm256_srli_epi32(b, 16);
    const __m256i odd = _mm256_and_si256(high, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
    const __m256i nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    const __m256i is_nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    // Pack the 32-bit lanes (each below 2^16) to 16 bits: packus works per 128-bit half, so gather halves 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
}

// One block of B values (a power of two, 8 to 128) loaded into registers r and every stage applied.
template <Elem E, int B>
inline void block_stages(const Store<E>* in, __m256* r) {
  constexpr int N = B / 8;
#pragma GCC unroll 16
  for (int k = 0; k < N; ++k) {
    __m256 x = load8<E>(in + 8 * k);
    x = stage_in_register<0xAA>(x, _mm256_permute_ps(x, 0xB1));       // h = 1: lanes 1 0 3 2 ...
    x = stage_in_register<0xCC>(x, _mm256_permute_ps(x, 0x4E));       // h = 2: lanes 2 3 0 1 ...
    x = stage_in_register<0xF0>(x, _mm256_permute2f128_ps(x, x, 1));  // h = 4: the 128-bit halves swapped
    r[k] = x;
  }
  // h = 8, 16, ...: whole registers k and k + h / 8.
#pragma GCC unroll 16
  for (int h = 1; h < N; h *= 2)
#pragma GCC unroll 16
    for (int k = 0; k < N; ++k)
      if ((k & h) == 0) {
        const __m256 lo = r[k], hi = r[k + h];
        r[k] = _mm256_add_ps(lo, hi);
        r[k + h] = _mm256_sub_ps(lo, hi);
      }
}

template <Elem E, int B>
inline void hadamard_block(const Store<E>* in, Store<E>* out, __m256 scale) {
  __m256 r[B / 8];
  block_stages<E, B>(in, r);
#pragma GCC unroll 16
  for (int k = 0; k < B / 8; ++k) store8<E>(out + 8 * k, _mm256_mul_ps(r[k], scale));
}

template <Elem E>
void hadamard_typed(const Store<E>* in, Store<E>* out, int64_t d, int64_t b, float scale, float* v) {
  const __m256 s = _mm256_set1_ps(scale);
  switch (b) {
    case 8: for (int64_t i = 0; i < d; i += 8) hadamard_block<E, 8>(in + i, out + i, s); return;
    case 16: for (int64_t i = 0; i < d; i += 16) hadamard_block<E, 16>(in + i, out + i, s); return;
    case 32: for (int64_t i = 0; i < d; i += 32) hadamard_block<E, 32>(in + i, out + i, s); return;
    case 64: for (int64_t i = 0; i < d; i += 64) hadamard_block<E, 64>(in + i, out + i, s); return;
    case 128: for (int64_t i = 0; i < d; i += 128) hadamard_block<E, 128>(in + i, out + i, s); return;
    default: break;
  }
  if (b < 8) {  // d no multiple of a vector
    hadamard_loops<E>(in, out, d, b, scale, v);
    return;
  }
  // Blocks wider than the registers hold: stages up to 64 per 128 values in registers, the rest in fp32 scratch.
  for (int64_t i = 0; i < d; i += 128) {
    __m256 r[16];
    block_stages<E, 128>(in + i, r);
    for (int k = 0; k < 16; ++k) _mm256_storeu_ps(v + i + 8 * k, r[k]);
  }
  hadamard_stages(v, d, 128, b);
  hadamard_store<E>(v, out, d, scale);
}

void hadamard_vector(const void* in, void* out, Elem type, int64_t d, int64_t b, float scale, float* scratch) {
  switch (type) {
    case Elem::F32:
      hadamard_typed<Elem::F32>(static_cast<const float*>(in), static_cast<float*>(out), d, b, scale, scratch);
      break;
    case Elem::BF16:
      hadamard_typed<Elem::BF16>(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), d, b, scale, scratch);
      break;
    case Elem::F16:
      hadamard_typed<Elem::F16>(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), d, b, scale, scratch);
      break;
  }
}

const FusedKernels kKernels{"avx2", &rms_any, &silu_any, &rotary_rows, &avx2_linear::linear, &hadamard_any};
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
