// Portable build of the packed-weight linear (quant_body.h): 8-lane vectors as plain arrays, which the
// compiler vectorises for the build target (any CPU, aarch64 included).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "fused_api.h"

#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")  // see fused_body.h
namespace paged_cpu {
namespace scalar_quant {

#include "fused_body.h"

#define PAGED_FORCE_INLINE __attribute__((always_inline))

constexpr int kLanes = 8;
constexpr int kVecRegs = 16;

struct VF {
  float v[8];
};
struct VI {
  int32_t v[8];
};

#define PAGED_LANES for (int j = 0; j < 8; ++j)
PAGED_FORCE_INLINE inline VF vzero() { VF r; PAGED_LANES r.v[j] = 0.0f; return r; }
PAGED_FORCE_INLINE inline VF vset1(float s) { VF r; PAGED_LANES r.v[j] = s; return r; }
PAGED_FORCE_INLINE inline VF vload(const float* p) { VF r; PAGED_LANES r.v[j] = p[j]; return r; }
PAGED_FORCE_INLINE inline void vstore(float* p, const VF& a) { PAGED_LANES p[j] = a.v[j]; }
// Not fused here (the baseline x86-64 target has no FMA): every use rounds the same either way (quant_body.h).
PAGED_FORCE_INLINE inline VF vfma(const VF& a, const VF& b, const VF& c) {
  VF r;
  PAGED_LANES r.v[j] = a.v[j] * b.v[j] + c.v[j];
  return r;
}
PAGED_FORCE_INLINE inline VF vmul(const VF& a, const VF& b) { VF r; PAGED_LANES r.v[j] = a.v[j] * b.v[j]; return r; }
PAGED_FORCE_INLINE inline VF vadd(const VF& a, const VF& b) { VF r; PAGED_LANES r.v[j] = a.v[j] + b.v[j]; return r; }
PAGED_FORCE_INLINE inline float vsum(const VF& a) {
  return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7]));
}
PAGED_FORCE_INLINE inline void vsum4(const VF& a, const VF& b, const VF& c, const VF& d, float* out) {
  out[0] = vsum(a);
  out[1] = vsum(b);
  out[2] = vsum(c);
  out[3] = vsum(d);
}
PAGED_FORCE_INLINE inline VI vu8(const uint8_t* p) { VI r; PAGED_LANES r.v[j] = p[j]; return r; }
PAGED_FORCE_INLINE inline VI vi8(const uint8_t* p) { VI r; PAGED_LANES r.v[j] = static_cast<int8_t>(p[j]); return r; }
PAGED_FORCE_INLINE inline VI vand(const VI& a, int m) { VI r; PAGED_LANES r.v[j] = a.v[j] & m; return r; }
PAGED_FORCE_INLINE inline VI vsrl(const VI& a, int n) {
  VI r;
  PAGED_LANES r.v[j] = static_cast<int32_t>(static_cast<uint32_t>(a.v[j]) >> n);
  return r;
}
PAGED_FORCE_INLINE inline VI vsll(const VI& a, int n) {
  VI r;
  PAGED_LANES r.v[j] = static_cast<int32_t>(static_cast<uint32_t>(a.v[j]) << n);
  return r;
}
PAGED_FORCE_INLINE inline VI vor(const VI& a, const VI& b) { VI r; PAGED_LANES r.v[j] = a.v[j] | b.v[j]; return r; }
PAGED_FORCE_INLINE inline VI vsubi(const VI& a, int s) { VI r; PAGED_LANES r.v[j] = a.v[j] - s; return r; }
PAGED_FORCE_INLINE inline VF vcvt(const VI& a) { VF r; PAGED_LANES r.v[j] = static_cast<float>(a.v[j]); return r; }
#undef PAGED_LANES
PAGED_FORCE_INLINE inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return from_f16(h);
}

PAGED_FORCE_INLINE inline VF vset1_f16(const uint8_t* p) { return vset1(f16_at(p)); }

// Bytes (quant_q8_body.h), as the AVX2 instructions define them.
struct VB {
  uint8_t v[32];
};
PAGED_FORCE_INLINE inline VB vbytes(const uint8_t* p) { VB r; std::memcpy(r.v, p, 32); return r; }
PAGED_FORCE_INLINE inline VB vnib(const uint8_t* p) {
  VB r;
  for (int j = 0; j < 16; ++j) {
    r.v[j] = p[j] & 15;
    r.v[j + 16] = p[j] >> 4;
  }
  return r;
}
PAGED_FORCE_INLINE inline int8_t s8(uint8_t b) { return static_cast<int8_t>(b); }
PAGED_FORCE_INLINE inline VI vdot(const VB& u, const VB& s) {
  VI r;
  for (int j = 0; j < 8; ++j) {
    int32_t sum = 0;
    for (int i = 4 * j; i < 4 * j + 4; ++i) sum += static_cast<int32_t>(u.v[i]) * s8(s.v[i]);
    r.v[j] = sum;
  }
  return r;
}

template <int N>
PAGED_FORCE_INLINE inline VF vf16_words(const uint8_t* p, int64_t ld) {
  VF r = vzero();
  for (int f = 0; f < N; ++f) {
    r.v[2 * f] = f16_at(p + f * ld);
    r.v[2 * f + 1] = f16_at(p + f * ld + 2);
  }
  return r;
}
template <int N>
PAGED_FORCE_INLINE inline VF vf16_halves(const uint8_t* p, int64_t ld) {
  VF r = vzero();
  for (int f = 0; f < N; ++f) r.v[f] = f16_at(p + f * ld);
  return r;
}
PAGED_FORCE_INLINE inline VF vround(const VF& v) {  // the default rounding mode: to nearest, ties to even
  VF r;
  for (int j = 0; j < 8; ++j) r.v[j] = std::nearbyint(v.v[j]);
  return r;
}
PAGED_FORCE_INLINE inline VF vpair(const float* p) {
  VF r;
  for (int j = 0; j < 8; ++j) r.v[j] = p[j & 1];
  return r;
}

#include "quant_body.h"
#include "quant_q8_body.h"

const Q8Kernels kQ8{"scalar", &round_q8_rows, &quant_stream_q8, nullptr};  // no interleaved kernel
const QuantKernels kKernels{"scalar", &quant_stream, &quant_dequant_dot, &kQ8};

}  // namespace scalar_quant
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const QuantKernels* scalar_quant_kernels() { return &scalar_quant::kKernels; }
}  // namespace paged_cpu
