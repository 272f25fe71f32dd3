// AVX-512 primitives (16 fp32 lanes), included by isa_avx512.cpp and isa_avx512bf16.cpp
// inside their namespace and target pragma. PAGED_CPU_BF16DOT selects AVX512-BF16 dot products.

#include "tiles.h"

#ifdef PAGED_CPU_BF16DOT
constexpr bool kBf16Dot = true;
#else
constexpr bool kBf16Dot = false;
#endif

inline __m512 load_bf16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// exp for x <= 0 (softmax after subtracting the max): range reduction by ln2, degree-6 polynomial.
inline __m512 exp_neg(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 y = _mm512_set1_ps(1.0f / 720);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 120));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 24));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 6));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// 16 quantized elements widened to fp32, unscaled: int8 as integers; float8_e5m2 is the upper byte of a
// float16; float8_e4m3fn's sign, exponent and mantissa bits are moved into float16's places without
// rebiasing the exponent, which is exact (subnormals included) and reads each value times 2**-8
// (staged_unit in kernel_api.h restores it through the scales).
template <KvType K>
inline __m512 load_q16(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (K == KvType::I8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
  const __m256i wide = _mm256_cvtepi8_epi16(raw);  // the byte's sign fills bits 15..8
  if constexpr (K == KvType::E5M2) return _mm512_cvtph_ps(_mm256_slli_epi16(wide, 8));
  // sign to bit 15 (and 14, cleared), exponent and mantissa to bits 13..7
  return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(wide, 7), _mm256_set1_epi16(static_cast<short>(0xBF80))));
}

// 16 stored elements of a cache of type K as fp32 (quantized ones unscaled, see load_q16).
template <KvType K>
inline __m512 load16(const void* base, int64_t i) {
  if constexpr (K == KvType::BF16) return load_bf16(static_cast<const uint16_t*>(base) + i);
  if constexpr (K == KvType::F16) return load_f16(static_cast<const uint16_t*>(base) + i);
  return load_q16<K>(static_cast<const uint8_t*>(base) + i);
}

inline __mmask16 tail_mask(int n) { return n >= 16 ? static_cast<__mmask16>(0xffff) : (1u << n) - 1u; }

// Lanes l with lo <= i + l < hi, for a block of 16 starting at i (lo - i < 16).
inline __mmask16 range_mask(int lo, int hi, int i) {
  const __mmask16 from = lo - i <= 0 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>(0xffffu << (lo - i));
  return from & tail_mask(hi - i);
}

template <KvType K, int D>
void stage_rows(const void* const* src, int n, float* dst) {
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < D; d += 16) _mm512_storeu_ps(dst + j * D + d, load16<K>(src[j], d));
}

// A group of 16 keys in the pair layout, staged to fp32: pair i of the group at dst[32 * i], 32 floats.
template <KvType K, int D>
void stage_pairs(const void* const* groups, int ng, int64_t pair_stride, float* dst) {
  for (int g = 0; g < ng; ++g) {
    for (int i = 0; i < D / 2; ++i, dst += 32) {
      _mm512_storeu_ps(dst, load16<K>(groups[g], i * pair_stride));
      _mm512_storeu_ps(dst + 16, load16<K>(groups[g], i * pair_stride + 16));
    }
  }
}

// n float16 scales (n a multiple of 16) as fp32 times mul.
inline void widen_f16(const uint16_t* h, int n, float mul, float* dst) {
  const __m512 m = _mm512_set1_ps(mul);
  for (int i = 0; i < n; i += 16) _mm512_storeu_ps(dst + i, _mm512_mul_ps(load_f16(h + i), m));
}

