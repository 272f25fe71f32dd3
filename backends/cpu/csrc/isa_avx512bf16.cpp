// AVX-512 kernels with AVX512-BF16 dot products (bf16 caches); compiled only on x86-64.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernel_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC: #pragma GCC target
#include <immintrin.h>

// See isa_avx512.cpp: system headers first, then the target pragma over this file's own code.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")
#define PAGED_CPU_BF16DOT 1
namespace paged_cpu {
namespace avx512bf16 {
#include "isa_avx512_body.h"
const IsaKernels kKernels{"avx512bf16", &attend_item};
}  // namespace avx512bf16
}  // namespace paged_cpu
#undef PAGED_CPU_BF16DOT
#pragma GCC pop_options

namespace paged_cpu {
const IsaKernels* avx512bf16_kernels() { return &avx512bf16::kKernels; }
}  // namespace paged_cpu
#else
namespace paged_cpu {
const IsaKernels* avx512bf16_kernels() { return nullptr; }
}  // namespace paged_cpu
#endif
