// Portable kernels: plain loops the compiler may vectorise for the build target (any CPU, aarch64 included).
#include <cmath>
#include <cstdint>

#include "half_bits.h"
#include "kernel_api.h"

namespace paged_cpu {
namespace scalar {

constexpr bool kBf16Dot = false;

template <KvType K>
inline float load_kv(const void* base, int i) {
  if (K == KvType::F32) return static_cast<const float*>(base)[i];
  const uint16_t h = static_cast<const uint16_t*>(base)[i];
  return K == KvType::BF16 ? bf16_to_float(h) : f16_to_float(h);
}

template <KvType K, int D>
void stage_rows(const void* const* src, int n, float* dst) {
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < D; ++d) dst[j * D + d] = load_kv<K>(src[j], d);
}

template <int D>
void dot_rows(const float* q, int M, const float* const* keys, int n, float* s, int ld) {
  for (int r = 0; r < M; ++r) {
    const float* qr = q + r * D;
    for (int j = 0; j < n; ++j) {
      float a = 0.0f;
      for (int d = 0; d < D; ++d) a += qr[d] * keys[j][d];
      s[r * ld + j] = a;
    }
  }
}

template <int D>
void dot_rows_bf16(const uint16_t*, int, const void* const*, int, float*, int) {}

template <int D>
void axpy_rows(float* acc, int M, const float* p, int ld, const float* const* vals, int n) {
  for (int r = 0; r < M; ++r) {
    float* a = acc + r * D;
    for (int j = 0; j < n; ++j) {
      const float w = p[r * ld + j];
      for (int d = 0; d < D; ++d) a[d] += w * vals[j][d];
    }
  }
}

inline float scale_max(float* x, int n, float scale) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) {
    x[i] *= scale;
    m = x[i] > m ? x[i] : m;
  }
  return m;
}

inline float exp_sum(float* x, int n, float sub) {
  float total = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - sub);
    total += x[i];
  }
  return total;
}

inline void scale_vec(float* x, int n, float a) {
  for (int i = 0; i < n; ++i) x[i] *= a;
}

inline void to_bf16(const float*, int, uint16_t*) {}
template <int D>
void axpy_rows_bf16(float*, int, const float*, int, const void* const*, int) {}
template <int D>
void finish_acc(float*, int) {}

#include "attention_impl.h"

const IsaKernels kKernels{"scalar", &attend_item};

}  // namespace scalar

const IsaKernels* scalar_kernels() { return &scalar::kKernels; }

}  // namespace paged_cpu