// Scores of R query rows against G fp32 key groups: lanes hold (key, dimension-pair half) products for
// 8 keys, so one pair's 32 floats are two registers; even and odd lanes are added at the end.
template <int D, int R, int G, typename Tick>
inline void dot_tile(const float* q, const float* const* groups, int64_t ps, float* s, int ld, Tick& tick) {
  __m512 lo[R][G], hi[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) lo[r][g] = hi[r][g] = _mm512_setzero_ps();
  for (int i = 0; i < D / 2; ++i) {
    __m512 kl[G], kh[G];
    for (int g = 0; g < G; ++g) {
      kl[g] = _mm512_loadu_ps(groups[g] + i * ps);
      kh[g] = _mm512_loadu_ps(groups[g] + i * ps + 16);
    }
    for (int r = 0; r < R; ++r) {
      double pair;
      __builtin_memcpy(&pair, q + r * D + 2 * i, 8);
      const __m512 qv = _mm512_castpd_ps(_mm512_set1_pd(pair));
      for (int g = 0; g < G; ++g) {
        lo[r][g] = _mm512_fmadd_ps(kl[g], qv, lo[r][g]);
        hi[r][g] = _mm512_fmadd_ps(kh[g], qv, hi[r][g]);
      }
    }
    tick();
  }
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g)
      _mm512_storeu_ps(s + r * ld + 16 * g, _mm512_add_ps(_mm512_permutex2var_ps(lo[r][g], even, hi[r][g]),
                                                          _mm512_permutex2var_ps(lo[r][g], odd, hi[r][g])));
}

// s[r][16 g + j] = q_r . key j of group g, for M rows and ng groups (all 16 lanes of a group are written).
template <int D, typename Tick>
void dot_pairs(const float* q, int M, const float* const* groups, int ng, int64_t ps, float* s, int ld, Tick& tick) {
  for_each_tile<4, 2>(M, ng, [&](auto rows, auto count, int r0, int g0) {
    dot_tile<D, decltype(rows)::value, decltype(count)::value>(q + r0 * D, groups + g0, ps, s + r0 * ld + 16 * g0,
                                                                 ld, tick);
  });
}

#ifdef PAGED_CPU_BF16DOT
// bf16 bits of 2**shift * 1.mantissa (mbits bits of it) * 2**exp, normalised, for a finite nonzero value.
constexpr uint16_t bf16_bits(int exp, int mantissa, int mbits) {
  while (mantissa < (1 << mbits)) {  // a subnormal: shift up until the leading one is the implicit bit
    mantissa <<= 1;
    --exp;
  }
  return static_cast<uint16_t>(((exp + 127) << 7) | ((mantissa - (1 << mbits)) << (7 - mbits)));
}

// The bf16 bits of each float8 magnitude byte (0..127) times staged_unit's inverse (E4M3: 2**-8, as load_q16).
template <KvType K>
struct Float8Table {
  alignas(64) uint16_t bits[128];
  constexpr Float8Table() : bits() {
    constexpr bool e4m3 = K == KvType::E4M3;
    constexpr int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 + 8 : 15, top = e4m3 ? 15 : 31;
    for (int m = 0; m < 128; ++m) {
      const int e = m >> mbits, f = m & ((1 << mbits) - 1);
      if (m == 0) {
        bits[m] = 0;
      } else if (e4m3 ? m == 127 : e == top) {
        bits[m] = !e4m3 && f == 0 ? 0x7F80 : 0x7FC0;  // e5m2: infinity and NaNs; e4m3fn: its one NaN
      } else {
        bits[m] = bf16_bits(e == 0 ? 1 - bias : e - bias, e == 0 ? f : f | (1 << mbits), mbits);
      }
    }
  }
};

template <KvType K>
constexpr Float8Table<K> kFloat8Table{};

