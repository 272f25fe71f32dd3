// AVX-512 kernels (F, BW, VL, DQ) for CPUs without AVX512-BF16; compiled only on x86-64.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernel_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC: #pragma GCC target
#include <immintrin.h>

// Everything below targets AVX-512; the headers above were included first, so their
// inline functions keep the baseline target and cannot leak AVX-512 code to other callers.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
namespace paged_cpu {
namespace avx512 {
#include "isa_avx512_body.h"
const IsaKernels kKernels{"avx512", &attend_item};
}  // namespace avx512
}  // namespace paged_cpu
#pragma GCC pop_options

namespace paged_cpu {
const IsaKernels* avx512_kernels() { return &avx512::kKernels; }
}  // namespace paged_cpu
#else
namespace paged_cpu {
const IsaKernels* avx512_kernels() { return nullptr; }
}  // namespace paged_cpu
#endif
