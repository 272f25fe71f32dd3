// AVX2 + FMA + F16C build of the packed-weight linear (quant_body.h): 8-lane vectors as ymm registers,
// bytes widened with vpmovzxbd / vpmovsxbd, fp16 scales converted with F16C.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "fused_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC: #pragma GCC target
#include <immintrin.h>

// System headers first, then the target pragma over this file's own code (see isa_avx512.cpp).
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("no-trapping-math")  // see fused_body.h
namespace paged_cpu {
namespace avx2_quant {

#include "fused_body.h"

#define PAGED_FORCE_INLINE __attribute__((always_inline))

#include "quant_avx2_prims.h"

// vpmaddubsw (pairs into int16) + vpmaddwd. No int16 sum saturates: nibbles <= 15, |s| <= 127.
PAGED_FORCE_INLINE inline VI vdot(VB u, VB s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
PAGED_FORCE_INLINE inline VI vdot_acc(VI acc, VB u, VB s) { return _mm256_add_epi32(acc, vdot(u, s)); }

// quant_x8_body.h: rows per tile (16 ymm registers: 4 rows' accumulators beside the 8 nibble vectors), and
// the packed bytes of the groups a slice keeps in L1 while many rows pass over them.
constexpr int kX8Rows = 4;
constexpr int kVecRegs = 16;
constexpr int64_t kX8SliceBytes = 16 * 1024;

#include "quant_body.h"
#include "quant_q8_body.h"
#include "quant_x8_body.h"

const Q8Kernels kQ8{"avx2", &round_q8_rows, &quant_stream_q8, &quant_stream_x8};
const QuantKernels kKernels{"avx2", &quant_stream, &quant_dequant_dot, &kQ8};

}  // namespace avx2_quant

// The q8 path again with AVX-512 VNNI's vpdpbusd on ymm registers (AVX512-VL): one instruction for a
// block's 32 byte products instead of two. Chosen at run time where the CPU has it (fused_ops.cpp).
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
namespace vnni_quant {

#include "fused_body.h"
#include "quant_avx2_prims.h"

PAGED_FORCE_INLINE inline VI vdot(VB u, VB s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
PAGED_FORCE_INLINE inline VI vdot_acc(VI acc, VB u, VB s) { return _mm256_dpbusd_epi32(acc, u, s); }

// 32 ymm registers with AVX-512VL: 8 rows' integer and fp32 accumulators beside the 8 nibble vectors.
constexpr int kX8Rows = 8;
constexpr int kVecRegs = 32;
constexpr int64_t kX8SliceBytes = 16 * 1024;

#include "quant_body.h"
#include "quant_q8_body.h"
#include "quant_x8_body.h"

const Q8Kernels kQ8{"vnni", &round_q8_rows, &quant_stream_q8, &quant_stream_x8};
// The exact paths of this build: the AVX2 build's arithmetic (8 lanes, the same sums in the same order), with
// the 32 registers of AVX-512VL for wider dequantize tiles (quant_body.h: dot_width).
const QuantKernels kKernels{"avx2", &quant_stream, &quant_dequant_dot, &kQ8};

}  // namespace vnni_quant
#pragma GCC pop_options
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const QuantKernels* avx2_quant_kernels() { return &avx2_quant::kKernels; }
const Q8Kernels* vnni_q8_kernels() {
  static const bool usable = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vnni");
  return usable ? &vnni_quant::kQ8 : nullptr;
}
const QuantKernels* avx2_vl_quant_kernels() { return vnni_q8_kernels() != nullptr ? &vnni_quant::kKernels : nullptr; }
}  // namespace paged_cpu
#else
namespace paged_cpu {
const QuantKernels* avx2_quant_kernels() { return nullptr; }
const Q8Kernels* vnni_q8_kernels() { return nullptr; }
const QuantKernels* avx2_vl_quant_kernels() { return nullptr; }
}  // namespace paged_cpu
#endif