// 32 stored elements of a cache of type K (from byte address p) as bf16: bf16 ones as they are, quantized ones
// widened exactly (int8 has 7 significant bits, the float8 formats 4 or 3; unscaled, see load_q16). Float8 bytes
// are looked up: the magnitude's 7 bits index a 128-entry table (two 64-entry permutes), the sign is copied.
template <KvType K>
inline __m512i load_bf16x32(const char* p) {
  if constexpr (K == KvType::BF16) {
    return _mm512_loadu_si512(p);
  } else if constexpr (K == KvType::I8) {
    const auto* b = reinterpret_cast<const __m128i*>(p);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b + 1)));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
  } else {
    const uint16_t* t = kFloat8Table<K>.bits;
    const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512i low = _mm512_permutex2var_epi16(_mm512_load_si512(t), w, _mm512_load_si512(t + 32));
    const __m512i high = _mm512_permutex2var_epi16(_mm512_load_si512(t + 64), w, _mm512_load_si512(t + 96));
    const __m512i mag = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40)), low, high);
    return _mm512_ternarylogic_epi32(mag, w, _mm512_set1_epi16(static_cast<short>(0x8000)), 0xF8);  // mag | (w & C)
  }
}

// Scores of R query rows against G key groups (cache type K, read as bf16): one register is dimension pair i
// of 16 keys, and vdpbf16ps against the row's broadcast pair adds that pair's products into the 16 keys' lanes.
// (groups are `const void*`: stores through the prefetcher's `const char*` members cannot alias them, so the
// compiler keeps them in registers across tick())
template <KvType K, int D, int R, int G, typename Tick>
__attribute__((always_inline)) inline void dot_tile_bf16(const uint16_t* qb, const void* const* groups, int64_t ps,
                                                         float* s, int ld, Tick& tick) {
  constexpr int64_t elem = kv_elem_bytes(K);
  __m512 acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  for (int i = 0; i < D / 2; ++i) {
    __m512i k[G];
    for (int g = 0; g < G; ++g) k[g] = load_bf16x32<K>(static_cast<const char*>(groups[g]) + i * ps * elem);
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      __builtin_memcpy(&pair, qb + r * D + 2 * i, 4);
      const __m512bh qv = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int g = 0; g < G; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], (__m512bh)k[g], qv);
    }
    tick();
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(s + r * ld + 16 * g, acc[r][g]);
}

// s[r][16 g + j] = q_r . key j of group g (groups: byte addresses in the cache, pair stride ps elements).
// Quantized keys are widened in registers while all M rows fit one row tile (a decode's GQA group);
// more rows would widen them once per tile, so they are widened once into `scratch` (CH * D bf16) instead.
template <KvType K, int D, typename Tick>
void dot_pairs_bf16(const uint16_t* qb, int M, const void* const* groups, int ng, int64_t ps, float* s, int ld,
                    Tick& tick, uint16_t* scratch) {
  constexpr int64_t elem = kv_elem_bytes(K);
  if (K != KvType::BF16 && M > 4) {
    const void* staged[kMaxChunk / kKeyGroup];
    for (int g = 0; g < ng; ++g) {
      uint16_t* dst = scratch + static_cast<int64_t>(g) * kKeyGroup * D;
      const auto* src = static_cast<const char*>(groups[g]);
      for (int i = 0; i < D / 2; ++i) _mm512_storeu_si512(dst + 32 * i, load_bf16x32<K>(src + i * ps * elem));
      staged[g] = dst;
    }
    dot_pairs_bf16<KvType::BF16, D>(qb, M, staged, ng, 32, s, ld, tick, scratch);
    return;
  }
  for_each_tile<4, 4>(M, ng, [&](auto rows, auto count, int r0, int g0) {
    dot_tile_bf16<K, D, decltype(rows)::value, decltype(count)::value>(qb + r0 * D, groups + g0, ps,
                                                                         s + r0 * ld + 16 * g0, ld, tick);
  });
}

inline void to_bf16(const float* x, int n, uint16_t* y) {
  for (int i = 0; i < n; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
    _mm256_mask_storeu_epi16(y + i, tail_mask(n - i), (__m256i)h);
  }
}

