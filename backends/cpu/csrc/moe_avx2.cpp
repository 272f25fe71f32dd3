// AVX2 + FMA + F16C build of what the routed experts need beyond the packed linear (moe_api.h): dense expert rows
// (fp32, bf16, fp16) read in place by quant_body.h's streaming tiles, and the gated tanh-GELU.
//
// Dense rows are one more "format" of quant_body.h: a block of 32 weights is 32 elements, decoded by widening to
// fp32. One build only (the q4 / q8 paths and their ISA variants stay in quant_avx2.cpp): dense experts are
// memory-bound at decode, where 8 lanes already outrun one core's share of the bandwidth.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "moe_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC: #pragma GCC target
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("no-trapping-math")  // see fused_body.h
namespace paged_cpu {
namespace avx2_moe {

#include "fused_body.h"

#define PAGED_FORCE_INLINE __attribute__((always_inline))

#include "quant_avx2_prims.h"

constexpr int kVecRegs = 16;

#include "quant_body.h"

// 8 elements of a dense row at p, widened to fp32 (bf16: the top halves of fp32 words, exact; fp16: F16C, exact).
template <Elem E>
PAGED_FORCE_INLINE inline VF vdense(const Store<E>* p) {
  if constexpr (E == Elem::F32) {
    return _mm256_loadu_ps(p);
  } else if constexpr (E == Elem::BF16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

// Dense rows as a quant_body.h format: blocks of 32 elements, the last K % 32 one by one (kTail).
template <Elem E>
struct FmtDense {
  static constexpr int kBlock = 32, kBytes = 32 * static_cast<int>(sizeof(Store<E>)), kStep = 32;
  static constexpr bool kTail = true, kFeatureOuter = true, kPrefetch = true;
  struct State {};
  struct Scales {};
  PAGED_FORCE_INLINE static void prepare(const uint8_t*, const QuantArgs&, int64_t, State&) {}
  PAGED_FORCE_INLINE static Scales scales(const uint8_t*, const State&, int) { return {}; }
  template <int V>
  PAGED_FORCE_INLINE static VF decode(const uint8_t* b, const Scales&, int) {
    return vdense<E>(reinterpret_cast<const Store<E>*>(b) + kLanes * V);
  }
  PAGED_FORCE_INLINE static float weight(const uint8_t* row, const QuantArgs&, int64_t, int64_t k) {
    return load<E>(reinterpret_cast<const Store<E>*>(row), k);
  }
};

template <Elem E>
void dense_stream(const QuantArgs& a, int64_t begin, int64_t end) {
  stream_rows<FmtDense<E>>(a, begin, end);
}

// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) * up, tanh(u) = 1 - 2 / (e^(2u) + 1) (exp_f32: saturates to
// +-1 for large |u|), the constants as torch's tanh-GELU has them.
void gelu_rows(const float* h, int64_t inter, float* out, int64_t begin, int64_t end) {
  const float beta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
  for (int64_t t = begin; t < end; ++t) {
    const float* g = h + t * 2 * inter;
    const float* u = g + inter;
    float* o = out + t * inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float x = g[i], inner = beta * (x + kappa * x * x * x);
      const float th = 1.0f - 2.0f / (exp_f32(2.0f * inner) + 1.0f);
      o[i] = 0.5f * x * (1.0f + th) * u[i];
    }
  }
}

const DenseKernels kKernels{
    "avx2", {&dense_stream<Elem::F32>, &dense_stream<Elem::BF16>, &dense_stream<Elem::F16>}, &gelu_rows};

}  // namespace avx2_moe
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const DenseKernels* avx2_dense_kernels() {
  static const bool usable =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return usable ? &avx2_moe::kKernels : nullptr;
}
}  // namespace paged_cpu
#else
namespace paged_cpu {
const DenseKernels* avx2_dense_kernels() { return nullptr; }
}  // namespace paged_cpu
#endif
