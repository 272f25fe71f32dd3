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

#include "quant_body.h"

const QuantKernels kKernels{"scalar", &quant_stream, &quant_dequant_dot};

}  // namespace scalar_quant
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const QuantKernels* scalar_quant_kernels() { return &scalar_quant::kKernels; }
}  // namespace paged_cpu