// acc[r] += sum_j p[r][j] * v_j with bf16 dot products over pairs of keys: the two keys' values (rows of cache
// type K at byte addresses vals[j], read as bf16) are interleaved (unpack lo/hi within 128-bit lanes) and
// weighted by the pair (p_j, p_j+1) in bf16. The accumulators end up in that interleaved order; finish_acc
// restores it. Needs D % 32 == 0. Quantized rows are widened in registers while all M rows fit one block of
// accumulators, else once into `scratch` (CH * D bf16).
template <KvType K, int D, typename Tick>
__attribute__((always_inline)) inline void axpy_rows_bf16(float* acc, int M, const float* p, int ld,
                                                          const void* const* vals, int n, Tick& tick,
                                                          uint16_t* scratch) {
  constexpr int NC = D / 32;
  constexpr int RB = 24 / (2 * NC) > 0 ? 24 / (2 * NC) : 1;  // rows whose accumulators fit in registers
  constexpr int64_t elem = kv_elem_bytes(K);
  if (K != KvType::BF16 && M > RB) {
    const void* staged[kMaxChunk];
    for (int j = 0; j < n; ++j) {
      uint16_t* dst = scratch + static_cast<int64_t>(j) * D;
      for (int c = 0; c < NC; ++c)
        _mm512_storeu_si512(dst + 32 * c, load_bf16x32<K>(static_cast<const char*>(vals[j]) + 32 * c));
      staged[j] = dst;
    }
    axpy_rows_bf16<KvType::BF16, D>(acc, M, p, ld, staged, n, tick, scratch);
    return;
  }
  alignas(64) uint16_t pb[RB][kMaxChunk + 2];
  for (int r0 = 0; r0 < M; r0 += RB) {
    const int rows = M - r0 < RB ? M - r0 : RB;
    __m512 lo[RB][NC], hi[RB][NC];
    for (int r = 0; r < rows; ++r) {
      to_bf16(p + (r0 + r) * ld, n, pb[r]);
      pb[r][n] = 0;  // pairs up an odd last key with a zero weight
      for (int c = 0; c < NC; ++c) {
        lo[r][c] = _mm512_loadu_ps(acc + (r0 + r) * D + 32 * c);
        hi[r][c] = _mm512_loadu_ps(acc + (r0 + r) * D + 32 * c + 16);
      }
    }
    for (int j = 0; j < n; j += 2) {
      const auto* a = static_cast<const char*>(vals[j]);
      const auto* b = j + 1 < n ? static_cast<const char*>(vals[j + 1]) : a;
      __m512i vl[NC], vh[NC];
      for (int c = 0; c < NC; ++c) {
        const __m512i va = load_bf16x32<K>(a + 32 * c * elem), vb = load_bf16x32<K>(b + 32 * c * elem);
        vl[c] = _mm512_unpacklo_epi16(va, vb);
        vh[c] = _mm512_unpackhi_epi16(va, vb);
      }
      for (int r = 0; r < rows; ++r) {
        uint32_t pair;
        __builtin_memcpy(&pair, &pb[r][j], 4);
        const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        for (int c = 0; c < NC; ++c) {
          lo[r][c] = _mm512_dpbf16_ps(lo[r][c], (__m512bh)vl[c], w);
          hi[r][c] = _mm512_dpbf16_ps(hi[r][c], (__m512bh)vh[c], w);
        }
      }
      tick();
    }
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < NC; ++c) {
        _mm512_storeu_ps(acc + (r0 + r) * D + 32 * c, lo[r][c]);
        _mm512_storeu_ps(acc + (r0 + r) * D + 32 * c + 16, hi[r][c]);
      }
    }
  }
}

// Undo axpy_rows_bf16's interleaving: in lane L of a 32-value chunk, lo holds d = 8L..8L+3, hi d = 8L+4..8L+7.
template <int D>
void finish_acc(float* acc, int M) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t i = 0; i < static_cast<int64_t>(M) * D; i += 32) {
    const __m512 lo = _mm512_loadu_ps(acc + i), hi = _mm512_loadu_ps(acc + i + 16);
    _mm512_storeu_ps(acc + i, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(acc + i + 16, _mm512_permutex2var_ps(lo, second, hi));
  }
}
#else
template <KvType K, int D, typename Tick>
void dot_pairs_bf16(const uint16_t*, int, const void* const*, int, int64_t, float*, int, Tick&, uint16_t*) {}
inline void to_bf16(const float*, int, uint16_t*) {}
template <KvType K, int D, typename Tick>
void axpy_rows_bf16(float*, int, const float*, int, const void* const*, int, Tick&, uint16_t*) {}
template <int D>
void finish_acc(float*, int) {}
#endif

