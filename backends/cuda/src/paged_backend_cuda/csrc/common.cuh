// Types and helpers shared by the kernels: element conversion, aligned vectors, warp sums.
#pragma once

#include <cstdint>

// PAGED_LAUNCH(grid, block, stream, kernel)(args...) is kernel<<<grid, block, 0, stream>>>(args...) under nvcc, and
// a launch on the CPU emulation (emulation/cuda_on_cpu.h) under a host compiler. The kernel comes last so that a
// template's commas stay inside __VA_ARGS__.
#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define PAGED_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<grid, block, 0, stream>>>
#else
#include "emulation/cuda_on_cpu.h"
#define PAGED_LAUNCH(grid, block, stream, ...) ::cuda_emu::launch(grid, block, stream, __VA_ARGS__)
#endif

namespace paged_cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// N elements moved as one (or, above 16 bytes, a few) vector loads: the callers guarantee alignment.
template <typename T, int N>
struct alignas(sizeof(T) * N > 16 ? 16 : sizeof(T) * N) Vec {
  T v[N];
};

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace paged_cuda
