// AVX2 + FMA + F16C kernels (8 fp32 lanes) for x86-64 CPUs without AVX-512.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernel_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC: #pragma GCC target
#include <immintrin.h>

// See isa_avx512.cpp: system headers first, then the target pragma over this file's own code.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace paged_cpu {
namespace avx2 {

constexpr bool kBf16Dot = false;

#include "tiles.h"

inline __m256 load_bf16(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline __m256 load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// exp for x <= 0: range reduction by ln2, degree-6 polynomial, 2^n built in the exponent bits.
inline __m256 exp_neg(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 y = _mm256_set1_ps(1.0f / 720);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 120));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 24));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 6));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(0.5f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// 8 quantized elements widened to fp32, unscaled (as load_q16 of isa_avx512_body.h: E4M3 reads 2**-8 times
// its value).
template <KvType K>
inline __m256 load_q8(const uint8_t* p) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  if constexpr (K == KvType::I8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
  const __m128i wide = _mm_cvtepi8_epi16(raw);
  if constexpr (K == KvType::E5M2) return _mm256_cvtph_ps(_mm_slli_epi16(wide, 8));
  return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(wide, 7), _mm_set1_epi16(static_cast<short>(0xBF80))));
}

// 8 stored elements of a cache of type K as fp32 (quantized ones unscaled).
template <KvType K>
inline __m256 load8(const void* base, int64_t i) {
  if constexpr (K == KvType::BF16) return load_bf16(static_cast<const uint16_t*>(base) + i);
  if constexpr (K == KvType::F16) return load_f16(static_cast<const uint16_t*>(base) + i);
  return load_q8<K>(static_cast<const uint8_t*>(base) + i);
}

template <KvType K, int D>
void stage_rows(const void* const* src, int n, float* dst) {
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(dst + j * D + d, load8<K>(src[j], d));
}

// A group of 16 keys in the pair layout, staged to fp32: pair i of the group at dst[32 * i], 32 floats.
template <KvType K, int D>
void stage_pairs(const void* const* groups, int ng, int64_t pair_stride, float* dst) {
  for (int g = 0; g < ng; ++g)
    for (int i = 0; i < D / 2; ++i, dst += 32)
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(dst + 8 * c, load8<K>(groups[g], i * pair_stride + 8 * c));
}

// n float16 scales (n a multiple of 8) as fp32 times mul.
inline void widen_f16(const uint16_t* h, int n, float mul, float* dst) {
  const __m256 m = _mm256_set1_ps(mul);
  for (int i = 0; i < n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(load_f16(h + i), m));
}

// Scores of R query rows against one fp32 key group: one pair's 32 floats are four registers of 4 keys'
// (even, odd) products; hadd and a lane permute put the 16 sums in key order.
template <int D, int R, int G, typename Tick>
inline void dot_tile(const float* q, const float* const* groups, int64_t ps, float* s, int ld, Tick& tick) {
  static_assert(G == 1, "AVX2 tiles hold one key group");
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int i = 0; i < D / 2; ++i) {
    __m256 k[4];
    for (int c = 0; c < 4; ++c) k[c] = _mm256_loadu_ps(groups[0] + i * ps + 8 * c);
    for (int r = 0; r < R; ++r) {
      const __m256 qv = _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(q + r * D + 2 * i)));
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_fmadd_ps(k[c], qv, acc[r][c]);
    }
    tick();
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      const __m256 sums = _mm256_hadd_ps(acc[r][2 * h], acc[r][2 * h + 1]);  // keys 0 1 4 5 | 2 3 6 7
      _mm256_storeu_ps(s + r * ld + 8 * h, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(sums), 0xD8)));
    }
}

// s[r][16 g + j] = q_r . key j of group g, for M rows and ng groups (all 16 lanes of a group are written).
template <int D, typename Tick>
void dot_pairs(const float* q, int M, const float* const* groups, int ng, int64_t ps, float* s, int ld, Tick& tick) {
  for_each_tile<2, 1>(M, ng, [&](auto rows, auto count, int r0, int g0) {
    dot_tile<D, decltype(rows)::value, decltype(count)::value>(q + r0 * D, groups + g0, ps, s + r0 * ld + 16 * g0,
                                                                 ld, tick);
  });
}

