// AVX2 + FMA linear over the packed panels of fused_api.h: a register tile of up to 6 rows x 16
// features, weights widened to fp32 in registers (bf16 by a shift or a mask, fp16 by F16C), each
// activation broadcast from fp32. Small tiles keep several k steps in flight, so that one or two
// rows still have 8 independent FMA chains (decode is one row per sequence).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "fused_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC: #pragma GCC target
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace paged_cpu {
namespace avx2_linear {

#include "fused_body.h"

template <Elem W>
inline void load_panel_row(const Store<W>* p, __m256& lo, __m256& hi) {
  if constexpr (W == Elem::F32) {
    lo = _mm256_loadu_ps(p);
    hi = _mm256_loadu_ps(p + 8);
  } else if constexpr (W == Elem::BF16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  } else {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
}

// Calls f(integral_constant<int, i>) for i = 0 .. N-1, as straight-line code: every accumulator index
// below is a constant from the start, so the accumulators live in registers (loops over a register
// array of more than 3 rows were left in memory by GCC, with a store per FMA).
template <int N, typename F>
inline void unrolled(const F& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>()), ...); }(
      std::make_integer_sequence<int, N>());
}

// out[R][16] = x rows r0 .. r0 + R against one panel.
template <Elem W, int R>
void panel_tile(const LinearArgs& a, const Store<W>* panel, int64_t r0, float* out) {
  constexpr int U = R == 1 ? 4 : (R == 2 ? 2 : 1);  // k steps in flight
  const float* x = a.x + r0 * a.ldx;
  const int64_t ldx = a.ldx, kn = a.in_features;
  __m256 acc[U * R * 2];
  unrolled<U * R * 2>([&](auto i) { acc[i] = _mm256_setzero_ps(); });
  auto step = [&](auto u, int64_t k) {
    __m256 lo, hi;
    load_panel_row<W>(panel + k * kPanel, lo, hi);
    unrolled<R>([&](auto r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * ldx + k);
      acc[(u * R + r) * 2] = _mm256_fmadd_ps(lo, xb, acc[(u * R + r) * 2]);
      acc[(u * R + r) * 2 + 1] = _mm256_fmadd_ps(hi, xb, acc[(u * R + r) * 2 + 1]);
    });
  };
  int64_t k = 0;
  for (; k + U <= kn; k += U) unrolled<U>([&](auto u) { step(u, k + u); });
  for (; k < kn; ++k) step(std::integral_constant<int, 0>(), k);
  unrolled<R>([&](auto r) {
    __m256 lo = acc[r * 2], hi = acc[r * 2 + 1];
    unrolled<U - 1>([&](auto u) {
      lo = _mm256_add_ps(lo, acc[((u + 1) * R + r) * 2]);
      hi = _mm256_add_ps(hi, acc[((u + 1) * R + r) * 2 + 1]);
    });
    _mm256_storeu_ps(out + r * kPanel, lo);
    _mm256_storeu_ps(out + r * kPanel + 8, hi);
  });
}

template <Elem W>
void linear_panels(const LinearArgs& a, int64_t begin, int64_t end) {
  alignas(32) float acc[kMaxTileRows * kPanel];
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

}  // namespace avx2_linear
}  // namespace paged_cpu
#pragma GCC pop_options
#endif
