// Portable kernels: plain loops the compiler may vectorise for the build target (any CPU, aarch64 included).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "half_bits.h"
#include "kernel_api.h"

namespace paged_cpu {
namespace scalar {

constexpr bool kBf16Dot = false;

// One stored element as fp32; quantized ones unscaled, E4M3 at 2**-8 times its value (see load_q16 in
// isa_avx512_body.h: its bits moved into a float16's places without rebiasing the exponent).
template <KvType K>
inline float load_kv(const void* base, int i) {
  if constexpr (K == KvType::F32) return static_cast<const float*>(base)[i];
  if constexpr (is_quantized(K)) {
    const auto b = static_cast<const int8_t*>(base)[i];
    if constexpr (K == KvType::I8) return static_cast<float>(b);
    const auto wide = static_cast<uint16_t>(static_cast<int16_t>(b));  // the sign fills bits 15..8
    const auto bits = static_cast<uint16_t>(wide << (K == KvType::E5M2 ? 8 : 7));
    return f16_to_float(K == KvType::E5M2 ? bits : static_cast<uint16_t>(bits & 0xBF80u));
  }
  const uint16_t h = static_cast<const uint16_t*>(base)[i];
  return K == KvType::BF16 ? bf16_to_float(h) : f16_to_float(h);
}

// n float16 scales as fp32 times mul.
inline void widen_f16(const uint16_t* h, int n, float mul, float* dst) {
  for (int i = 0; i < n; ++i) dst[i] = f16_to_float(h[i]) * mul;
}

template <KvType K, int D>
void stage_rows(const void* const* src, int n, float* dst) {
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < D; ++d) dst[j * D + d] = load_kv<K>(src[j], d);
}

// A group of 16 keys in the pair layout, staged to fp32: pair i of the group at dst[32 * i], 32 floats.
template <KvType K, int D>
void stage_pairs(const void* const* groups, int ng, int64_t pair_stride, float* dst) {
  for (int g = 0; g < ng; ++g)
    for (int i = 0; i < D / 2; ++i, dst += 32)
      for (int x = 0; x < 32; ++x) dst[x] = load_kv<K>(groups[g], static_cast<int>(i * pair_stride + x));
}

// s[r][16 g + j] = q_r . key j of group g; key j's dimensions 2i, 2i+1 are at i * ps + 2j (+1).
template <int D, typename Tick>
void dot_pairs(const float* q, int M, const float* const* groups, int ng, int64_t ps, float* s, int ld, Tick& tick) {
  for (int r = 0; r < M; ++r) {
    const float* qr = q + r * D;
    for (int g = 0; g < ng; ++g) {
      float a[16] = {};
      for (int i = 0; i < D / 2; ++i) {
        const float* k = groups[g] + i * ps;
        for (int j = 0; j < 16; ++j) a[j] += qr[2 * i] * k[2 * j] + qr[2 * i + 1] * k[2 * j + 1];
      }
      for (int j = 0; j < 16; ++j) s[r * ld + 16 * g + j] = a[j];
      tick();
    }
  }
}

template <KvType K, int D, typename Tick>
void dot_pairs_bf16(const uint16_t*, int, const void* const*, int, int64_t, float*, int, Tick&, uint16_t*) {}

template <int D, typename Tick>
void axpy_rows(float* acc, int M, const float* p, int ld, const float* const* vals, int n, Tick& tick) {
  for (int r = 0; r < M; ++r) {
    float* a = acc + r * D;
    for (int j = 0; j < n; ++j) {
      const float w = p[r * ld + j];
      for (int d = 0; d < D; ++d) a[d] += w * vals[j][d];
      tick();
    }
  }
}

// x[lo, hi) *= scale (then cap * tanh(x / cap) when cap > 0); returns their max.
inline float scale_max(float* x, int lo, int hi, float scale, float cap) {
  float m = -INFINITY;
  for (int i = lo; i < hi; ++i) {
    x[i] *= scale;
    if (cap > 0.0f) x[i] = cap * std::tanh(x[i] / cap);
    m = x[i] > m ? x[i] : m;
  }
  return m;
}

inline float exp_sum(float* x, int lo, int hi, float sub) {
  float total = 0.0f;
  for (int i = lo; i < hi; ++i) {
    x[i] = std::exp(x[i] - sub);
    total += x[i];
  }
  return total;
}

inline void scale_vec(float* x, int n, float a) {
  for (int i = 0; i < n; ++i) x[i] *= a;
}

inline void to_bf16(const float*, int, uint16_t*) {}
template <KvType K, int D, typename Tick>
void axpy_rows_bf16(float*, int, const float*, int, const void* const*, int, Tick&, uint16_t*) {}
template <int D>
void finish_acc(float*, int) {}

#include "attention_impl.h"

const IsaKernels kKernels{"scalar", &attend_item};

}  // namespace scalar

const IsaKernels* scalar_kernels() { return &scalar::kKernels; }

}  // namespace paged_cpu