template <KvType K, int D, typename Tick>
void dot_pairs_bf16(const uint16_t*, int, const void* const*, int, int64_t, float*, int, Tick&, uint16_t*) {}
inline void to_bf16(const float*, int, uint16_t*) {}
template <KvType K, int D, typename Tick>
void axpy_rows_bf16(float*, int, const float*, int, const void* const*, int, Tick&, uint16_t*) {}
template <int D>
void finish_acc(float*, int) {}

// acc[r] += sum_j p[r][j] * v_j, in segments of 8 registers of accumulators (16 are architectural).
template <int D, typename Tick>
void axpy_rows(float* acc, int M, const float* p, int ld, const float* const* vals, int n, Tick& tick) {
  constexpr int SEG = D % 64 == 0 ? 64 : (D % 48 == 0 ? 48 : 40);
  for (int r = 0; r < M; ++r) {
    for (int d0 = 0; d0 < D; d0 += SEG) {
      float* a = acc + r * D + d0;
      __m256 av[SEG / 8];
      for (int c = 0; c < SEG / 8; ++c) av[c] = _mm256_loadu_ps(a + 8 * c);
      for (int j = 0; j < n; ++j) {
        const __m256 w = _mm256_set1_ps(p[r * ld + j]);
        const float* v = vals[j] + d0;
        for (int c = 0; c < SEG / 8; ++c) av[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * c), av[c]);
        tick();
      }
      for (int c = 0; c < SEG / 8; ++c) _mm256_storeu_ps(a + 8 * c, av[c]);
    }
  }
}

// cap * tanh(x / cap), with tanh(a) = sign(a) (1 - e) / (1 + e), e = exp(-2 |a|).
inline __m256 soft_cap(__m256 x, __m256 cap, __m256 inv_cap) {
  const __m256 a = _mm256_mul_ps(x, inv_cap);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 e = exp_neg(_mm256_mul_ps(_mm256_andnot_ps(sign_bit, a), _mm256_set1_ps(-2.0f)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  return _mm256_mul_ps(cap, _mm256_or_ps(t, _mm256_and_ps(sign_bit, a)));
}

// Lanes l with i + l >= lo as an all-ones mask, for a block of 8 starting at i.
inline __m256 lanes_from(int lo, int i) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo - i - 1)));
}

// x[lo, hi) *= scale (then soft-capped when cap > 0); returns their max. Whole blocks of 8 (from multiples of 8,
// so a score's path depends on its own position only) go through vectors, the last few through scalars.
inline float scale_max(float* x, int lo, int hi, float scale, float cap) {
  const __m256 sc = _mm256_set1_ps(scale), cv = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
  __m256 m = _mm256_set1_ps(-INFINITY);
  int i = lo & ~7;
  for (; i + 8 <= hi; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sc);
    if (cap > 0.0f) v = soft_cap(v, cv, inv);
    _mm256_storeu_ps(x + i, v);  // lanes before lo are zeroed by the caller
    m = _mm256_max_ps(m, i < lo ? _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, lanes_from(lo, i)) : v);
  }
  float tmp[8];
  _mm256_storeu_ps(tmp, m);
  float best = tmp[0];
  for (int k = 1; k < 8; ++k) best = tmp[k] > best ? tmp[k] : best;
  for (i = i > lo ? i : lo; i < hi; ++i) {
    x[i] *= scale;
    if (cap > 0.0f) x[i] = cap * std::tanh(x[i] / cap);
    best = x[i] > best ? x[i] : best;
  }
  return best;
}

inline float exp_sum(float* x, int lo, int hi, float sub) {
  const __m256 sv = _mm256_set1_ps(sub);
  __m256 total = _mm256_setzero_ps();
  int i = lo & ~7;
  for (; i + 8 <= hi; i += 8) {
    __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), sv));
    if (i < lo) e = _mm256_and_ps(e, lanes_from(lo, i));
    _mm256_storeu_ps(x + i, e);
    total = _mm256_add_ps(total, e);
  }
  float rest = hsum(total);
  for (i = i > lo ? i : lo; i < hi; ++i) {
    x[i] = std::exp(x[i] - sub);
    rest += x[i];
  }
  return rest;
}

inline void scale_vec(float* x, int n, float a) {
  const __m256 av = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), av));
  for (; i < n; ++i) x[i] *= a;
}

#include "attention_impl.h"

const IsaKernels kKernels{"avx2", &attend_item};

}  // namespace avx2
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const IsaKernels* avx2_kernels() { return &avx2::kKernels; }
}  // namespace paged_cpu
#else
namespace paged_cpu {
const IsaKernels* avx2_kernels() { return nullptr; }
}  // namespace paged_cpu
#endif