// acc[r] += sum_j p[r][j] * v_j, in segments of at most 8 registers of accumulators.
template <int D, typename Tick>
void axpy_rows(float* acc, int M, const float* p, int ld, const float* const* vals, int n, Tick& tick) {
  constexpr int SEG = D % 128 == 0 ? 128 : D;  // 64, 80, 96: one segment; 128, 256: segments of 128
  for (int r = 0; r < M; ++r) {
    for (int d0 = 0; d0 < D; d0 += SEG) {
      float* a = acc + r * D + d0;
      __m512 av[SEG / 16];
      for (int c = 0; c < SEG / 16; ++c) av[c] = _mm512_loadu_ps(a + 16 * c);
      for (int j = 0; j < n; ++j) {
        const __m512 w = _mm512_set1_ps(p[r * ld + j]);
        const float* v = vals[j] + d0;
        for (int c = 0; c < SEG / 16; ++c) av[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 16 * c), av[c]);
        tick();
      }
      for (int c = 0; c < SEG / 16; ++c) _mm512_storeu_ps(a + 16 * c, av[c]);
    }
  }
}

// cap * tanh(x / cap), with tanh(a) = sign(a) (1 - e) / (1 + e), e = exp(-2 |a|).
inline __m512 soft_cap(__m512 x, __m512 cap, __m512 inv_cap) {
  const __m512 a = _mm512_mul_ps(x, inv_cap);
  const __m512 mag = _mm512_abs_ps(a);
  const __m512 e = exp_neg(_mm512_mul_ps(mag, _mm512_set1_ps(-2.0f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __m512 sign = _mm512_and_ps(a, _mm512_set1_ps(-0.0f));
  return _mm512_mul_ps(cap, _mm512_or_ps(t, sign));
}

// x[lo, hi) *= scale (then soft-capped when cap > 0); returns their max. Blocks of 16 start at multiples of 16
// from x, so every score keeps its lane whatever lo is.
inline float scale_max(float* x, int lo, int hi, float scale, float cap) {
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(-INFINITY);
  if (cap > 0.0f) {
    const __m512 cv = _mm512_set1_ps(cap), inv = _mm512_set1_ps(1.0f / cap);
    for (int i = lo & ~15; i < hi; i += 16) {
      const __mmask16 k = range_mask(lo, hi, i);
      const __m512 v = soft_cap(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), sc), cv, inv);
      _mm512_mask_storeu_ps(x + i, k, v);
      m = _mm512_mask_max_ps(m, k, m, v);
    }
    return _mm512_reduce_max_ps(m);
  }
  for (int i = lo & ~15; i < hi; i += 16) {
    const __mmask16 k = range_mask(lo, hi, i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), sc);
    _mm512_mask_storeu_ps(x + i, k, v);
    m = _mm512_mask_max_ps(m, k, m, v);
  }
  return _mm512_reduce_max_ps(m);
}

// x[lo, hi) = exp(x - sub); returns their sum, each lane summing the scores of its own key positions.
inline float exp_sum(float* x, int lo, int hi, float sub) {
  const __m512 sv = _mm512_set1_ps(sub);
  __m512 total = _mm512_setzero_ps();
  for (int i = lo & ~15; i < hi; i += 16) {
    const __mmask16 k = range_mask(lo, hi, i);
    const __m512 e = exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), sv));
    _mm512_mask_storeu_ps(x + i, k, e);
    total = _mm512_mask_add_ps(total, k, total, e);
  }
  return _mm512_reduce_add_ps(total);
}

inline void scale_vec(float* x, int n, float a) {
  const __m512 av = _mm512_set1_ps(a);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), av));
  }
}

#include "attention_impl.h"
